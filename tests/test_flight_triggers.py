"""The flight recorder's triggers (mxprof/_triggers.py): each against a real
run, asserting on the snapshot it wrote.  Every wait is bounded; none
asserts on wall time (the watchdog's seconds are a threshold, not a check)."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import mxprof
from mxprof import _testing, _triggers, flight, ranges
from mxprof.errors import ConfigError

LIMIT = 60.0  # the longest any one wait may take: a loaded machine never reaches it


def wait_for(condition, what):
    deadline = time.monotonic() + LIMIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {LIMIT} s for {what}")
        time.sleep(0.01)


def snapshots(directory):
    """Every snapshot in directory: (path, parsed trace), oldest first."""
    paths = sorted(glob.glob(os.path.join(str(directory), "*.flight*")))
    return [(p, _testing.load_trace(p)) for p in paths]


def info(trace):
    return trace["otherData"]["flight_recorder"]


def record(tmp_path, **config):
    base = {"flight_recorder": 30, "flight_recorder_interval": 0}
    _testing.start(tmp_path / "run.json", **{**base, **config})


def run_script(tmp_path, text, *args):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(text))
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=LIMIT * 2,
        cwd=tmp_path,
    )


# ---- exceptions ----


MAIN_EXCEPTION = """
import mxprof
mxprof.set_config(flight_recorder=30, flight_recorder_interval=0, filename="run.json",
                  flush_on_signal=False)
mxprof.set_state("run")
d = mxprof.Domain("app")
step, work = mxprof.Frame(d, "step"), mxprof.Task(d, "work")
for _ in range(3):
    with step:
        pass
work.start()
raise RuntimeError("main boom")
"""


def test_an_uncaught_exception_in_the_main_thread_is_written_before_exit(tmp_path):
    proc = run_script(tmp_path, MAIN_EXCEPTION)
    # The hook in place before (Python's) still ran: traceback and status as usual.
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "RuntimeError: main boom" in proc.stderr
    (path, trace), *more = snapshots(tmp_path)
    assert not more and path.endswith("run.flight1-exception.json")
    meta = info(trace)
    assert meta["reason"] == "exception"
    assert meta["details"]["type"] == "RuntimeError"
    assert meta["details"]["message"] == "main boom"
    assert meta["details"]["thread"] == "MainThread"
    assert meta["details"]["where"].endswith(" <module>")
    steps = _testing.events(trace, "X", "step")
    assert [e["args"]["frame"] for e in steps] == [0, 1, 2]
    (work,) = _testing.events(trace, "X", "work")
    assert work["args"]["cut_short"] is True  # open when the process died


def test_an_uncaught_exception_in_a_worker_thread_keeps_the_chain(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    before = threading.excepthook
    record(tmp_path)
    assert threading.excepthook is not before  # chained in front while recording
    work = mxprof.Task(mxprof.Domain("app"), "work")

    def body():
        with work:
            pass
        raise ValueError("thread boom")

    worker = threading.Thread(target=body, name="loader")
    worker.start()
    worker.join(LIMIT)
    wait_for(lambda: flight.counts()["written"] == 1, "the snapshot")
    assert [str(e) for e in seen] == ["thread boom"]  # the previous hook ran too
    ((path, trace),) = snapshots(tmp_path)
    meta = info(trace)
    assert meta["reason"] == "exception"
    assert meta["details"]["type"] == "ValueError"
    assert meta["details"]["message"] == "thread boom"
    assert meta["details"]["thread"] == "loader"
    assert meta["details"]["where"].endswith(".<locals>.body")
    (event,) = _testing.events(trace, "X", "work")
    names = {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    assert event["tid"] in names
    mxprof.set_state("stop")
    mxprof.dump(finished=True)  # the profile ends: the hook goes
    assert threading.excepthook is before


def test_system_exit_in_a_thread_and_trigger_exception_off_take_no_snapshot(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_type))
    hooks = sys.excepthook, threading.excepthook
    record(tmp_path)
    worker = threading.Thread(target=sys.exit)
    worker.start()
    worker.join(LIMIT)
    assert seen == [SystemExit]  # handed on, and not a snapshot
    mxprof.set_config(trigger_exception=False)
    assert (sys.excepthook, threading.excepthook) == hooks
    worker = threading.Thread(target=lambda: 1 / 0)
    worker.start()
    worker.join(LIMIT)
    assert seen == [SystemExit, ZeroDivisionError]
    assert flight.counts()["triggers"] == 0


def test_a_hook_put_in_front_later_keeps_the_chain(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *exc: seen.append(("original", exc[0])))
    record(tmp_path)
    ours = sys.excepthook

    def theirs(*exc):
        seen.append(("theirs", exc[0]))
        ours(*exc)

    sys.excepthook = theirs
    mxprof.set_config(trigger_exception=False)  # off: ours cannot leave, theirs calls it
    assert sys.excepthook is theirs
    sys.excepthook(KeyError, KeyError("x"), None)
    assert flight.counts()["triggers"] == 0
    mxprof.set_config(trigger_exception=True)  # on again, not put in a second time
    assert sys.excepthook is theirs
    sys.excepthook(KeyError, KeyError("y"), None)
    assert seen == [("theirs", KeyError), ("original", KeyError)] * 2
    wait_for(lambda: flight.counts()["written"] == 1, "the snapshot")
    ((_, trace),) = snapshots(tmp_path)
    assert info(trace)["details"]["message"] == "'y'"


# ---- a signal ----


SIGNAL = """
import os, signal, sys, time, mxprof
from mxprof import flight
mxprof.set_config(flight_recorder=30, flight_recorder_interval=0, filename="run.json")
mxprof.set_state("run")
ours = signal.getsignal(signal.SIGUSR2)
mark = mxprof.Marker(mxprof.Domain("app"), "before the signal")
mark.mark()
os.kill(os.getpid(), signal.SIGUSR2)
deadline = time.monotonic() + 60
while flight.counts()["written"] < 1 and time.monotonic() < deadline:
    time.sleep(0.01)
mxprof.dump(finished=True)  # ends the flight recorder: the handler goes
print(ours not in (signal.SIG_DFL, None), signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL)
"""


def test_sigusr2_takes_a_snapshot_and_the_handler_goes_with_the_profile(tmp_path):
    proc = run_script(tmp_path, SIGNAL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]
    reasons = {info(t)["reason"]: info(t) for _, t in snapshots(tmp_path)}
    assert set(reasons) == {"signal", "dump()"}
    assert reasons["signal"]["details"] == {"signal": "SIGUSR2"}
    (trace,) = [t for _, t in snapshots(tmp_path) if info(t)["reason"] == "signal"]
    assert len(_testing.events(trace, "i", "before the signal")) == 1


def test_the_trigger_signal_follows_its_key(tmp_path):
    record(tmp_path)
    handler = _triggers.SIGNAL.handler
    assert signal.getsignal(signal.SIGUSR2) == handler
    mxprof.set_config(trigger_signal="SIGUSR1")
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR1) == handler
    os.kill(os.getpid(), signal.SIGUSR1)
    wait_for(lambda: flight.counts()["written"] == 1, "the snapshot")
    ((_, trace),) = snapshots(tmp_path)
    assert info(trace)["details"] == {"signal": "SIGUSR1"}
    mxprof.set_config(trigger_signal=None)
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


def test_a_profile_begun_outside_the_main_thread_says_why_no_signal(tmp_path):
    def begin():
        record(tmp_path)

    for _ in range(2):  # once per profile
        worker = threading.Thread(target=begin)
        with pytest.warns(RuntimeWarning, match="trigger_signal SIGUSR2 is not installed"):
            worker.start()
            worker.join(LIMIT)
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
        mxprof.set_state("stop")
        mxprof.dump(finished=True)


OWNED = """
import os, signal, warnings, mxprof
from mxprof import flight
seen = []
def mine(signum, frame):
    seen.append(signum)
signal.signal(signal.SIGUSR1, mine)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mxprof.set_config(flight_recorder=30, filename="run.json", trigger_signal="usr1")
    mxprof.set_state("run")
    mxprof.set_config(flight_recorder_interval=0)  # applied again: no second warning
print(signal.getsignal(signal.SIGUSR1) is mine)
os.kill(os.getpid(), signal.SIGUSR1)
print(seen == [signal.SIGUSR1], flight.counts()["triggers"])
for w in caught:
    print("WARNING", w.message)
"""


def test_a_signal_the_program_handles_is_left_alone_with_one_warning(tmp_path):
    proc = run_script(tmp_path, OWNED)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["True", "True 0"]
    warned = [x for x in lines if x.startswith("WARNING")]
    assert len(warned) == 1
    assert "trigger_signal SIGUSR1 is not installed" in warned[0]
    assert snapshots(tmp_path) == []


STORM = """
import os, signal, time, mxprof
from mxprof import flight
mxprof.set_config(flight_recorder=30, flight_recorder_interval=0, flight_recorder_max=1000,
                  filename="run.json")
mxprof.set_state("run")
for i in range(50):
    os.kill(os.getpid(), signal.SIGUSR2)  # its handler runs while the session lock is taken
    mxprof.set_config(flight_recorder_after=0.0)
print(flight.counts()["triggers"])
"""


def test_a_signal_while_the_session_is_busy_never_deadlocks(tmp_path):
    proc = run_script(tmp_path, STORM)  # bounded by run_script's timeout
    assert proc.returncode == 0, proc.stderr
    handled = int(proc.stdout)  # signals that arrive together count once
    assert 1 <= handled <= 50
    assert {info(t)["reason"] for _, t in snapshots(tmp_path)} == {"signal"}
    assert len(snapshots(tmp_path)) == handled  # each written, the last ones at exit


# ---- a slow step ----


def test_a_slow_step_takes_one_snapshot_after_enough_steps(tmp_path, clock):
    record(tmp_path, trigger_slow_step=3, trigger_slow_step_steps=5)
    d = mxprof.Domain("train")
    step, other = mxprof.Frame(d, "step"), mxprof.Frame(d, "eval")

    def run(frame, ms):
        with frame:
            clock(ms * 1_000_000)

    run(step, 1)
    run(step, 50)  # long, but fewer than 5 steps are known: no trigger yet
    for _ in range(4):
        run(step, 1)
    for _ in range(5):
        run(other, 40)  # another frame: a median of its own
    assert flight.counts()["triggers"] == 0
    run(step, 2)  # 2 ms < 3 x median 1 ms? No: 2 < 3, not slow
    run(step, 10)  # 10 ms > 3 x 1 ms: slow
    run(other, 40)
    wait_for(lambda: flight.counts()["written"] == 1, "the snapshot")
    assert flight.counts()["triggers"] == 1
    ((path, trace),) = snapshots(tmp_path)
    meta = info(trace)
    assert meta["reason"] == "slow step" and path.endswith("flight1-slow_step.json")
    assert meta["details"] == {
        "step": "train:step",
        "thread": "MainThread",
        "seconds": 0.01,
        "median_seconds": 0.001,
        "factor": 3.0,
        "steps": 5,
    }
    durations = [e["dur"] for e in _testing.events(trace, "X", "step")]
    assert durations[-1] == 10_000.0 and 50_000.0 in durations


def test_the_steps_observer_is_set_only_while_a_step_trigger_records(tmp_path):
    record(tmp_path)
    assert ranges._steps is None
    mxprof.set_config(watchdog=60)
    assert ranges._steps is _triggers.STEPS
    mxprof.set_state("stop")
    mxprof.dump(finished=True)
    assert ranges._steps is None and _triggers.STATE.monitor is None


def test_a_decorated_frame_is_a_step(tmp_path, clock):
    record(tmp_path, trigger_slow_step=2, trigger_slow_step_steps=3)
    step = mxprof.Frame(mxprof.Domain("train"), "step")

    @step
    def train(ms):
        clock(ms * 1_000_000)

    for ms in (1, 1, 1, 5):
        train(ms)
    wait_for(lambda: flight.counts()["written"] == 1, "the snapshot")
    ((_, trace),) = snapshots(tmp_path)
    assert info(trace)["details"]["seconds"] == 0.005


# ---- memory ----


def test_memory_above_the_threshold_triggers_once_per_crossing(tmp_path):
    record(tmp_path, trigger_memory=1000)
    monitor = _triggers.STATE.monitor

    def settle():  # two looks more: the monitor saw what was done before
        seen = monitor.looks
        wait_for(lambda: monitor.looks >= seen + 2, "the monitor's look")

    with mxprof.scope("weights"):
        a = mxprof.memory.record_alloc(600)
        settle()
        b = mxprof.memory.record_alloc(600)  # 1200 in use: crossed
        wait_for(lambda: flight.counts()["written"] == 1, "the first snapshot")
        c = mxprof.memory.record_alloc(600)  # still above: no second snapshot
        settle()
        assert flight.counts()["triggers"] == 1
        mxprof.memory.record_free(b)
        mxprof.memory.record_free(c)
        settle()  # below again: armed
        mxprof.memory.record_alloc(2000)
        wait_for(lambda: flight.counts()["written"] == 2, "the second snapshot")
    assert a
    settle()
    assert flight.counts()["triggers"] == 2
    details = [info(t)["details"] for _, t in snapshots(tmp_path)]
    assert [d["name"] for d in details] == ["weights:", "weights:"]
    assert [d["kind"] for d in details] == ["scope", "scope"]
    assert details[0]["bytes"] >= 1200 and details[1]["bytes"] == 2600
    assert all(d["threshold"] == 1000 for d in details)


def test_resident_memory_above_the_threshold_triggers_once(tmp_path):
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc/self/statm here")
    record(tmp_path, trigger_rss=1 << 20)  # any Python process is above 1 MiB
    monitor = _triggers.STATE.monitor
    wait_for(lambda: flight.counts()["written"] == 1, "the snapshot")
    seen = monitor.looks
    wait_for(lambda: monitor.looks >= seen + 3, "more looks")
    assert flight.counts()["triggers"] == 1
    ((_, trace),) = snapshots(tmp_path)
    details = info(trace)["details"]
    assert details["kind"] == "rss" and details["bytes"] > 1 << 20


# ---- the hang watchdog ----


HANG = """
import os, signal, sys, threading, time, mxprof
from mxprof import flight
how = sys.argv[1]
mxprof.set_config(flight_recorder=30, flight_recorder_interval=0, filename="run.json",
                  watchdog=0.5)
mxprof.set_state("run")
d = mxprof.Domain("hang")
step, blocked = mxprof.Frame(d, "step"), mxprof.Task(d, "blocked")
lock = threading.Lock()
lock.acquire()

class Woken(Exception):
    pass

def wake(signum, frame):
    raise Woken()

signal.signal(signal.SIGUSR1, wake)

def helper():  # ends the hang once the snapshot is written
    deadline = time.monotonic() + 60
    while flight.counts()["written"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    if how == "lock":
        lock.release()
    else:
        os.kill(os.getpid(), signal.SIGUSR1)

def wait_here():
    if how == "lock":
        lock.acquire(timeout=90)
    else:
        time.sleep(90)

for _ in range(3):
    with step:
        pass
threading.Thread(target=helper, name="helper").start()
try:
    with step:
        with blocked:
            wait_here()
except Woken:
    pass
print("done", flight.counts()["triggers"])
"""


@pytest.mark.parametrize("how", ["lock", "sleep"])
def test_the_watchdog_names_the_stuck_thread_while_it_waits_in_c(tmp_path, how):
    proc = run_script(tmp_path, HANG, how)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["done", "1"]
    script = str(tmp_path / "script.py")
    lines = [x for x in proc.stderr.splitlines() if x.startswith("mxprof watchdog:")]
    assert len(lines) == 1, proc.stderr  # once per hang
    line = lines[0]
    assert "thread 'MainThread' is stuck in range 'hang:blocked'" in line
    assert f"at {script}:" in line and line.split("; ")[1].endswith(" wait_here")
    ((path, trace),) = snapshots(tmp_path)
    assert line.endswith("snapshot: run.flight1-hang.json") and path.endswith(line[-21:])
    meta = info(trace)
    assert meta["reason"] == "hang"
    details = meta["details"]
    assert details["stuck_thread"] == "MainThread"
    assert details["seconds_without_step"] >= 0.5
    threads = {t["name"]: t for t in details["threads"]}
    assert set(threads) == {"MainThread", "helper"}  # mxprof's own threads left out
    main = threads["MainThread"]
    assert main["innermost_range"] == "hang:blocked"
    assert main["waiting"] is True
    assert main["stack"][0].startswith(f"{script}:") and main["stack"][0].endswith(" wait_here")
    assert main["stack"][1].endswith(" <module>")
    assert threads["helper"]["innermost_range"] is None
    assert threads["helper"]["stack"][0].endswith(" helper")
    # In the trace: the open ranges cut, and each thread's stack as a sample
    # on its own track at the trigger.
    (cut,) = _testing.events(trace, "X", "blocked")
    assert cut["args"]["cut_short"] is True
    assert _testing.events(trace, "X", "step")[-1]["args"]["cut_short"] is True
    samples = _testing.events(trace, "i")
    main_samples = [e for e in samples if e["tid"] == cut["tid"] and e["cat"] == "mxprof.sample"]
    assert [e["name"] for e in main_samples] == ["<waiting>"]
    assert len([e for e in samples if e["cat"] == "mxprof.sample"]) == 2  # one per thread
    stacks = {e["args"]["id"]: e["args"] for e in _testing.events(trace, "M", "mxprof_stack")}
    frames = {e["args"]["id"]: e["args"] for e in _testing.events(trace, "M", "mxprof_frame")}
    node, names = main_samples[0]["args"]["stack"], []
    while node:
        names.append(frames[stacks[node]["frame"]]["function"])
        node = stacks[node].get("parent", 0)
    assert names[:2] == ["<waiting>", "wait_here"]


def test_the_watchdog_fires_once_per_hang_and_names_the_earliest_range(tmp_path, capsys):
    record(tmp_path)
    d = mxprof.Domain("job")
    step, load, poll = mxprof.Frame(d, "step"), mxprof.Task(d, "load"), mxprof.Task(d, "poll")
    began, release = threading.Event(), threading.Event()

    def loader():
        with load:  # opened before the main thread's range: this thread is the stuck one
            began.set()
            release.wait(LIMIT)

    worker = threading.Thread(target=loader, name="loader")
    worker.start()
    began.wait(LIMIT)
    with poll:
        mxprof.set_config(watchdog=0.2)  # counts from here
        monitor = _triggers.STATE.monitor
        wait_for(lambda: flight.counts()["written"] == 1, "the first hang's snapshot")
        seen = monitor.looks
        wait_for(lambda: monitor.looks >= seen + 5, "more looks")
        assert flight.counts()["triggers"] == 1  # once per hang
    with step:  # a step ends: armed again
        pass
    wait_for(lambda: flight.counts()["written"] == 2, "the second hang's snapshot")
    release.set()
    worker.join(LIMIT)
    (first, _), (second, _) = [(info(t)["details"], t) for _, t in snapshots(tmp_path)]
    assert first["stuck_thread"] == "loader"
    threads = {t["name"]: t for t in first["threads"]}
    assert threads["loader"]["innermost_range"] == "job:load"
    assert threads["MainThread"]["innermost_range"] == "job:poll"
    assert threads["loader"]["range_began_us"] < threads["MainThread"]["range_began_us"]
    assert second["stuck_thread"] == "loader"
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("mxprof watchdog")]
    assert len(lines) == 2
    assert "thread 'loader' is stuck in range 'job:load'" in lines[0]
    assert lines[0].split("; ")[1].endswith(" Condition.wait")  # Event.wait's, in Python


def test_the_watchdog_is_quiet_while_steps_end(tmp_path):
    record(tmp_path, watchdog=0.3)
    monitor = _triggers.STATE.monitor
    step = mxprof.Frame(mxprof.Domain("train"), "step")
    seen = monitor.looks
    while monitor.looks < seen + 10:  # steps end far more often than every 0.3 s
        with step:
            pass
    mxprof.set_state("stop")  # stopped: no hang, however long
    seen = monitor.looks
    wait_for(lambda: monitor.looks >= seen + 5, "more looks")
    assert flight.counts()["triggers"] == 0


# ---- bad values ----


@pytest.mark.parametrize(
    "key,value",
    [
        ("trigger_exception", "yes"),
        ("trigger_signal", "SIGNOPE"),
        ("trigger_signal", "SIGKILL"),
        ("trigger_signal", 9999),
        ("trigger_signal", True),
        ("trigger_slow_step", 0.5),
        ("trigger_slow_step", -1),
        ("trigger_slow_step", float("nan")),
        ("trigger_slow_step", "3"),
        ("trigger_slow_step_steps", 0),
        ("trigger_slow_step_steps", 2.5),
        ("trigger_memory", -1),
        ("trigger_memory", 1.5),
        ("trigger_rss", True),
        ("watchdog", -1),
        ("watchdog", float("inf")),
        ("watchdog", "10"),
    ],
)
def test_a_bad_trigger_value_is_a_config_error_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=f"^{key} must be"):
        mxprof.set_config(**{key: value})


def test_trigger_signal_values_are_normalised():
    for value, name in [("usr1", "SIGUSR1"), (signal.SIGUSR2, "SIGUSR2"), (None, ""), ("", "")]:
        mxprof.set_config(trigger_signal=value)
        assert mxprof._session.SESSION.config.trigger_signal == name


def test_the_step_trigger_benchmark_runs(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, os.path.join(root, "benchmarks", "flight_triggers.py")]
        + ["--number", "200", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=LIMIT * 2,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| `with frame: pass` | slow step on |" in proc.stdout
