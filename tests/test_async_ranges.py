"""Ranges whose begin and end are not on one thread's stack: asyncio tasks,
stops on another thread, ranges still open when recording stops."""

import asyncio
import threading

import mxprof
from mxprof import _testing
from mxprof._testing import finish, start

MS = 1_000_000


def stats():
    import json

    return json.loads(mxprof.dumps(format="json"))


def thread_names(trace):
    return {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}


def assert_nested_per_track(trace):
    """On each track, two complete events either nest or do not overlap."""
    by_tid = {}
    for e in _testing.events(trace, "X"):
        by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for tid, spans in by_tid.items():
        for a in spans:
            for b in spans:
                if a is b or a[0] > b[0] or (a[0] == b[0] and a[1] < b[1]):
                    continue  # check each pair once, outer (earlier/longer) first
                assert b[0] >= a[1] or b[1] <= a[1], f"{b} crosses {a} on track {tid}"


def test_concurrent_tasks_pair_their_own_begin_and_end(trace_file, clock):
    """One range object used by two interleaved coroutines: each end closes
    its own task's begin, on the task's own track, with exact durations."""
    fetch = mxprof.Domain("a").new_task("fetch")
    start(trace_file)

    async def main():
        a_in, b_in, a_out = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def first():
            with fetch:  # begins at 0
                a_in.set()
                await b_in.wait()
                clock(30 * MS)  # ends at 40 ms
            a_out.set()

        async def second():
            await a_in.wait()
            clock(10 * MS)
            with fetch:  # begins at 10 ms
                b_in.set()
                await a_out.wait()
                clock(25 * MS)  # ends at 65 ms

        await asyncio.gather(
            asyncio.create_task(first(), name="req-first"),
            asyncio.create_task(second(), name="req-second"),
        )

    asyncio.run(main())
    s = stats()["Time"]["a"]["fetch"]
    assert s["Count"] == 2
    assert (s["Min"], s["Max"], s["Total"]) == (40.0, 55.0, 95.0)
    trace = finish(trace_file)
    names = thread_names(trace)
    spans = {names[e["tid"]]: (e["ts"], e["dur"]) for e in _testing.events(trace, "X", "fetch")}
    assert spans == {"req-first": (0.0, 40_000.0), "req-second": (10_000.0, 55_000.0)}
    assert trace["otherData"]["unmatched_stops"] == 0
    assert trace["otherData"]["non_lifo_stops"] == 0


def test_tasks_nest_their_ranges_and_frames_on_their_tracks(trace_file, clock):
    d = mxprof.Domain("a")
    outer, inner, step = d.new_task("outer"), d.new_task("inner"), d.new_frame("step")

    @d.new_task("decorated")
    async def decorated(n):
        with inner:
            await asyncio.sleep(0)
            clock(n * MS)

    async def worker(n):
        with step:
            outer.start()
            await decorated(n)
            await asyncio.sleep(0)
            outer.stop()

    start(trace_file)

    async def main():
        await asyncio.gather(*(asyncio.create_task(worker(n), name=f"w{n}") for n in (1, 2, 3)))

    asyncio.run(main())
    trace = finish(trace_file)
    assert_nested_per_track(trace)
    names = thread_names(trace)
    per_task = {}
    for e in _testing.events(trace, "X"):
        per_task.setdefault(names[e["tid"]], []).append(e["name"])
    assert sorted(per_task) == ["w1", "w2", "w3"]
    for ranges in per_task.values():
        assert sorted(ranges) == ["decorated", "inner", "outer", "step"]
    frames = sorted(e["args"]["frame"] for e in _testing.events(trace, "X", "step"))
    assert frames == [0, 1, 2]
    assert trace["otherData"]["unmatched_stops"] == trace["otherData"]["non_lifo_stops"] == 0


def test_outside_a_task_ranges_stay_on_the_thread(trace_file):
    """A loop callback (no task) and code before the loop record on the thread."""
    t = mxprof.Domain("a").new_task("cb")
    start(trace_file)

    def callback():
        with t:
            pass

    async def main():
        asyncio.get_running_loop().call_soon(callback)
        await asyncio.sleep(0.01)

    asyncio.run(main())
    trace = finish(trace_file)
    (e,) = _testing.events(trace, "X", "cb")
    assert thread_names(trace)[e["tid"]] == "MainThread"


def test_a_task_ending_with_a_range_open_cuts_it(trace_file, clock):
    t = mxprof.Domain("a").new_task("left_open")
    start(trace_file)

    async def forgetful():
        t.start()
        clock(5 * MS)

    asyncio.run(forgetful())
    trace = finish(trace_file)
    (e,) = _testing.events(trace, "X", "left_open")
    assert e["args"] == {"cut_short": True}
    assert e["dur"] >= 5_000.0


def test_stop_on_another_thread_records_an_async_range(trace_file, clock):
    task = mxprof.Domain("d").new_task("handoff")
    start(trace_file)
    task.start()
    clock(3 * MS)
    t = threading.Thread(target=task.stop, name="consumer")
    t.start()
    t.join()
    s = stats()
    assert s["Time"]["d"]["handoff"]["Count"] == 1
    assert s["Time"]["d"]["handoff"]["Total"] == 3.0
    assert s["Profiler"]["unmatched_stops"] == 0
    task.stop()  # its start was ended already: this one has none
    assert stats()["Profiler"]["unmatched_stops"] == 1
    trace = finish(trace_file)
    b, e = _testing.events(trace, "b", "handoff"), _testing.events(trace, "e", "handoff")
    assert len(b) == len(e) == 1 and b[0]["id"] == e[0]["id"]
    assert (b[0]["ts"], e[0]["ts"]) == (0.0, 3_000.0)
    assert thread_names(trace)[e[0]["tid"]] == "consumer"
    assert _testing.events(trace, "X", "handoff") == []


def test_producer_consumer_pipeline_records_every_item(trace_file):
    item = mxprof.Domain("pipe").new_task("item")
    start(trace_file)
    import queue

    q = queue.Queue()

    def consumer():
        for _ in range(200):
            q.get()
            item.stop()

    c = threading.Thread(target=consumer)
    c.start()
    for _ in range(200):
        item.start()
        q.put(None)
    c.join(timeout=60)
    assert not c.is_alive()
    s = stats()
    assert s["Time"]["pipe"]["item"]["Count"] == 200
    assert s["Profiler"]["unmatched_stops"] == 0
    trace = finish(trace_file)
    assert len(_testing.events(trace, "b", "item")) == 200
    assert len({e["id"] for e in _testing.events(trace, "e", "item")}) == 200


def test_a_range_open_at_stop_is_cut_there_and_counted(trace_file, clock):
    d = mxprof.Domain("d")
    outer, inner = d.new_task("outer"), d.new_task("inner")
    start(trace_file)
    outer.start()
    clock(2 * MS)
    inner.start()
    clock(3 * MS)
    mxprof.set_state("stop")
    clock(7 * MS)
    inner.stop()  # ended by the stop already: neither recorded again nor misuse
    outer.stop()
    s = stats()
    assert s["Time"]["d"]["outer"]["Total"] == 5.0
    assert s["Time"]["d"]["inner"]["Total"] == 3.0
    assert s["Time"]["d"]["outer"]["Self"] == 2.0
    assert s["Profiler"]["cut_ranges"] == 2
    assert s["Profiler"]["unmatched_stops"] == s["Profiler"]["non_lifo_stops"] == 0
    mxprof.dump()
    trace = _testing.load_trace(trace_file)
    got = {e["name"]: (e["ts"], e["dur"], e["args"]) for e in _testing.events(trace, "X")}
    assert got == {
        "outer": (0.0, 5_000.0, {"cut_short": True}),
        "inner": (2_000.0, 3_000.0, {"cut_short": True}),
    }
    assert trace["otherData"]["cut_ranges"] == 2
    assert trace["otherData"]["unmatched_stops"] == 0


def test_ranges_open_on_other_threads_are_cut_at_stop(trace_file):
    t = mxprof.Domain("d").new_task("blocked")
    start(trace_file)
    entered, release = threading.Event(), threading.Event()

    def worker():
        with t:
            entered.set()
            release.wait(30)

    w = threading.Thread(target=worker, name="worker")
    w.start()
    assert entered.wait(30)
    mxprof.set_state("stop")
    mxprof.dump()
    release.set()
    w.join(30)
    trace = _testing.load_trace(trace_file)
    (e,) = _testing.events(trace, "X", "blocked")
    assert e["args"] == {"cut_short": True}
    assert thread_names(trace)[e["tid"]] == "worker"
    assert stats()["Time"]["d"]["blocked"]["Count"] == 1


def test_a_range_open_when_the_file_is_finished_is_cut(trace_file, clock):
    """dump(finished=True) while running ends the profile and its ranges."""
    t = mxprof.Domain("d").new_task("epoch")
    start(trace_file)
    t.start()
    clock(4 * MS)
    mxprof.dump()
    t.stop()
    trace = _testing.load_trace(trace_file)
    (e,) = _testing.events(trace, "X", "epoch")
    assert (e["dur"], e["args"]) == (4_000.0, {"cut_short": True})


def test_pause_keeps_a_straddling_range_whole(trace_file, clock):
    t = mxprof.Domain("d").new_task("whole")
    start(trace_file)
    t.start()
    mxprof.pause()
    clock(4 * MS)
    mxprof.resume()
    t.stop()
    trace = finish(trace_file)
    (e,) = _testing.events(trace, "X", "whole")
    assert e["dur"] == 4_000.0 and "args" not in e


def test_events_after_a_finishing_dump_go_to_a_continuation_file(trace_file, tmp_path):
    import pytest

    t = mxprof.Domain("d").new_task("step")
    start(trace_file)
    with t:
        pass
    mxprof.dump()  # finished, but still running
    assert not (tmp_path / "trace-1.json").exists()
    for _ in range(5):
        with t:
            pass
    assert stats()["Time"]["d"]["step"]["Count"] == 6
    with pytest.warns(RuntimeWarning, match="trace-1.json"):
        mxprof.dump(finished=False)
    first = _testing.load_trace(trace_file)
    assert len(_testing.events(first, "X", "step")) == 1
    with t:
        pass
    mxprof.set_state("stop")
    mxprof.dump()
    second = _testing.load_trace(tmp_path / "trace-1.json")
    assert len(_testing.events(second, "X", "step")) == 6
    assert second["baseTimeNanoseconds"] == first["baseTimeNanoseconds"]


def test_a_finishing_dump_with_nothing_after_it_makes_no_second_file(trace_file, tmp_path):
    t = mxprof.Domain("d").new_task("step")
    start(trace_file)
    with t:
        pass
    mxprof.dump()
    mxprof._session.SESSION.at_exit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]


def test_a_loop_on_another_thread_and_after_it_ends(trace_file, clock):
    """Each thread's loop is known to the core while it runs, and only then."""
    t = mxprof.Domain("a").new_task("r")
    start(trace_file)

    async def in_task():
        with t:
            clock(MS)

    def worker():
        asyncio.run(in_task())
        with t:  # the loop has ended: the thread's own stack again
            clock(2 * MS)

    w = threading.Thread(target=worker, name="looper")
    w.start()
    w.join(30)
    trace = finish(trace_file)
    names = thread_names(trace)
    got = {names[e["tid"]].split("-")[0]: e["dur"] for e in _testing.events(trace, "X", "r")}
    assert got == {"Task": 1_000.0, "looper": 2_000.0}  # asyncio numbers its tasks: Task-N


def test_import_inside_a_running_loop(tmp_path):
    """mxprof imported by code already running in a loop still pairs per task."""
    import subprocess
    import sys

    path = tmp_path / "late.json"
    script = f"""
import asyncio
async def main():
    import mxprof
    mxprof.set_config(filename={str(path)!r}, profile_api=False)
    mxprof.set_state("run")
    f = mxprof.Domain("a").new_task("f")
    async def req(d):
        with f:
            await asyncio.sleep(d)
    await asyncio.gather(req(0.02), req(0.01))
    mxprof.set_state("stop")
    mxprof.dump()
asyncio.run(main())
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    trace = _testing.load_trace(path)
    spans = _testing.events(trace, "X", "f")
    assert len({e["tid"] for e in spans}) == 2
    assert sorted(e["dur"] >= 10_000.0 for e in spans) == [True, True]
    assert_nested_per_track(trace)
