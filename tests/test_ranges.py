"""Task, Frame and Event: every way to use them, what they record, misuse."""

import asyncio
import json

import pytest

import mxprof
from mxprof import _testing
from mxprof._testing import finish, start

MS = 1_000_000


def stats():
    return json.loads(mxprof.dumps(format="json"))


def test_three_ways_record_the_same(trace_file, clock):
    d = mxprof.Domain("dom")
    task = d.new_task("work")

    @task
    def decorated():
        clock(3 * MS)

    start(trace_file)
    task.start()
    clock(1 * MS)
    task.stop()
    with task:
        clock(2 * MS)
    decorated()
    trace = finish(trace_file)
    xs = _testing.events(trace, "X", "work")
    assert [e["dur"] for e in xs] == [1000.0, 2000.0, 3000.0]
    assert all(e["cat"] == "dom" for e in xs)
    assert [e["ts"] for e in xs] == [0.0, 1000.0, 3000.0]
    row = stats()["Time"]["dom"]["work"]
    assert {k: row[k] for k in ("Count", "Total", "Min", "Max", "Avg", "Self")} == {
        "Count": 3,
        "Total": 6.0,
        "Min": 1.0,
        "Max": 3.0,
        "Avg": 2.0,
        "Self": 6.0,
    }


def test_with_and_decorator_end_the_range_when_the_body_raises(trace_file, clock):
    task = mxprof.Domain("dom").new_task("boom")

    @task
    def explode():
        clock(2 * MS)
        raise KeyError("x")

    start(trace_file)
    with pytest.raises(ValueError), task:
        clock(1 * MS)
        raise ValueError("y")
    with pytest.raises(KeyError):
        explode()
    trace = finish(trace_file)
    assert [e["dur"] for e in _testing.events(trace, "X", "boom")] == [1000.0, 2000.0]
    assert stats()["Profiler"]["unmatched_stops"] == 0


def test_decorator_keeps_metadata_and_return_value():
    task = mxprof.Domain("dom").new_task("t")

    @task
    def add(a, b=2):
        """Adds."""
        return a + b

    assert add(1) == 3
    assert add.__name__ == "add"
    assert add.__doc__ == "Adds."
    with pytest.raises(TypeError):
        task(42)


def test_nesting_and_per_thread_order(trace_file, clock):
    d = mxprof.Domain("dom")
    outer, inner = d.new_task("outer"), d.new_task("inner")
    start(trace_file)
    with outer:
        clock(1 * MS)
        with inner:
            clock(2 * MS)
        clock(1 * MS)
    trace = finish(trace_file)
    (o,) = _testing.events(trace, "X", "outer")
    (i,) = _testing.events(trace, "X", "inner")
    assert o["ts"] <= i["ts"] and i["ts"] + i["dur"] <= o["ts"] + o["dur"]
    assert (o["dur"], i["dur"], i["ts"] - o["ts"]) == (4000.0, 2000.0, 1000.0)
    assert o["tid"] == i["tid"]


def test_frames_are_numbered_and_visible(trace_file, clock):
    step = mxprof.Domain("train").new_frame("step")
    other = mxprof.Frame(mxprof.Domain("train"), "other")
    start(trace_file)
    for _ in range(3):
        with step:
            clock(MS)
    other.start()
    other.stop()
    trace = finish(trace_file)
    frames = _testing.events(trace, "X", "step")
    assert [f["args"]["frame"] for f in frames] == [0, 1, 2]
    assert {f["cat"] for f in frames} == {"train,frame"}
    assert _testing.events(trace, "X", "other")[0]["args"]["frame"] == 0
    assert stats()["Time"]["train,frame"]["step"]["Count"] == 3


def test_frame_indexes_restart_with_a_new_profile(trace_file, tmp_path):
    step = mxprof.Domain("train").new_frame("step")
    start(trace_file)
    step.start()
    step.stop()
    step.start()
    step.stop()
    mxprof.dump()
    second = str(tmp_path / "second.json")
    mxprof.set_config(filename=second)
    mxprof.set_state("run")
    step.start()
    step.stop()
    trace = finish(second)
    assert [f["args"]["frame"] for f in _testing.events(trace, "X", "step")] == [0]


def test_events_have_category_event(trace_file, clock):
    ev = mxprof.Event("load")
    start(trace_file)
    ev.start()
    clock(5 * MS)
    ev.stop()
    trace = finish(trace_file)
    (e,) = _testing.events(trace, "X", "load")
    assert (e["cat"], e["dur"]) == ("event", 5000.0)
    assert stats()["Time"]["event"]["load"]["Total"] == 5.0


def test_same_domain_and_name_aggregate_together(trace_file):
    a = mxprof.Task(mxprof.Domain("d"), "same")
    b = mxprof.Domain("d").new_task("same")
    start(trace_file)
    a.start()
    a.stop()
    b.start()
    b.stop()
    b.start()
    a.stop()  # the same object: closes b's range, not misuse
    assert stats()["Time"]["d"]["same"]["Count"] == 3
    assert stats()["Profiler"]["unmatched_stops"] == 0


def test_str_and_repr():
    d = mxprof.Domain("dom")
    assert str(d.new_task("t")) == "t"
    assert str(d.new_frame("f")) == "f"
    assert str(mxprof.Event("e")) == "e"
    assert repr(d.new_task("t")) == "Task('dom', 't')"
    assert d.new_task("t").name == "t" and d.new_task("t").domain == d


def test_stop_without_start_is_counted_not_raised(trace_file):
    task = mxprof.Domain("d").new_task("t")
    start(trace_file)
    task.stop()
    task.stop()
    s = stats()
    assert s["Profiler"]["unmatched_stops"] == 2
    assert "t" not in s["Time"].get("d", {})
    trace = finish(trace_file)
    assert trace["otherData"]["unmatched_stops"] == 2
    assert _testing.events(trace, "X") == []


def test_non_lifo_stop_is_recorded_and_counted(trace_file, clock):
    d = mxprof.Domain("d")
    a, b = d.new_task("a"), d.new_task("b")
    start(trace_file)
    a.start()
    clock(MS)
    b.start()
    clock(MS)
    a.stop()  # a ends while b (started inside it) is still open
    clock(MS)
    b.stop()
    trace = finish(trace_file)
    assert _testing.events(trace, "X", "a")[0]["dur"] == 2000.0
    assert _testing.events(trace, "X", "b")[0]["dur"] == 2000.0
    assert trace["otherData"]["non_lifo_stops"] == 1
    assert trace["otherData"]["unmatched_stops"] == 0


def test_calls_while_stopped_record_nothing_and_are_counted(trace_file):
    d = mxprof.Domain("d")
    task, counter, marker = d.new_task("t"), d.new_counter("c"), d.new_marker("m")
    mxprof.set_config(filename=trace_file, aggregate_stats=True, profile_api=False)
    task.start()
    task.stop()
    counter += 1
    marker.mark()
    mxprof.set_state("run")
    mxprof.set_state("stop")
    s = stats()
    assert s["Time"] == {} and s["Counter"] == {} and s["Marker"] == {}
    assert s["Profiler"]["ignored_calls"] == 4
    assert s["Profiler"]["unmatched_stops"] == 0
    assert counter.value == 1  # values change in every state


def test_range_started_while_stopped_is_not_recorded_nor_misuse(trace_file):
    task = mxprof.Domain("d").new_task("t")
    mxprof.set_config(filename=trace_file, aggregate_stats=True, profile_api=False)
    task.start()  # not recording yet
    mxprof.set_state("run")
    task.stop()
    s = stats()
    assert s["Time"] == {}
    assert s["Profiler"]["unmatched_stops"] == 0


def test_range_straddling_pause_is_kept_whole_and_stop_cuts(trace_file, clock):
    d = mxprof.Domain("d")
    across_pause, across_stop, while_paused = d.new_task("p"), d.new_task("s"), d.new_task("x")
    start(trace_file)
    across_pause.start()
    clock(MS)
    mxprof.pause()
    with while_paused:
        clock(MS)
    clock(MS)
    mxprof.resume()
    across_pause.stop()
    across_stop.start()
    mxprof.set_state("stop")
    clock(MS)
    across_stop.stop()
    mxprof.dump()
    trace = _testing.load_trace(trace_file)
    assert _testing.events(trace, "X", "p")[0]["dur"] == 3000.0
    (cut,) = _testing.events(trace, "X", "s")  # ended by the stop, not 1 ms later
    assert (cut["dur"], cut["args"]) == (0.0, {"cut_short": True})
    assert _testing.events(trace, "X", "x") == []


def test_run_after_pause_resumes_recording(trace_file):
    task = mxprof.Domain("d").new_task("t")
    start(trace_file)
    mxprof.pause()
    mxprof.set_state("run")  # like MXNet: run clears the pause
    task.start()
    task.stop()
    assert stats()["Time"]["d"]["t"]["Count"] == 1


def test_coroutines_decorated_each_get_their_own_range(trace_file, clock):
    task = mxprof.Domain("d").new_task("request")

    @task
    async def handle(delay_ms, gate):
        await gate.wait()
        clock(delay_ms * MS)
        return delay_ms

    async def main():
        gates = [asyncio.Event() for _ in range(3)]
        jobs = [asyncio.ensure_future(handle(i + 1, g)) for i, g in enumerate(gates)]
        await asyncio.sleep(0)
        for g in gates:  # release in order: the ranges interleave, not nest
            g.set()
            await asyncio.sleep(0)
        return await asyncio.gather(*jobs)

    start(trace_file)
    assert asyncio.run(main()) == [1, 2, 3]
    trace = finish(trace_file)
    durs = sorted(e["dur"] for e in _testing.events(trace, "X", "request"))
    assert durs == [1000.0, 3000.0, 6000.0]
    assert trace["otherData"]["unmatched_stops"] == 0


def test_async_frame_decorator_numbers_frames(trace_file):
    frame = mxprof.Domain("d").new_frame("tick")

    @frame
    async def tick():
        await asyncio.sleep(0)

    async def main():
        for _ in range(2):
            await tick()

    start(trace_file)
    asyncio.run(main())
    trace = finish(trace_file)
    assert [e["args"]["frame"] for e in _testing.events(trace, "X", "tick")] == [0, 1]


def test_real_clock_durations_are_plausible(trace_file):
    import time

    task = mxprof.Domain("d").new_task("sleep")
    start(trace_file)
    with task:
        time.sleep(0.05)
    trace = finish(trace_file)
    dur_ms = _testing.events(trace, "X", "sleep")[0]["dur"] / 1000
    assert 45 <= dur_ms <= 1000
    assert 45 <= stats()["Time"]["d"]["sleep"]["Total"] <= 1000
