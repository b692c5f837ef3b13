"""Strangers and misbehaving members against a job started as the README shows.

The job is the README's form: loopback, no token.  A *stranger* is a plain
ZeroMQ client on this host that speaks the wire format by hand, told the
job's address or finding it in /proc/net/tcp, without the job's secret; an
*insider* has read the secret (a process of the same user could) and
misbehaves.  Every wait is bounded; no assertion is on wall time.
"""

import hashlib
import hmac
import itertools
import json
import os
import queue
import signal
import socket
import stat
import sys
import threading
import time
import warnings

import pytest

import mxprof
from mxprof import _testing

zmq = pytest.importorskip("zmq", reason="the ZeroMQ transport needs pyzmq (mxprof[dist])")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # spawned children import it
import _dist_job  # noqa: E402
from _dist_job import ticks, wait_for, within  # noqa: E402

from mxprof import distributed  # noqa: E402
from mxprof.distributed import _collect, _secret, _wire  # noqa: E402
from mxprof.trace import clock as _clock  # noqa: E402

SLACK = 20.0  # seconds on top of a collect's own bound: tells a hang from a slow machine


@pytest.fixture
def job(tmp_path):
    yield from _dist_job.job(tmp_path)


def hub():
    return distributed._node_ref["node"]


def old_form(header, body=b"", key=b""):
    """A message as the wire's first version had it: four frames, signed
    with the token, empty when none was given (what every probe could sign)."""
    text = json.dumps(header).encode()
    mac = hmac.new(key, len(text).to_bytes(8, "big"), hashlib.sha256)
    mac.update(text)
    mac.update(body)
    return [b"MXP1", mac.digest(), text, body]


class Client:
    """A plain ZeroMQ DEALER speaking the wire format by hand."""

    def __init__(self, address):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.ids = itertools.count(1)
        self.secret = b""
        self.channel = None

    def request(self, kind, args=None, body=b""):
        header = {"type": kind, "id": next(self.ids), "args": args or {}}
        if self.channel is not None:
            self.sock.send_multipart(self.channel.seal(header, body))
        else:
            self.sock.send_multipart(_wire.encode(self.secret, b"", header, body))
        return header["id"]

    def receive(self, timeout):
        """The next message as (header, body), or None after timeout seconds."""
        if not self.sock.poll(int(timeout * 1000)):
            return None
        frames = self.sock.recv_multipart()
        if _wire.channel_of(frames):
            return self.channel.unseal(frames)
        return _wire.decode(self.secret, frames)

    def call(self, kind, args=None, body=b"", timeout=10.0):
        rid = self.request(kind, args, body)
        end = time.monotonic() + timeout
        while (got := self.receive(max(0.0, end - time.monotonic()))) is not None:
            if got[0].get("re") == rid:
                return got
        raise AssertionError(f"no answer to {kind} within {timeout} s")

    def join(self, secret, role, rank, pid, host=None, file="/nonexistent/t.json"):
        """open a channel with secret, then hello as role rank; the answer."""
        self.secret, nonce = secret, os.urandom(_wire.NONCE)
        answer, _ = self.call("open", {"nonce": nonce.hex()})
        sid = bytes.fromhex(answer["args"]["channel"])
        self.channel = _wire.Channel(sid, _wire.channel_key(secret, sid, nonce))
        me = {"role": role, "rank": rank, "host": host or socket.gethostname(), "pid": pid}
        return self.call("hello", {**me, "version": mxprof.__version__, "file": file})[0]

    def close(self):
        self.sock.close(0)


def found_ports():
    """The TCP ports this process listens on, as any process of the host
    can read them: /proc/net/tcp{,6} (state 0A), matched to our sockets."""
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            ours.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):  # no IPv6 here
            continue
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in ours:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def ticked(path, n):
    """Whether path holds more than n ticks (False while it is not written yet)."""
    try:
        return len(ticks(path)) > n
    except Exception:
        return False


def secret_file(address):
    folder = _secret.directories()[0]
    return folder, os.path.join(folder, _secret.file_name(address))


# ---- the job's secret ----


def test_a_job_without_a_token_has_a_secret_only_its_user_can_read(job):
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=5)
    folder, path = secret_file(job.address)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert os.stat(folder).st_uid == os.getuid()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        secret = bytes.fromhex(f.read().strip())
    assert len(secret) == 32 and secret == hub().endpoint.key
    assert _secret.read(job.address) == secret
    assert _secret.read(job.address.replace("127.0.0.1", "localhost")) == secret  # one port
    distributed.shutdown()
    assert not os.path.exists(path)  # taken back when the job ends


def test_an_ipc_endpoint_and_its_secret_are_this_users_only(job, tmp_path):
    job.address = f"ipc://{tmp_path}/job.sock"
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    assert stat.S_IMODE(os.stat(tmp_path / "job.sock").st_mode) == 0o600  # was 0755
    folder, path = secret_file(job.address)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    server = job.start("server", 0, 1, 1)  # zero-config over ipc still joins
    assert wait_for(lambda: [m.pid for m in distributed.members()] == [server.pid], 60)


def test_a_peer_started_first_waits_for_the_secret_and_skips_a_stale_one(job, tmp_path):
    # A crashed rank-0 worker's secret is still there for this address.
    stale = _secret.publish(job.address, _secret.generate())
    server = job.start("server", 0, 1, 1, timeout=60.0)
    time.sleep(1.5)  # it reads the stale secret, and its open goes unanswered
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    assert _secret.read(job.address) == hub().endpoint.key  # replaced
    assert wait_for(lambda: [m.pid for m in distributed.members()] == [server.pid], 60)
    assert not (tmp_path / "server0.error").exists()
    distributed.shutdown()
    assert not os.path.exists(stale)


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to act as another user"
)
def test_another_user_cannot_read_the_secret(job):
    import subprocess

    distributed.init("worker", 0, 1, 1, address=job.address, timeout=5)
    _, path = secret_file(job.address)
    probe = (
        f"import sys\ntry:\n    open({path!r}).read()\nexcept PermissionError:\n    sys.exit(3)\n"
    )
    python = "/usr/bin/python3"  # one that user may run (a venv under /root is not)
    if not os.access(python, os.X_OK):
        pytest.skip(f"no {python} to run as another user")
    done = subprocess.run(
        [python, "-c", probe],
        user=65534,  # nobody
        capture_output=True,
        timeout=60,
        cwd="/",
        env={"PATH": os.environ.get("PATH", "")},
    )
    if done.returncode not in (0, 3):  # this interpreter does not start as nobody here
        pytest.skip(f"cannot run Python as another user: {done.stderr[-200:]!r}")
    assert done.returncode == 3


# ---- strangers ----


def stranger_tries_everything(address, identity):
    """Every way in a stranger knows without the secret; what it got back."""
    c = Client(address)
    try:
        hello = {"type": "hello", "id": 1, "args": {**identity, "version": mxprof.__version__}}
        c.sock.send_multipart(old_form(hello))  # the first wire's form, empty token
        c.sock.send_multipart(_wire.encode(b"", b"", hello))  # no channel, empty key
        c.sock.send_multipart(_wire.encode(b"", b"", {"type": "open", "id": 2, "args": {}}))
        guess = os.urandom(32)
        opening = {"type": "open", "id": 3, "args": {"nonce": os.urandom(16).hex()}}
        c.sock.send_multipart(_wire.encode(guess, b"", opening))  # a guessed secret
        forged = _wire.Channel(os.urandom(_wire.CHANNEL_ID), guess)  # a made-up channel
        c.sock.send_multipart(forged.seal({**hello, "id": 4}))
        time.sleep(0.5)
        answers = []
        while c.sock.poll(200):
            answers.append(c.sock.recv_multipart())
        return answers
    finally:
        c.close()


def test_a_stranger_cannot_take_a_free_slot(job, tmp_path):
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    port = int(job.address.rsplit(":", 1)[1])
    assert port in found_ports()  # no need to be told the address
    identity = {"role": "server", "rank": 0, "host": socket.gethostname(), "pid": os.getpid()}
    for p in found_ports():
        assert stranger_tries_everything(f"tcp://127.0.0.1:{p}", identity) == []

    def dropped():
        t = distributed.tally()
        return t["bad_mac"] + t["malformed"] + t["unknown_peer"]

    assert wait_for(lambda: dropped() >= 5, 30), distributed.tally()  # all five were seen
    assert distributed.members() == []
    # The real server is not refused ("server 0 is taken" before).
    server = job.start("server", 0, 1, 1)
    assert wait_for(lambda: [m.pid for m in distributed.members()] == [server.pid], 60)
    assert not (tmp_path / "server0.error").exists()


def test_nobody_takes_over_a_joined_slot_by_copying_its_identity(job, tmp_path):
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    server = job.start("server", 0, 1, 1)
    assert wait_for(lambda: len(distributed.members()) == 1, 60)
    # Everything /proc tells about it.
    identity = {"role": "server", "rank": 0, "host": socket.gethostname(), "pid": server.pid}
    assert stranger_tries_everything(job.address, identity) == []
    # Even with the secret, a second connection claiming the slot is refused.
    insider = Client(job.address)
    try:
        answer = insider.join(_secret.read(job.address), "server", 0, server.pid)
        assert answer["type"] == "error" and "server 0 is taken" in answer["args"]["message"]
        # The hub's commands go to the real server, and its trace is the one collected.
        mxprof.set_config(filename="t.json", profile_process="server")
        mxprof.set_state("run", profile_process="server")
        assert wait_for(lambda: ticked(tmp_path / "rank0_t.json", 3), 30)
        mxprof.set_state("stop", profile_process="server")
        summary = within(60, distributed.collect, tmp_path / "merged.json")
        assert insider.receive(0.2) is None  # it was sent nothing
    finally:
        insider.close()
    assert [m.pid for m in distributed.members()] == [server.pid]
    assert [g for g in summary["missing"] if g["failed"]] == []
    merged = _testing.load_trace(tmp_path / "merged.json")
    names = [e["args"]["name"] for e in _testing.events(merged, "M", "process_name")]
    assert set(names) == {f"server 0 ({socket.gethostname()}, pid {server.pid})"}


class Tap:
    """A relay between peers and the hub that keeps what the peers send, and
    can send it again on the peer's own connection (one thread owns every
    socket; others hand it work through a queue)."""

    def __init__(self, upstream):
        self.ctx = zmq.Context()
        self.front = self.ctx.socket(zmq.ROUTER)
        self.front.setsockopt(zmq.LINGER, 0)
        self.front.bind("tcp://127.0.0.1:0")
        self.address = self.front.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.upstream = upstream
        self.backs = {}
        self.captured = []
        self.resend = queue.Queue()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        owner = {}
        while not self.stop.is_set():
            while not self.resend.empty():
                cid, frames = self.resend.get()
                self.backs[cid].send_multipart(frames)
            for sock, _ in poller.poll(50):
                frames = sock.recv_multipart()
                if sock is self.front:
                    cid, *frames = frames
                    if cid not in self.backs:
                        back = self.backs[cid] = self.ctx.socket(zmq.DEALER)
                        back.setsockopt(zmq.LINGER, 0)
                        back.connect(self.upstream)
                        poller.register(back, zmq.POLLIN)
                        owner[back] = cid
                    self.captured.append((cid, frames))
                    self.backs[cid].send_multipart(frames)
                else:
                    self.front.send_multipart([owner[sock], *frames])

    def close(self):
        self.stop.set()
        self.thread.join(5)
        for s in [self.front, *self.backs.values()]:
            s.close(0)
        self.ctx.term()


@pytest.mark.parametrize("token", [None, "t0ken"])
def test_a_captured_stream_replayed_is_refused(job, tmp_path, token):
    distributed.init("worker", 0, 1, 1, address=job.address, token=token, timeout=20)
    tap = Tap(job.address)
    # The server reads the job's secret by the address it is given: the tap's.
    hub_key = hub().endpoint.key
    tapped = _secret.publish(tap.address, hub_key) if token is None else None
    try:
        real_address = job.address
        job.address = tap.address  # the server talks to the hub through the tap
        server = job.start("server", 0, 1, 1, token=token)
        assert wait_for(lambda: len(distributed.members()) == 1, 60)
        assert wait_for(lambda: len(tap.captured) >= 2 + 16, 30)  # open, hello, 16 pings
        captured = list(tap.captured)
        (cid,) = {c for c, _ in captured}
        # Sent again from a new connection: only its open gets an answer (a
        # new channel whose key the replayer cannot derive); the rest is
        # dropped, so the slot stays with the server.
        before = distributed.tally()
        replayer = Client(real_address)
        try:
            for _, frames in captured:
                replayer.sock.send_multipart(frames)
            assert wait_for(
                lambda: (
                    distributed.tally()["unknown_peer"] - before["unknown_peer"]
                    >= len(captured) - 1
                ),
                30,
            ), distributed.tally()
            got = []
            while replayer.sock.poll(10_000 if not got else 300):
                got.append(replayer.sock.recv_multipart())
            assert [_wire.channel_of(f) for f in got] == [b""]  # the open's answer alone
            # Sent again on the server's own connection: seen before, refused.
            for _, frames in captured[1:]:
                tap.resend.put((cid, frames))
            assert wait_for(
                lambda: distributed.tally()["replayed"] - before["replayed"] >= len(captured) - 1,
                30,
            ), distributed.tally()
            # The slot is still the server's: the commands reach it.
            mxprof.set_config(filename="t.json", profile_process="server")
            mxprof.set_state("run", profile_process="server")
            assert wait_for(lambda: ticked(tmp_path / "rank0_t.json", 3), 30)
            mxprof.set_state("stop", profile_process="server")
            assert replayer.sock.poll(200) == 0
        finally:
            replayer.close()
        assert [m.pid for m in distributed.members()] == [server.pid]
    finally:
        job.address = real_address
        (tmp_path / "done").touch()
        distributed.shutdown()
        tap.close()
        if tapped is not None:
            _secret.withdraw(tapped, hub_key)


# ---- an insider: bounded deposits and uploads, names that stay in their folder ----


def deposit(c, offset, size, name, body, eof):
    args = {"offset": offset, "size": size, "name": name, "eof": eof}
    header, _ = c.call("deposit", args, body)
    return header["type"], header["args"].get("message", "")


def files_under(folder):
    if folder is None:
        return []
    return sorted(
        os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs
    )


def test_deposits_are_bounded_and_stay_in_the_hubs_folder(job, tmp_path, monkeypatch):
    monkeypatch.setenv("MXPROF_MAX_TRACE_BYTES", "1000")
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    c = Client(job.address)
    try:
        assert c.join(_secret.read(job.address), "server", 0, os.getpid())["type"] == "ok"
        for size in (2**62, 1001, -1):  # declared, and refused before a byte is written
            kind, message = deposit(c, 0, size, "t.json", b"x" * 10, False)
            assert kind == "error" and "1000 bytes at most" in message
        assert files_under(hub()._deposit_dir) == []
        for name in ("..", ".", "a/b", "", "../../escaped.json", "x\\y", "n\0ul"):
            kind, message = deposit(c, 0, 10, name, b"x" * 10, True)
            assert kind == "error" and "plain file name" in message, name
        assert deposit(c, 0, 10, "t.json", b"x" * 20, True)[0] == "error"  # past its size
        assert deposit(c, 0, 10, "t.json", b"x" * 5, True)[0] == "error"  # ends short
        assert deposit(c, 0, 10, "t.json", b"x" * 10, True) == ("ok", "")
        assert files_under(hub()._deposit_dir) == [os.path.join("server0", "t.json")]
        # A second deposit replaces the first: one a process on disk.
        assert deposit(c, 0, 10, "u.json", b"y" * 6, False) == ("ok", "")
        assert deposit(c, 6, 10, "u.json", b"y" * 4, True) == ("ok", "")
        assert files_under(hub()._deposit_dir) == [os.path.join("server0", "u.json")]
        with open(os.path.join(hub()._deposit_dir, "server0", "u.json"), "rb") as f:
            assert f.read() == b"y" * 10
    finally:
        c.close()
    assert not (tmp_path.parent / "escaped.json").exists()


@pytest.mark.parametrize("name", ["..", ".", "a/b"])
def test_an_upload_with_a_bad_name_is_refused_and_collect_writes_the_rest(job, tmp_path, name):
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=5)
    mxprof.set_config(filename=str(tmp_path / "hub.json"))
    mxprof.set_state("run")
    tick = mxprof.Domain("worker").new_task("tick")
    for _ in range(5):
        with tick:
            pass
    mxprof.set_state("stop")
    c = Client(job.address)
    stop = threading.Event()
    server = None

    def serve():  # answers sync and upload, the upload under a bad name
        while not stop.is_set():
            got = c.receive(0.05)
            if got is None:
                continue
            header, _ = got
            if header["type"] == "sync":
                args = {"clock": _clock.IDENTITY.to_json(), "file": "/nonexistent/t.json"}
            elif header["type"] == "upload":
                args = {"size": 2, "name": name, "info": {}}
            else:
                continue
            c.sock.send_multipart(
                c.channel.seal({"type": "ok", "re": header["id"], "args": args}, b"{}")
            )

    try:
        assert c.join(_secret.read(job.address), "server", 0, os.getpid())["type"] == "ok"
        server = threading.Thread(target=serve, daemon=True)
        server.start()
        out = tmp_path / "merged.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            summary = within(5 + SLACK, distributed.collect, out)
    finally:
        stop.set()
        if server is not None:
            server.join(5)
        c.close()
    (gap,) = summary["missing"]
    assert gap["role"] == "server" and "plain file name" in gap["why"], gap
    merged = _testing.load_trace(out)
    assert len(_testing.events(merged, "X", "tick")) == 5
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ---- a dead process's last file ----


@pytest.mark.parametrize("moved", [False, True])
def test_a_killed_server_that_named_its_file_after_init_has_its_last_file_merged(
    job, tmp_path, moved
):
    timeout = 3.0
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=timeout)
    mxprof.set_config(filename=str(tmp_path / "hub.json"))
    mxprof.set_state("run")
    # It names its file after init (as the example's processes do): trace.json,
    # rank0_trace.json once the job's rule prefixes it.
    server = job.start("server", 0, 1, 1, run_locally=True)
    assert wait_for(lambda: len(distributed.members()) == 1, 60)
    last = tmp_path / "rank0_trace.json"

    def reported():
        with hub().reg.lock:
            return [os.path.basename(f) for f in hub().reg.by_slot[("server", 0)].files]

    assert wait_for(lambda: reported()[-1:] == ["rank0_trace.json"], 30), reported()
    assert wait_for(lambda: ticked(last, 5), 30)  # flushed (continuous dump)
    os.kill(server.pid, signal.SIGKILL)
    server.join(10)
    written = len(ticks(last))
    if moved:  # renamed after its death: found by the identity it carries
        last = last.rename(tmp_path / "kept.json")
    mxprof.set_state("stop")
    out = tmp_path / "merged.json"
    with pytest.warns(RuntimeWarning, match="server 0 "):
        summary = within(timeout + _collect.SYNC_FLOOR + SLACK, distributed.collect, out)
    (gap,) = summary["missing"]
    assert os.path.basename(gap["last_file"] or "") == last.name, gap
    merged = _testing.load_trace(out)
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    theirs = [
        e for e in _testing.events(merged, "X", "tick") if f"pid {server.pid}" in names[e["pid"]]
    ]
    assert len(theirs) == written
