"""Stack sampling (sample_rate): attribution to ranges, threads, waiting, every trace
format read back to what dumps() says, the Perfetto engine's view, and no deadlock
with fork, signals or interpreter shutdown."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import mxprof
from mxprof import _sampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _perfetto_engine  # noqa: E402
from _samples import dumps_samples, record, spin  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# Where this process found mxprof (an installed copy, or a built tree): the
# children import the same one, never the source tree's unbuilt mxprof/.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mxprof.__file__)))


@pytest.fixture
def sampler(monkeypatch):
    """Choose the sampler: 'native' (the default, which must be the one
    running) or 'python' (the fallback, as where the native one cannot read
    the interpreter)."""

    def choose(kind):
        if kind == "python":
            monkeypatch.setattr(_sampler, "_checked", "the test asks for the fallback")
            monkeypatch.setattr(_sampler, "_warned", True)
        else:
            assert _sampler._native_refusal() is None, _sampler._native_refusal()

    return choose


def in_a(seconds):
    spin(seconds)


def in_b(seconds):
    spin(seconds)


def functions(block):
    return {f["Function"]: f for f in block["Functions"]}


@pytest.mark.parametrize(
    "value", [-1, -0.5, 20_001, 1e9, float("nan"), float("inf"), "1000", None, True]
)
def test_bad_sample_rate_is_a_config_error_naming_the_limit(value):
    with pytest.raises(mxprof.ConfigError, match=r"sample_rate must be .*20000"):
        mxprof.set_config(sample_rate=value)


def test_sample_rate_accepts_zero_to_the_limit():
    mxprof.set_config(sample_rate=0)
    mxprof.set_config(sample_rate=20_000)
    mxprof.set_config(sample_rate=99.5)


def test_samples_go_to_the_innermost_range(tmp_path):
    d = mxprof.Domain("d")
    a, b = d.new_task("phase_a"), d.new_task("phase_b")

    def body():
        with a:
            in_a(0.2)
            with b:
                in_b(0.2)

    record(str(tmp_path / "t.json"), body)
    assert dumps_samples()["Count"] == len(mxprof.load(str(tmp_path / "t.json")).samples)
    # Every function, not dumps()'s top 20: under pytest's forty frames, each
    # on every sample's stack, a function that misses one sample ranks below them.
    summary = mxprof.load(str(tmp_path / "t.json")).samples.summary(top=1000)
    ranges = summary["Ranges"]["d"]
    in_phase_b = functions(ranges["phase_b"])
    in_phase_a = functions(ranges["phase_a"])
    assert ranges["phase_b"]["Count"] >= 30
    assert in_phase_b["in_b"]["Inclusive %"] >= 90
    assert "in_b" not in in_phase_a  # not the enclosing range's
    assert in_phase_a["in_a"]["Inclusive %"] >= 90
    program = functions({"Functions": summary["Program"]})
    assert program["spin"]["Self %"] >= 80  # the innermost function gets the self samples


@pytest.mark.parametrize("name", ["t.json", "t.json.gz", "t.pftrace"])
def test_loaded_samples_match_dumps(tmp_path, name):
    d = mxprof.Domain("d")
    task = d.new_task("work")
    path = str(tmp_path / name)

    def body():
        with task:
            in_a(0.15)
        in_b(0.15)

    record(path, body)
    live = dumps_samples()
    loaded = mxprof.load(path)
    assert len(loaded.samples) == live["Count"] >= 40
    assert loaded.samples.summary() == live
    # The ranges themselves are unchanged by the samples beside them.
    assert [r.name for r in loaded.key_averages()] == ["work"]


def test_each_thread_gets_its_own_samples(tmp_path):
    path = str(tmp_path / "t.json")
    names = [f"worker-{i}" for i in range(8)]
    bodies = {}
    for i in range(8):
        # A function of its own per thread (its name says whose it is).
        exec(f"def work_{i}(s):\n    spin(s)\n", globals())
        bodies[names[i]] = globals()[f"work_{i}"]

    def body():
        threads = [threading.Thread(target=bodies[n], args=(0.4,), name=n) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    record(path, body)
    trace = mxprof.load(path)
    by_thread = {}
    for s in trace.samples.samples:
        name = trace.thread_names.get((s.pid, s.tid))
        by_thread.setdefault(name, []).append(s.stack)
    for i, name in enumerate(names):
        stacks = by_thread.get(name, [])
        functions = [{f[0] for f in st} for st in stacks]
        # Its own function, and never another thread's. (A sample may also
        # catch the thread starting or ending, inside threading only: on a
        # loaded machine a thread can wait there long enough to be sampled.)
        assert sum(f"work_{i}" in f for f in functions) >= 5, name
        others = {f"work_{j}" for j in range(8) if j != i}
        assert not any(f & others for f in functions), name


def test_a_blocked_thread_is_reported_as_waiting(tmp_path):
    path = str(tmp_path / "t.json")
    waiter = mxprof.Domain("d").new_task("sleeping")

    def sleeper():
        with waiter:
            time.sleep(0.3)

    def body():
        t = threading.Thread(target=sleeper, name="sleeper")
        t.start()
        spin(0.3)
        t.join()

    record(path, body)
    summary = dumps_samples()
    block = summary["Ranges"]["d"]["sleeping"]
    assert block["Count"] >= 20
    top = block["Functions"][0]
    assert top["Function"] == _sampler.WAITING and top["Self %"] >= 90
    # The caller of time.sleep is on the stack, never the innermost.
    caller = [f for f in block["Functions"] if f["Function"].endswith(".sleeper")]
    assert caller and caller[0]["Inclusive %"] >= 90
    assert caller[0]["Self"] <= block["Count"] * 0.1


def test_no_samples_when_off(tmp_path):
    path = str(tmp_path / "t.json")
    record(path, lambda: spin(0.05), rate=0)
    assert "Samples" not in json.loads(mxprof.dumps(format="json"))
    assert len(mxprof.load(path).samples) == 0


def test_perfetto_engine_imports_every_sample(tmp_path):
    try:
        engine = _perfetto_engine.Engine.start()
    except _perfetto_engine.Unavailable as e:
        pytest.skip(str(e))
    try:
        for name in ("t.json", "t.pftrace"):
            path = str(tmp_path / name)
            _testing_reset()
            record(path, lambda: in_a(0.2))
            n = len(mxprof.load(path).samples)
            assert n >= 20
            assert engine.load(path) in ([], None, "")
            if name == "t.pftrace":
                # Innermost frames: the function, or <waiting> when the OS ran
                # another thread in its place (the machine may be busy).
                rows = engine.query(
                    "select count(*) n from perf_sample s join stack_profile_callsite c "
                    "on s.callsite_id = c.id join stack_profile_frame f on c.frame_id = f.id "
                    "where f.name like 'spin (%' or f.name like '<waiting> (%'"
                )
                total = engine.query("select count(*) n from perf_sample")[0]["n"]
                assert total == n and rows[0]["n"] >= n * 0.8
            else:
                rows = engine.query(
                    "select count(*) n from slice where category = 'mxprof.sample' and dur = 0"
                )
                assert rows[0]["n"] == n
            errors = engine.query(
                "select name, value from stats where value > 0 and severity in "
                "('error', 'data_loss')"
            )
            assert errors == []
            engine.close()
            engine = _perfetto_engine.Engine.start()
    finally:
        engine.close()


def _testing_reset():
    from mxprof import _testing

    _testing.reset()


def _run(script, tmp_path, timeout=60, **kw):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=env,
        timeout=timeout,
        capture_output=True,
        text=True,
        **kw,
    )


def test_fork_while_sampling_does_not_deadlock(tmp_path):
    out = _run(
        """
        import os, sys, time, mxprof
        mxprof.set_config(filename="p.json", sample_rate=2000, follow_children=True)
        mxprof.set_state("run")
        def spin(s):
            end = time.perf_counter() + s
            while time.perf_counter() < end:
                pass
        from mxprof import _native
        kids = []
        for _ in range(5):
            pid = os.fork()
            if pid == 0:
                # Until its own sampler has 20 samples (a busy machine may keep
                # it off a CPU for a while), 10 s at most.
                give_up = time.perf_counter() + 10
                while _native.sampler_stats().samples < 20 and time.perf_counter() < give_up:
                    spin(0.01)
                sys.exit(0)  # a normal exit: the child's trace is written
            kids.append(pid)
            spin(0.02)
        for pid in kids:
            assert os.waitpid(pid, 0)[1] == 0
        mxprof.set_state("stop")
        mxprof.dump()
        print("children", len(kids))
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    children = [f for f in os.listdir(tmp_path) if f.startswith("p.") and f != "p.json"]
    assert len(children) == 5
    # Each child sampled its own work (its own sampler, started after the fork).
    for name in children:
        assert len(mxprof.load(str(tmp_path / name)).samples) >= 20, name


def test_signal_while_sampling_writes_the_samples(tmp_path):
    out = _run(
        """
        import os, signal, time, mxprof
        mxprof.set_config(filename="p.json", sample_rate=1000)
        mxprof.set_state("run")
        end = time.perf_counter() + 0.2
        while time.perf_counter() < end:
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        """,
        tmp_path,
    )
    assert out.returncode == -signal.SIGTERM, out.stderr
    assert len(mxprof.load(str(tmp_path / "p.json")).samples) >= 50


def test_exit_while_sampling_ends_and_writes(tmp_path):
    out = _run(
        """
        import threading, time, mxprof
        mxprof.set_config(filename="p.json", sample_rate=5000)
        mxprof.set_state("run")
        def forever():
            while True:
                sum(range(100))
        threading.Thread(target=forever, daemon=True).start()
        time.sleep(0.2)
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert len(mxprof.load(str(tmp_path / "p.json")).samples) >= 50


def test_mxprof_run_prints_the_top_functions(tmp_path):
    script = os.path.join(HERE, "sampling", "plain.py")
    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "mxprof", "run", "--no-report", "-o", "p.json"]
    out = subprocess.run(
        cmd + ["--sample", "1000", script],
        cwd=tmp_path,
        env=env,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Samples (1000 Hz"))
    program = [line.split()[0] for line in lines[start + 5 : start + 8]]
    assert "hot" in program
    off = subprocess.run(
        cmd + ["--no-sample", script],
        cwd=tmp_path,
        env=env,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert off.returncode == 0 and "Samples (" not in off.stderr
    assert len(mxprof.load(str(tmp_path / "p.json")).samples) == 0


def test_the_fallback_reads_a_threads_state_at_the_instant():
    # Running (this thread) is not blocked; a thread asleep in a wait is, as
    # soon as it sleeps: nothing is carried over from an earlier sample.
    me = _sampler._Thread(threading.current_thread())
    blocked = threading.Event()
    t = threading.Thread(target=blocked.wait, args=(10,), name="blocked")
    t.start()
    other = _sampler._Thread(t)
    try:
        assert me.blocked() is False
        deadline = time.monotonic() + 5
        while not other.blocked() and time.monotonic() < deadline:
            time.sleep(0.01)  # until it sleeps in wait()
        assert other.blocked() is True
    finally:
        blocked.set()
        t.join()
        me.close()
        other.close()


@pytest.mark.parametrize("kind", ["native", "python"])
def test_c_code_that_releases_the_gil_is_running_and_a_sleep_is_waiting(tmp_path, kind, sampler):
    import hashlib

    sampler(kind)
    d = mxprof.Domain("d")
    hashing, sleeping = d.new_task("hashing"), d.new_task("sleeping")
    data = b"x" * (4 << 20)

    def hasher():  # in C with the GIL released: running, never waiting
        with hashing:
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end:
                hashlib.sha256(data).digest()

    def sleeper():
        with sleeping:
            time.sleep(0.3)

    def body():
        assert _sampler.kind() == kind
        threads = [threading.Thread(target=f, name=f.__name__) for f in (hasher, sleeper)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    record(str(tmp_path / "t.json"), body)
    assert _sampler.kind() == ""  # stopped with the state
    ranges = dumps_samples()["Ranges"]["d"]
    busy, asleep = ranges["hashing"], ranges["sleeping"]
    assert busy["Count"] >= 20 and asleep["Count"] >= 20
    waited = functions(busy).get(_sampler.WAITING, {"Self": 0})["Self"]
    assert waited <= busy["Count"] * 0.2
    assert functions(asleep)[_sampler.WAITING]["Self %"] >= 90
