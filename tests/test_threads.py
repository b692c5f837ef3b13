"""Many threads record at once while others dump: nothing lost or counted twice."""

import json
import threading

import mxprof
from mxprof import _testing

THREADS = 8
PER_THREAD = 10_000


def test_eight_threads_ten_thousand_tasks_exact(trace_file):
    d = mxprof.Domain("mt")
    task, counter, marker = d.new_task("work"), d.new_counter("items", 0), d.new_marker("tick")
    # This thread writes the file itself, and checks it after each write (a
    # background writer could be caught mid-write).
    mxprof.set_config(
        filename=trace_file, aggregate_stats=True, continuous_dump=False, profile_api=False
    )
    mxprof.set_state("run")
    barrier = threading.Barrier(THREADS + 1)

    def worker():
        barrier.wait()
        for i in range(PER_THREAD):
            with task:
                counter.increment()
            if i % 1000 == 0:
                marker.mark("thread")

    threads = [threading.Thread(target=worker, name=f"w{i}") for i in range(THREADS)]
    for t in threads:
        t.start()
    barrier.wait()
    snapshots = 0
    while any(t.is_alive() for t in threads):
        mxprof.dumps(format="json")
        mxprof.dump(finished=False)
        _testing.load_trace(trace_file)  # valid at every point
        snapshots += 1
    for t in threads:
        t.join()
    mxprof.set_state("stop")
    mxprof.dump()
    assert snapshots > 0
    total = THREADS * PER_THREAD
    stats = json.loads(mxprof.dumps(format="json"))
    assert stats["Time"]["mt"]["work"]["Count"] == total
    assert stats["Counter"]["mt"]["items"]["Count"] == total
    assert stats["Counter"]["mt"]["items"]["Max"] == total
    assert stats["Marker"]["mt"]["tick"]["Count"] == THREADS * 10
    assert counter.value == total
    trace = _testing.load_trace(trace_file)
    xs = _testing.events(trace, "X", "work")
    assert len(xs) == total
    samples = sorted(e["args"]["items"] for e in _testing.events(trace, "C", "items"))
    assert samples == list(range(1, total + 1))  # every increment once, none twice
    by_tid = {}
    for e in xs:
        by_tid[e["tid"]] = by_tid.get(e["tid"], 0) + 1
    assert sorted(by_tid.values()) == [PER_THREAD] * THREADS
    names = {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    assert sorted(names[tid] for tid in by_tid) == [f"w{i}" for i in range(THREADS)]
    assert trace["otherData"]["dropped_events"] == 0
    assert trace["otherData"]["unmatched_stops"] == 0


def test_nesting_is_per_thread(trace_file):
    d = mxprof.Domain("mt")
    outer, inner = d.new_task("outer"), d.new_task("inner")
    mxprof.set_config(filename=trace_file, aggregate_stats=True, profile_api=False)
    mxprof.set_state("run")
    ready = threading.Barrier(2)

    def worker():
        with outer:
            ready.wait()  # both threads hold 'outer' open at once
            for _ in range(100):
                with inner:
                    pass
            ready.wait()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mxprof.dump()
    stats = json.loads(mxprof.dumps(format="json"))
    assert stats["Time"]["mt"]["outer"]["Count"] == 2
    assert stats["Time"]["mt"]["inner"]["Count"] == 200
    assert stats["Profiler"]["non_lifo_stops"] == 0
    trace = _testing.load_trace(trace_file)
    for o in _testing.events(trace, "X", "outer"):
        mine = [e for e in _testing.events(trace, "X", "inner") if e["tid"] == o["tid"]]
        assert len(mine) == 100
        assert all(o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for e in mine)


def test_exited_threads_keep_their_statistics_and_names(trace_file):
    task = mxprof.Domain("mt").new_task("short")
    mxprof.set_config(filename=trace_file, aggregate_stats=True, profile_api=False)
    mxprof.set_state("run")
    for i in range(20):
        t = threading.Thread(
            target=lambda: [task.start() or task.stop() for _ in range(50)], name=f"s{i}"
        )
        t.start()
        t.join()
    assert json.loads(mxprof.dumps(format="json"))["Time"]["mt"]["short"]["Count"] == 1000
    mxprof.dump()
    trace = _testing.load_trace(trace_file)
    # Names by tid (each is written before the thread's first event and again
    # in the trailer).
    names = {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    assert sorted(names.values()) == sorted(f"s{i}" for i in range(20))
    assert len(names) == 20  # a tid per thread, never reused


def test_stats_reset_while_threads_record():
    task = mxprof.Domain("mt").new_task("t")
    mxprof.set_config(aggregate_stats=True, write_trace=False)
    mxprof.set_state("run")
    stop = threading.Event()
    done = []

    def worker():
        n = 0
        while not stop.is_set():
            with task:
                n += 1
        done.append(n)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()

    def count(**kw):
        time = json.loads(mxprof.dumps(format="json", **kw))["Time"]
        return time.get("mt", {}).get("t", {}).get("Count", 0)

    seen = sum(count(reset=True) for _ in range(50))
    stop.set()
    for t in threads:
        t.join()
    seen += count()
    # A range that straddles a reset may fall on either side; none is counted twice.
    assert sum(done) - 4 * 50 <= seen <= sum(done)
