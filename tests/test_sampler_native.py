"""The native sampler (native/src/mxp_sampler.c): what it guarantees beyond what
every sampler does (tests/test_sampling.py): a sample never lands in a range its
stack did not run in, asyncio tasks' samples go to their tracks, cpu mode counts
no waits, threads that come and go keep one timeline and their names, mxprof's
own threads and launcher frames are not the program's, a sandbox that refuses
process_vm_readv still samples, the layout check holds on every CPython it can
reach, and where it fails the fallback says so once."""

import asyncio
import collections
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import _samples
import pytest
from _samples import names, placed, spin

import mxprof
from mxprof import _native, _pylayout, _sampler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mxprof.__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))


def record(path, body, rate=1000, mode="wall"):
    """A trace recorded by the native sampler (tests/_samples.py), loaded."""
    return mxprof.load(_samples.record(path, body, rate, mode, kind="native"))


@pytest.mark.parametrize("value", ["", "CPU", "wallclock", 1, None, True])
def test_bad_sample_mode_is_a_config_error_naming_the_choices(value):
    with pytest.raises(mxprof.ConfigError, match=r"sample_mode must be 'wall' or 'cpu'"):
        mxprof.set_config(sample_mode=value)


def only_in_a():
    spin(0.0003)


def only_in_b():
    spin(0.0003)


def test_two_phases_switching_fast_never_swap_their_samples(tmp_path):
    # Thousands of range boundaries, each a chance for a sample to be read
    # on one side of it and attributed on the other.
    d = mxprof.Domain("d")
    a, b = d.new_task("phase_a"), d.new_task("phase_b")

    def body():
        end = time.perf_counter() + 1.5
        while time.perf_counter() < end:
            with a:
                only_in_a()
            with b:
                only_in_b()

    trace = record(str(tmp_path / "t.json"), body, rate=5000)
    where = collections.Counter()
    for (fn, in_range, _), n in placed(trace, ("only_in_a", "only_in_b")).items():
        where[(fn, in_range)] += n
    assert where[("only_in_a", "phase_a")] >= 200 and where[("only_in_b", "phase_b")] >= 200
    wrong = {
        k: n
        for k, n in where.items()
        if k not in {("only_in_a", "phase_a"), ("only_in_b", "phase_b")}
    }
    assert wrong == {}


def test_asyncio_tasks_samples_go_to_their_own_tracks_and_ranges(tmp_path):
    d = mxprof.Domain("d")

    async def worker(name, task_range):
        for _ in range(30):
            with task_range:
                spin(0.004)  # CPU in the task, inside its range
            await asyncio.sleep(0.001)

    async def main():
        await asyncio.gather(
            asyncio.create_task(worker("a", d.new_task("in_task_a")), name="task-a"),
            asyncio.create_task(worker("b", d.new_task("in_task_b")), name="task-b"),
        )

    trace = record(str(tmp_path / "t.json"), lambda: asyncio.run(main()))
    by_range = collections.Counter(s.range[1] for s in trace.samples.samples if s.range)
    assert by_range["in_task_a"] >= 30 and by_range["in_task_b"] >= 30
    tracks = {}
    in_ranges = [s for s in trace.samples.samples if s.range and s.range[1].startswith("in_task")]
    # Spinning, but for a sample that catches the range's own begin or end.
    assert sum("spin" in names(s) for s in in_ranges) >= len(in_ranges) - 4
    for s in in_ranges:
        assert "worker" in names(s)
        tracks.setdefault(s.range[1], set()).add(s.tid)
        # On the task's own track (named after the task), not the thread's.
        assert (
            trace.thread_names[(s.pid, s.tid)]
            == {"in_task_a": "task-a", "in_task_b": "task-b"}[s.range[1]]
        )
    assert len(tracks["in_task_a"]) == 1 and tracks["in_task_a"] != tracks["in_task_b"]


def wait_in_a():
    time.sleep(0.003)


def wait_in_b():
    time.sleep(0.003)


def test_a_thread_that_blocks_in_turn_at_two_places_is_sampled_where_it_blocks(tmp_path):
    # A blocked thread that has not run since its last sample is sampled as
    # it was, without reading its stack again: one that ran in between (if
    # only for microseconds, to block elsewhere) must be read again.
    d = mxprof.Domain("d")
    a, b = d.new_task("blocked_a"), d.new_task("blocked_b")

    def alternate():
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            with a:
                wait_in_a()
            with b:
                wait_in_b()

    def body():
        t = threading.Thread(target=alternate, name="alternate")
        t.start()
        t.join()

    trace = record(str(tmp_path / "t.json"), body, rate=2000)
    where = placed(trace, ("wait_in_a", "wait_in_b"))
    assert where[("wait_in_a", "blocked_a", True)] >= 200
    assert where[("wait_in_b", "blocked_b", True)] >= 200
    wrong = {
        k: n
        for k, n in where.items()
        if k[1] != {"wait_in_a": "blocked_a", "wait_in_b": "blocked_b"}[k[0]]
    }
    assert wrong == {}


def test_cpu_mode_samples_only_running_threads(tmp_path):
    def sleeper():
        time.sleep(0.4)

    def body():
        t = threading.Thread(target=sleeper, name="sleeper")
        t.start()
        spin(0.4)
        t.join()

    trace = record(str(tmp_path / "t.json"), body, mode="cpu")
    assert len(trace.samples) >= 100
    assert not any(_sampler.WAITING in names(s) for s in trace.samples.samples)
    # The sleeper runs only when it starts and wakes: a sample may catch that.
    assert sum("sleeper" in names(s) for s in trace.samples.samples) <= 3
    assert json.loads(mxprof.dumps(format="json"))["Samples"]["Count"] == len(trace.samples)


def spin_pinned(cpu, seconds, out):
    os.sched_setaffinity(0, {cpu})  # this thread only
    start_cpu, start = time.thread_time(), time.perf_counter()
    spin(seconds)
    out[threading.current_thread().name] = (time.thread_time() - start_cpu) / (
        time.perf_counter() - start
    )


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_cpu_mode_counts_a_thread_only_while_it_has_a_cpu(tmp_path):
    # Two spinning threads share one CPU: each is ready to run all the time
    # but on the CPU about half of it.  CPU mode counts the half (its own
    # CPU clock says how much); "ready to run" would count both in full.
    cpu = min(os.sched_getaffinity(0))
    truth = {}

    def body():
        ts = [
            threading.Thread(target=spin_pinned, args=(cpu, 1.0, truth), name=f"pinned-{i}")
            for i in range(2)
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    before = _native.sampler_stats().ticks
    trace = record(str(tmp_path / "t.json"), body, mode="cpu")
    ticks = _native.sampler_stats().ticks - before
    per = collections.Counter(trace.thread_names.get((s.pid, s.tid)) for s in trace.samples.samples)
    assert ticks >= 300
    for name, on_cpu in truth.items():
        assert on_cpu < 0.8  # they did share the CPU
        assert abs(per[name] / ticks - on_cpu) < 0.15, (name, per[name], ticks, on_cpu)


def test_wall_mode_samples_a_blocked_thread_as_waiting_where_it_waits(tmp_path):
    def sleeper():
        time.sleep(0.4)

    def body():
        t = threading.Thread(target=sleeper, name="sleeper")
        t.start()
        spin(0.4)
        t.join()

    trace = record(str(tmp_path / "t.json"), body)
    slept = [s for s in trace.samples.samples if "sleeper" in names(s)]
    assert len(slept) >= 100
    waiting = [s for s in slept if names(s)[-1] == _sampler.WAITING]
    assert len(waiting) >= 0.9 * len(slept)
    assert all(names(s)[-2] == "sleeper" for s in waiting)  # under the function that waits


def test_threads_that_come_and_go_keep_one_timeline_and_their_names(tmp_path):
    # Short threads sampled before they record, then recording: one trace
    # tid per thread, named, and the sampler itself is no track.
    d = mxprof.Domain("d")
    step = d.new_task("step")

    def work(i):
        spin(0.004)
        with step:
            spin(0.004)

    def body():
        for round_ in range(20):
            ts = [
                threading.Thread(target=work, args=(i,), name=f"short-{round_}-{i}")
                for i in range(5)
            ]
            for t in ts:
                t.start()
            for t in ts:
                t.join()

    trace = record(str(tmp_path / "t.json"), body, rate=5000)
    shown = collections.defaultdict(set)
    for s in trace.samples.samples:
        shown[s.tid].add(trace.thread_names.get((s.pid, s.tid)))
    assert all(len(v) == 1 for v in shown.values()), shown
    sampled = {next(iter(v)) for v in shown.values()}
    assert sum(n.startswith("short-") for n in sampled) >= 50
    assert all(n == "MainThread" or n.startswith("short-") for n in sampled), sampled
    # Every thread in the file has events or samples: no empty tracks.
    events = _events(tmp_path / "t.json")
    used = {e["tid"] for e in events if e.get("ph") not in ("M",)}
    named = {e["tid"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert named <= used, named - used
    # Each short thread's range samples are on the same tid as its others.
    for s in trace.samples.samples:
        if s.range and s.range[1] == "step":
            assert trace.thread_names[(s.pid, s.tid)].startswith("short-")


def _events(path):
    with open(path) as f:
        return json.load(f)["traceEvents"]


def test_mxprofs_own_threads_are_not_sampled(tmp_path):
    def body():
        spin(0.5)  # the writer thread runs every dump_period meanwhile

    mxprof.set_config(dump_period=0.05)
    trace = record(str(tmp_path / "t.json"), body)
    sampled = {trace.thread_names.get((s.pid, s.tid)) for s in trace.samples.samples}
    assert sampled == {"MainThread"}


def _script(tmp_path, text, *args, env=None, timeout=120):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(text))
    return subprocess.run(
        [sys.executable, str(path), *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
        timeout=timeout,
        capture_output=True,
        text=True,
    )


def test_mxprof_run_stacks_begin_at_the_script(tmp_path):
    (tmp_path / "app.py").write_text(
        "import time\ndef hot():\n    end = time.perf_counter() + 0.3\n"
        "    while time.perf_counter() < end:\n        pass\nhot()\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "mxprof", "run", "--no-report", "-o", "p.json", "app.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "RuntimeWarning" not in out.stderr  # the native sampler ran
    trace = mxprof.load(str(tmp_path / "p.json"))
    stacks = [s.stack for s in trace.samples.samples if s.tid and "hot" in names(s)]
    assert len(stacks) >= 100
    for stack in stacks:
        assert stack[0][0] == "<module>" and stack[0][1].endswith("app.py"), stack[:3]
        assert not any(
            "runpy" in f[1] or f[1].endswith(os.path.join("mxprof", "cli.py")) for f in stack
        )
    # No range of the command's own around the script.
    assert not [r for r in trace.key_averages() if r.name.startswith("run ")]


def test_a_sandbox_that_refuses_process_vm_readv_still_samples(tmp_path):
    out = _script(
        tmp_path,
        """
        import time, mxprof
        from mxprof import _sampler
        def hot():
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end:
                pass
        mxprof.set_config(filename="p.json", sample_rate=1000)
        mxprof.set_state("run")
        hot()
        print(_sampler.kind())
        mxprof.set_state("stop")
        """,
        env={"MXPROF_SAFE_READ": "pipe"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["native"]
    samples = mxprof.load(str(tmp_path / "p.json")).samples.samples
    assert sum("hot" in names(s) for s in samples) >= 100


def test_the_fallback_warns_once_names_why_and_still_samples(tmp_path, monkeypatch):
    monkeypatch.setattr(_pylayout, "LAYOUTS", {})
    monkeypatch.setattr(_sampler, "_checked", False)
    monkeypatch.setattr(_sampler, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            mxprof.set_config(filename=str(tmp_path / "t.json"), sample_rate=1000)
            mxprof.set_state("run")
            assert _sampler.kind() == "python"
            spin(0.2)
            mxprof.set_state("stop")
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "no frame layout for CPython" in said[0]
    mxprof.dump()
    assert (
        sum("spin" in names(s) for s in mxprof.load(str(tmp_path / "t.json")).samples.samples) >= 50
    )


def test_sampling_never_stops_the_programs_threads_on_a_bad_layout(tmp_path, monkeypatch):
    # A layout that passes the core's range checks but is wrong: reads fail
    # or find nothing, and the program runs on untouched.
    good = _pylayout.layout()
    bad = {**good, "tstate_frame": good["tstate_frame"] + 8, "frame_previous": 0}
    _native.sampler_layout(bad)
    try:
        mxprof.set_config(filename=str(tmp_path / "t.json"), sample_rate=5000)
        monkeypatch.setattr(_sampler, "_checked", None)  # as if the check had passed
        mxprof.set_state("run")
        spin(0.3)
        mxprof.set_state("stop")
    finally:
        _pylayout.check(good)
    assert _native.sampler_stats().ticks > 0


def _other_pythons():
    """Interpreters to check besides this one: MXPROF_TEST_PYTHONS holds
    'python=dir' pairs separated by ';' (dir: where that interpreter finds
    cffi and msgspec; .ci/run fills it from pyenv's interpreters)."""
    found = []
    for item in filter(None, os.environ.get("MXPROF_TEST_PYTHONS", "").split(";")):
        python, _, site = item.partition("=")
        found.append(
            pytest.param(
                python,
                site,
                id=os.path.basename(os.path.dirname(os.path.dirname(python))) or python,
            )
        )
    return found or [pytest.param(None, None, id="none")]


OTHER = """
import asyncio, sys, threading, time, mxprof
from mxprof import _pylayout, _sampler
def spin(s):
    end = time.perf_counter() + s
    while time.perf_counter() < end:
        pass
def cpu():
    spin(0.3)
def asleep():
    time.sleep(0.3)
d = mxprof.Domain("d")
async def in_task():
    with d.new_task("task_range"):
        spin(0.2)
mxprof.set_config(filename="p.json", sample_rate=1000, aggregate_stats=True)
mxprof.set_state("run")
kind = _sampler.kind()
t = threading.Thread(target=asleep, name="sleeper")
t.start()
cpu()
t.join()
asyncio.run(in_task())
mxprof.set_state("stop")
mxprof.dump()
print(kind, ".".join(map(str, sys.version_info[:2])))
"""


@pytest.mark.slow
@pytest.mark.parametrize("python,site", _other_pythons())
def test_the_layout_holds_on_other_cpythons(tmp_path, python, site):
    if python is None:
        pytest.skip("no other CPython to check: set MXPROF_TEST_PYTHONS (.ci/run fills it)")
    path = tmp_path / "other.py"
    path.write_text(OTHER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, ROOT])}
    env.pop("PYTHONHOME", None)
    out = subprocess.run(
        [python, str(path)], cwd=tmp_path, env=env, timeout=120, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    kind, version = out.stdout.split()
    assert kind == "native", (version, out.stderr)
    trace = mxprof.load(str(tmp_path / "p.json"))
    by_fn = collections.Counter()
    for s in trace.samples.samples:
        fns = names(s)
        for fn in ("cpu", "asleep", "in_task"):
            if fn in fns:
                by_fn[(fn, fns[-1] == _sampler.WAITING, s.range[1] if s.range else None)] += 1
    assert by_fn[("cpu", False, None)] >= 100, (version, by_fn)
    assert by_fn[("asleep", True, None)] >= 100, (version, by_fn)
    assert by_fn[("in_task", False, "task_range")] >= 60, (version, by_fn)
