"""mxprof ctl: the control endpoint and the command, against real child processes.

Every child is started with its own socket directory (MXPROF_CONTROL_DIR)
and killed at the end; every wait is bounded.  Nothing here asserts on
wall time: where's one-second target is measured in benchmarks/ctl.py.
"""

import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

import mxprof
from mxprof import _ctlclient, _ctlwire

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_ctl_child.py")


@pytest.fixture
def ctl_dir(monkeypatch):
    # Short: a Unix socket's path has a limit of about 100 bytes.
    path = tempfile.mkdtemp(prefix="ctl", dir="/tmp")
    monkeypatch.setenv("MXPROF_CONTROL_DIR", path)
    yield path
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


def _env(**extra):
    # The children import the mxprof this process imports (installed, or the
    # tree PYTHONPATH names): never the checkout's sources, which have no
    # compiled core unless installed in place.
    env = dict(os.environ)
    env.update(extra)
    return env


@pytest.fixture
def spawn(ctl_dir, tmp_path):
    """spawn(block, state) -> a child that is ready to be asked."""
    children = []

    def start(block, state, **env):
        proc = subprocess.Popen(
            [sys.executable, CHILD, block, state, str(tmp_path / "own.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(tmp_path),
            env=_env(**env),
        )
        children.append(proc)
        line = _readline(proc, 60)
        assert line == "ready\n", line + proc.stderr.read() if proc.poll() is not None else line
        return proc

    yield start
    for proc in children:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()


def _readline(proc, timeout):
    """The child's next line of output, or '' after timeout seconds."""
    got = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0] if got else ""


def ctl(*words, timeout=120):
    """mxprof ctl WORDS in a process of its own: (status, stdout, stderr).
    Its answers get 20 s unless words say otherwise: a loaded machine is slow."""
    words = tuple(map(str, words))
    if "--timeout" not in words:
        words += ("--timeout", "20")
    proc = subprocess.run(
        [sys.executable, "-m", "mxprof", "ctl", *words],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
    )
    return proc.returncode, proc.stdout, proc.stderr


def ctl_json(*words):
    code, out, err = ctl(*words, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def _main(where):
    (main,) = [t for t in where["threads"] if t["main"]]
    return main


# ---- where ----


def test_where_reads_a_main_thread_blocked_in_time_sleep_with_its_open_range(spawn):
    proc = spawn("sleep", "run")
    where = ctl_json(proc.pid, "where", "--timeout", "10")
    main = _main(where)
    assert main["frames"][-1][0] == "main" and main["frames"][-1][1] == CHILD
    assert [f[0] for f in main["frames"]] == ["<module>", "main"]
    assert [(r["domain"], r["name"]) for r in main["ranges"]] == [("train", "step")]
    assert main["ranges"][0]["open_s"] > 0
    assert main["os_state"] == "S"
    names = sorted(t["name"] for t in where["threads"])
    assert names == ["MainThread", "worker"]  # mxprof's own threads are not shown
    assert where["recording"] is True


def test_where_reads_a_main_thread_blocked_on_a_lock(spawn):
    proc = spawn("lock", "idle")
    code, out, err = ctl(proc.pid, "where", "--timeout", "10")
    assert code == 0, err
    assert f"{CHILD}:" in out and "Thread 'MainThread'" in out and "Thread 'worker'" in out
    where = ctl_json(proc.pid, "where", "--timeout", "10")
    main = _main(where)
    assert main["frames"][-1][0] == "main"
    assert main["ranges"] == []  # not recording: no range is open in the core
    assert where["recording"] is False
    # The worker's stack is in its function, at its sleep.
    (worker,) = [t for t in where["threads"] if t["name"] == "worker"]
    assert worker["frames"][-1][0] == "main.<locals>.worker"


def test_a_process_holding_the_gil_is_reported_within_the_timeout(spawn):
    proc = spawn("gil", "idle")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the child is inside the C call
        code, out, err = ctl(proc.pid, "where", "--timeout", "0.5")
        if code != 0:
            break
    assert code == 2
    assert f"process {proc.pid} did not answer 'where' within 0.5 s" in err
    assert "GIL" in err and "(sleeping)" in err  # the OS's view of its threads


# ---- status ----


def test_status_shows_state_config_and_open_ranges(spawn):
    proc = spawn("sleep", "run")
    s = ctl_json(proc.pid, "status")
    assert s["pid"] == proc.pid and s["state"] == "run" and s["profile_open"] is True
    assert s["config"]["aggregate_stats"] is True
    assert s["trace"].endswith("own.json")
    assert [r["name"] for r in s["open_ranges"]["MainThread"]] == ["step"]
    assert s["tallies"]["dropped_events"] == 0
    assert s["ctl_recording"] is None
    code, out, _ = ctl(proc.pid)  # status is the default action
    assert code == 0 and "state: run" in out and "train:step" in out


# ---- start / stop / dump ----


def test_start_for_a_duration_records_and_returns_an_idle_process_to_idle(spawn, tmp_path):
    proc = spawn("lock", "idle")
    before = ctl_json(proc.pid, "status")
    out = tmp_path / "ondemand.json"
    result = ctl_json(proc.pid, "start", "--duration", "0.5", "-o", out)
    assert result["written"] is True and result["trace"] == str(out)
    trace = mxprof.load(str(out))
    work = [e for e in trace.events if e.name == "work" and e.ph == "X"]
    assert len(work) >= 5
    after = ctl_json(proc.pid, "status")
    assert after["state"] == "stop" and after["profile_open"] is False
    assert after["ctl_recording"] is None
    assert after["config"] == before["config"]  # the filename too


def test_start_dump_stop(spawn, tmp_path):
    proc = spawn("sleep", "idle")
    out = tmp_path / "manual.json"
    code, text, err = ctl(proc.pid, "start", "-o", out, "--sample", "100")
    assert code == 0, err
    assert f"recording into {out}" in text
    assert ctl_json(proc.pid, "status")["config"]["sample_rate"] == 100
    time.sleep(0.3)
    dumped = ctl_json(proc.pid, "dump")
    assert dumped["trace"] == str(out)
    first = len([e for e in mxprof.load(str(out)).events if e.name == "work"])
    assert first >= 1
    time.sleep(0.3)
    assert ctl_json(proc.pid, "stop")["trace"] == str(out)
    events = mxprof.load(str(out)).events
    assert len([e for e in events if e.name == "work"]) > first
    assert len(mxprof.load(str(out)).samples.samples) > 0  # --sample 100
    status = ctl_json(proc.pid, "status")
    assert status["state"] == "stop" and status["config"]["sample_rate"] == 0
    code, _, err = ctl(proc.pid, "stop")
    assert code == 2 and "nothing to stop" in err


def test_start_refuses_while_the_program_records_itself(spawn, tmp_path):
    proc = spawn("sleep", "run")
    code, _, err = ctl(proc.pid, "start", "-o", tmp_path / "x.json")
    assert code == 2 and "recording already" in err
    # dump writes the program's own trace and it goes on recording.
    assert ctl_json(proc.pid, "dump")["trace"] == str(tmp_path / "own.json")
    assert any(e.name == "work" for e in mxprof.load(str(tmp_path / "own.json")).events)
    assert ctl_json(proc.pid, "status")["state"] == "run"


# ---- top, snapshot ----


def test_top_shows_the_ranges_of_each_interval_and_leaves_the_process_idle(spawn, tmp_path):
    proc = spawn("lock", "idle")
    code, out, err = ctl(
        proc.pid, "top", "--iterations", "2", "--interval", "0.3", "--format", "json"
    )
    assert code == 0, err
    frames = [json.loads(line) for line in out.splitlines()]
    assert len(frames) == 2
    for frame in frames:
        (work,) = [r for r in frame["rows"] if r["name"] == "work"]
        assert work["domain"] == "train" and 1 <= work["count"] <= 100
        assert work["p99_ns"] >= 9e6  # 10 ms sleeps
        assert frame["since"] == "last"
    status = ctl_json(proc.pid, "status")
    assert status["state"] == "stop" and status["ctl_recording"] is None
    assert status["config"]["write_trace"] is True
    assert status["config"]["aggregate_stats"] is True  # the program's, as it was
    assert not (tmp_path / "own.json").exists()  # statistics only: no trace file


def test_top_on_a_recording_program_takes_differences(spawn):
    proc = spawn("sleep", "run")
    code, out, err = ctl(proc.pid, "top", "--iterations", "1", "--interval", "0.3")
    assert code == 0, err
    assert "P99 since the statistics began" in out
    line = [x for x in out.splitlines() if x.startswith("train:work")][0]
    assert 1 <= int(line.split()[1]) <= 100  # this interval's count, not the total
    assert ctl_json(proc.pid, "status")["state"] == "run"


def test_snapshot_of_a_flight_recorder(spawn, tmp_path):
    proc = spawn("sleep", "flight")
    time.sleep(0.3)
    snap = ctl_json(proc.pid, "snapshot")
    assert os.path.basename(snap["trace"]).startswith("own.flight1-ctl")
    events = mxprof.load(snap["trace"]).events
    assert len([e for e in events if e.name == "work"]) >= 5
    assert ctl_json(proc.pid, "status")["state"] == "run"


def test_snapshot_without_a_flight_recorder(spawn):
    proc = spawn("sleep", "run")
    code, _, err = ctl(proc.pid, "snapshot")
    assert code == 2 and "no snapshot: no flight recorder is recording here" in err


# ---- list, errors ----


def test_list_shows_the_processes_and_removes_stale_sockets(spawn, ctl_dir):
    proc = spawn("sleep", "run")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    stale = os.path.join(ctl_dir, f"{int(gone.stdout)}.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    s.close()
    listed = ctl_json("list")
    assert [p["pid"] for p in listed] == [proc.pid]
    assert listed[0]["status"]["state"] == "run"
    assert not os.path.exists(stale)
    code, out, _ = ctl("list")
    assert code == 0 and str(proc.pid) in out and "_ctl_child.py sleep run" in out


def test_errors_exit_2_with_a_clear_message(spawn, ctl_dir):
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code, _, err = ctl(plain.pid, "where")
        assert code == 2 and f"process {plain.pid} is not an mxprof process" in err
    finally:
        plain.kill()
        plain.wait(timeout=30)
    code, _, err = ctl(plain.pid, "status")
    assert code == 2 and f"no process {plain.pid}: it is gone" in err
    code, _, err = ctl("abc", "status")
    assert code == 2 and "'list' or a process id" in err
    proc = spawn("sleep", "idle")
    code, _, err = ctl(proc.pid, "where", "--duration", "1")
    assert code == 2 and "--duration does not apply" in err
    code, _, err = ctl(proc.pid, "start", "-o", "/nonexistent-mxprof/x.json")
    assert code == 2 and "'/nonexistent-mxprof' is not a writable folder" in err
    assert ctl_json(proc.pid, "status")["state"] == "stop"  # nothing began
    code, _, err = ctl(proc.pid, "attach")
    if sys.version_info < (3, 14):
        assert code == 2 and "unavailable: it needs CPython 3.14+" in err


# ---- the endpoint's life ----


def test_control_0_and_the_config_key_keep_the_endpoint_closed(spawn, ctl_dir):
    proc = spawn("sleep", "idle", MXPROF_CONTROL="0")
    assert os.listdir(ctl_dir) == []
    code, _, err = ctl(proc.pid, "status")
    assert code == 2 and "not an mxprof process" in err
    script = textwrap.dedent(
        """
        import os, sys, mxprof
        path = os.path.join(os.environ["MXPROF_CONTROL_DIR"], f"{os.getpid()}.sock")
        mxprof.set_config(aggregate_stats=True)
        opened = os.path.exists(path)
        mxprof.set_config(control=False)
        closed = not os.path.exists(path)
        mxprof.set_config(control=True)
        print(opened, closed, os.path.exists(path), oct(os.stat(path).st_mode & 0o777))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert out.stdout.split() == ["True", "True", "True", "0o600"], out.stderr
    assert os.listdir(ctl_dir) == []  # removed at exit


def test_a_forked_child_gets_its_own_endpoint(ctl_dir):
    script = textwrap.dedent(
        """
        import os, sys, time, mxprof
        mxprof.set_config(aggregate_stats=True)
        pid = os.fork()
        if pid == 0:
            print(os.getpid(), flush=True)
            time.sleep(60)
            os._exit(0)
        print(os.getpid(), flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=_env()
    )
    pids = []
    try:
        pids = sorted(int(_readline(proc, 60)) for _ in range(2))
        assert proc.pid in pids
        for pid in pids:
            deadline = time.monotonic() + 30
            while (
                not os.path.exists(_ctlwire.socket_path(pid, ctl_dir))
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            assert _ctlclient.request(pid, "status", timeout=10)["pid"] == pid
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    # SIGKILL is delivered asynchronously and the forked child is nobody's to
    # wait for: on a loaded machine it may still be dying (and listed) for a moment.
    deadline = time.monotonic() + 30
    while _ctlclient.list_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.get("pid") for p in _ctlclient.list_processes()) == []  # both stale now
    assert os.listdir(ctl_dir) == []


def test_the_directory_must_be_the_users_own(monkeypatch, tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    monkeypatch.setenv("MXPROF_CONTROL_DIR", str(open_dir))
    with pytest.raises(OSError, match="open to other users"):
        _ctlwire.control_dir(create=True)


# ---- the endpoint in this process: peers, bad requests ----


@pytest.fixture
def endpoint(ctl_dir, monkeypatch):
    from mxprof import _ctlserver

    monkeypatch.setattr(_ctlserver, "REQUEST_TIMEOUT", 0.3)
    _ctlserver.close()
    path = _ctlserver.start()
    assert path == _ctlwire.socket_path(os.getpid(), ctl_dir)
    yield _ctlserver
    _ctlserver.close()


def test_another_uid_is_refused_and_served_nothing(endpoint, monkeypatch):
    monkeypatch.setattr(endpoint, "peer_uid", lambda conn: os.getuid() + 1)
    with pytest.raises(_ctlclient.CtlError, match=f"refused: uid {os.getuid() + 1}"):
        _ctlclient.request(os.getpid(), "status", timeout=10)
    monkeypatch.undo()


def _raw(payload, read=True):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(_ctlwire.socket_path(os.getpid()))
    try:
        if payload:
            s.sendall(payload)
        if not read:
            return None
        return _ctlwire.read_message(s, _ctlwire.MAX_REPLY, 10)
    finally:
        s.close()


def _frame(obj_bytes):
    return struct.pack(">I", len(obj_bytes)) + obj_bytes


def test_bad_requests_get_an_error_and_disturb_nothing(endpoint, tmp_path):
    from mxprof import _testing

    trace = tmp_path / "fuzz.json"
    mxprof.set_config(aggregate_stats=True)
    _testing.start(trace)
    task = mxprof.Domain("fuzz").new_task("t")
    fixed = [
        b"",  # nothing at all
        b"\x00\x00",  # half a header
        struct.pack(">I", 1 << 30),  # oversized
        struct.pack(">I", 100) + b"{}",  # half sent
        _frame(b"\xff\xfe"),
        _frame(b"[1, 2]"),
        _frame(b"{"),
        _frame(b'{"cmd": 5}'),
        _frame(b'{"cmd": "nope"}'),
        _frame(b'{"cmd": "status", "args": []}'),
        _frame(b'{"cmd": "start", "args": {"duration": "x"}}'),
        _frame(b'{"cmd": "start", "args": {"duration": true}}'),
        _frame(b'{"cmd": "start", "args": {"filename": 5}}'),
        _frame(b'{"cmd": "start", "args": {"sample_rate": -1}}'),
        _frame(b'{"cmd": "top", "args": {"end": 3}}'),
    ]
    rng = random.Random(24)
    fuzzed = []
    for _ in range(150):
        base = rng.choice(fixed[4:])
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        fuzzed.append(bytes(data))
    errors = 0
    for payload in fixed + fuzzed:
        with task:
            pass
        reply = _raw(payload)
        assert reply is not None and set(reply) <= {"ok", "error", "result"}
        errors += not reply["ok"]
        # Whatever came, the endpoint still answers and the state is the test's.
        assert _ctlclient.request(os.getpid(), "status", timeout=10)["state"] == "run"
    assert errors >= len(fixed)
    # Every request is refused except those that mutated into a valid one.
    _ctlclient.request(os.getpid(), "top", {"end": True}, timeout=10)
    stats = json.loads(mxprof.dumps(format="json"))
    assert stats["Time"]["fuzz"]["t"]["Count"] == len(fixed) + len(fuzzed)
    _testing.finish(trace)
    assert len([e for e in mxprof.load(str(trace)).events if e.name == "t"]) == len(fixed) + len(
        fuzzed
    )


def test_a_peer_that_sends_half_a_request_is_dropped(endpoint):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(_ctlwire.socket_path(os.getpid()))
    s.sendall(struct.pack(">I", 50) + b'{"cmd"')
    reply = _ctlwire.read_message(s, _ctlwire.MAX_REPLY, 10)  # after REQUEST_TIMEOUT
    s.close()
    assert reply["ok"] is False and "did not arrive in time" in reply["error"]
    assert _ctlclient.request(os.getpid(), "where", timeout=10)["pid"] == os.getpid()


# ---- a whole job ----


def test_job_fans_out_to_every_rank_of_a_4_rank_loopback_job(ctl_dir, tmp_path):
    pytest.importorskip("zmq", reason="the job's channel needs pyzmq (mxprof[dist])")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    procs = []

    def rank(r):
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(HERE, "_ctl_job.py"), str(r), "4", address],
                stdout=subprocess.PIPE,
                text=True,
                cwd=str(tmp_path),
                env=_env(),
            )
        )

    try:
        # The hub first: a peer's handshake that reaches the hub while its
        # Endpoint is being built is answered with an AttributeError
        # (Hub.endpoint is assigned after the transport starts delivering).
        rank(0)
        assert _readline(procs[0], 120) == "ready\n"
        for r in range(1, 4):
            rank(r)
        for proc in procs[1:]:
            assert _readline(proc, 120) == "ready\n"
        hub = procs[0].pid
        # where: every rank's stacks, each from its own process.
        where = ctl_json(hub, "where", "--job")
        ranks = where["ranks"]
        assert len(ranks) == 4 and all(r["ok"] for r in ranks.values()), ranks
        assert sorted(r["result"]["pid"] for r in ranks.values()) == sorted(p.pid for p in procs)
        for r in ranks.values():
            main = _main(r["result"])
            assert main["frames"][-1][0] == "main"
        # start / where / stop: every rank records; one merged trace.
        merged = tmp_path / "merged.json"
        started = ctl_json(hub, "start", "--job", "-o", merged)
        assert started["trace"] == str(merged) and all(r["ok"] for r in started["ranks"].values())
        time.sleep(0.6)
        where = ctl_json(hub, "where", "--job")
        for r in where["ranks"].values():  # train:step is open on every main thread now
            assert [x["name"] for x in _main(r["result"])["ranges"]] in (["step"], [])
        assert any(_main(r["result"])["ranges"] for r in where["ranks"].values())
        stopped = ctl_json(hub, "stop", "--job")
        assert stopped["trace"] == str(merged) and not stopped["missing"]
        trace = mxprof.load(str(merged))
        pids = {e.pid for e in trace.events if e.name == "work"}
        assert len(pids) == 4
        for r in ctl_json(hub, "status", "--job")["ranks"].values():
            assert r["result"]["state"] == "stop" and r["result"]["ctl_recording"] is None
        # Not the hub: a clear refusal.
        code, _, err = ctl(procs[1].pid, "where", "--job")
        assert code == 2 and "--job needs the rank-0 worker" in err
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)
            proc.stdout.close()


@pytest.mark.skipif(os.getuid() != 0, reason="a second user needs root to switch to it")
def test_a_real_second_user_is_refused_by_its_peer_credentials(endpoint, ctl_dir):
    # The directory (0700) and the socket (0600) already keep other users
    # out; opened up here, the peer check is what refuses them.
    path = _ctlwire.socket_path(os.getpid(), ctl_dir)
    os.chmod(ctl_dir, 0o711)
    os.chmod(path, 0o666)
    code = textwrap.dedent(
        """
        import json, os, socket, struct, sys
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(20)
        s.connect(sys.argv[1])
        data = json.dumps({"cmd": "status", "args": {}}).encode()
        try:
            s.sendall(struct.pack(">I", len(data)) + data)
        except BrokenPipeError:
            pass  # refused before the request was read
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
        print(os.getuid(), reply[4:].decode())
        """
    )
    try:
        # The system's interpreter (stdlib only): the test's may be out of its reach.
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        out = subprocess.run(
            [python, "-I", "-c", code, path],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            user=65534,
        )
    finally:
        os.chmod(ctl_dir, 0o700)
    assert out.returncode == 0, out.stderr
    uid, reply = out.stdout.split(" ", 1)
    assert uid == "65534", out.stderr
    assert json.loads(reply) == {
        "ok": False,
        "error": "refused: uid 65534 is not this process's user",
    }
