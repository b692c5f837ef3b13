"""The fast reading of files in mxprof's one-event-per-line shape gives what the
general reader gives, event for event, and key_averages without holding events."""

import gzip
import json
import threading

import pytest

import mxprof
from mxprof import _testing, memory
from mxprof.trace import Trace, read_raw
from mxprof.trace.model import read_events


def general(path):
    """The trace as the general reader (whole text, dicts) gives it."""
    events, metadata, truncated = read_raw(path)
    return Trace.from_raw(events, metadata=metadata, truncated=truncated)


def same(fast, slow):
    assert fast.events == slow.events
    assert fast.process_names == slow.process_names
    assert fast.thread_names == slow.thread_names
    assert fast.metadata == slow.metadata
    assert (fast.truncated, fast.unmatched) == (slow.truncated, slow.unmatched)
    assert list(fast.key_averages()) == list(slow.key_averages())


def record(path):
    """A recording with nesting, zero-length ranges, threads, counters, markers,
    memory by scope, frames and a range stopped on another thread."""
    _testing.start(path, profile_memory=True)
    d = mxprof.Domain("work")
    outer, inner, empty = d.new_task("outer"), d.new_task("inner"), d.new_task("empty")
    frame, counter, marker = d.new_frame("step"), d.new_counter("loss", 5), d.new_marker("m")
    handed = d.new_task("handed")
    for i in range(50):
        with frame, outer:
            with mxprof.scope("fwd:"):
                buf = memory.record_alloc(1024 * (i + 1), "cpu:0")
            for _ in range(3):
                with inner:
                    pass
            with empty:
                pass
            counter.set_value(i)
            marker.mark()
            memory.record_free(buf)
    handed.start()
    worker = threading.Thread(target=handed.stop)
    worker.start()
    worker.join()

    def other():
        for _ in range(20):
            with outer, inner:
                pass

    threads = [threading.Thread(target=other) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _testing.finish(path)


@pytest.mark.parametrize("form", ["json", "gzip", "gzip members"])
def test_recorded_trace_reads_alike_both_ways(tmp_path, form):
    path = tmp_path / "t.json"
    record(path)
    if form != "json":
        text = path.read_bytes()
        half = len(text) // 2
        path = tmp_path / "t.json.gz"
        path.write_bytes(
            gzip.compress(text)
            if form == "gzip"
            else gzip.compress(text[:half]) + gzip.compress(text[half:])
        )
    fast = mxprof.load(path)
    assert fast._events is None  # read once without keeping events
    summary_rows = list(fast.key_averages())
    assert fast._events is None and len(fast) == len(general(path))
    assert summary_rows == list(general(path).key_averages())
    names = {r.name for r in summary_rows}
    assert {"outer", "inner", "empty", "step", "handed"} <= names
    same(fast, general(path))  # events read again, on first use
    same(read_events(path), general(path))


def lines(path, events, tail=',\n"otherData":{"k":1}}\n', head='{"a":1,"traceEvents":[\n'):
    text = head + ",\n".join(json.dumps(e) for e in events) + "\n]" + tail
    path.write_text(text)
    return path


ODD = [
    {"ph": "X", "name": "half", "ts": 0.0015, "dur": 0.001, "pid": 1, "tid": 1},
    {"ph": "X", "name": "epoch", "ts": 1.7e15 + 0.5, "dur": 3.25, "pid": 1, "tid": 2},
    {"ph": "X", "name": "strts", "ts": "12.5", "dur": 1, "pid": 1.0, "tid": 1},
    {"ph": "X", "name": 7, "ts": 20, "pid": "p", "tid": None},
    {"ph": "X", "name": "nodur", "ts": 30, "pid": 1, "tid": 1},
    {"ph": "I", "name": "old instant", "ts": 31, "pid": 1, "tid": 1, "s": "g"},
    {"ph": "i", "name": "inst", "ts": 32, "pid": 1, "tid": 1, "args": [1]},
    {"ph": "C", "name": "c", "ts": 33, "pid": 1, "tid": 1, "args": {"c": 2}},
    {"ph": "B", "name": "b1", "ts": 40, "pid": 1, "tid": 1, "args": {"x": 1}},
    {"ph": "B", "name": "b2", "ts": 41, "pid": 1, "tid": 1},
    {"ph": "E", "ts": 45, "pid": 1, "tid": 1, "args": {"y": 2}},
    {"ph": "E", "ts": 47, "pid": 1, "tid": 1},
    {"ph": "E", "ts": 48, "pid": 1, "tid": 3},
    {"ph": "b", "name": "a", "cat": "c", "id": 5, "ts": 50, "pid": 1, "tid": 1},
    {"ph": "e", "name": "a", "cat": "c", "id": 5, "ts": 60, "pid": 1, "tid": 2},
    {"ph": "X", "name": "nots", "pid": 1, "tid": 1},
    {"ph": "s", "name": "flow", "ts": 1, "pid": 1, "tid": 1, "id": 1},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "proc"}},
    {"ph": "X", "name": "neg", "ts": 70, "dur": -1, "pid": 1, "tid": 1},
    {"ph": "X", "name": "bool", "ts": 71, "dur": True, "pid": 1, "tid": 1},
]


def test_odd_values_read_alike_both_ways(tmp_path):
    path = lines(tmp_path / "odd.json", ODD)
    same(mxprof.load(path), general(path))
    same(read_events(path), general(path))
    got = {e.name: e for e in read_events(path)}
    assert (got["half"].ts, got["half"].dur) == (2, 1)  # 1.5 -> 2, end 2.5 -> 3
    assert got["epoch"].ts == 1_700_000_000_000_000_500 and got["epoch"].dur == 3250
    assert got["b1"].dur == 7000 and got["b1"].args == {"x": 1}
    assert got["b2"].args == {"y": 2} and got["a"].dur == 10_000
    assert got["7"].tid == "" and got["strts"].pid == 1


def test_the_array_form_and_a_file_without_events(tmp_path):
    events = [{"ph": "X", "name": "x", "ts": k, "dur": 1, "pid": 1, "tid": 1} for k in range(5)]
    path = lines(tmp_path / "a.json", events, head="[\n", tail="\n")
    trace = mxprof.load(path)
    assert trace._events is None and len(trace) == 5
    same(trace, general(path))
    empty = lines(tmp_path / "e.json", [], head='{"traceEvents":[\n')
    assert len(mxprof.load(empty)) == 0 and mxprof.load(empty).metadata == {"otherData": {"k": 1}}


def test_ranges_out_of_end_order_still_get_their_self_times(tmp_path):
    """A thread whose ranges are not in the order they ended (a parent before
    its child, as other tools write) is read again for key_averages."""
    events = [
        {"ph": "X", "name": "parent", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "name": "child", "ts": 2, "dur": 3, "pid": 1, "tid": 1},
        {"ph": "X", "name": "same_end_outer", "ts": 20, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "name": "same_end_inner", "ts": 25, "dur": 5, "pid": 1, "tid": 1},
    ]
    path = lines(tmp_path / "o.json", events)
    trace = mxprof.load(path)
    rows = {r.name: r for r in trace.key_averages()}
    assert rows["parent"].self == 7000 and rows["same_end_outer"].self == 5000
    same(mxprof.load(path), general(path))


def test_cut_and_damaged_files_go_the_general_way(tmp_path):
    events = [{"ph": "X", "name": "x", "ts": k, "dur": 1, "pid": 1, "tid": 1} for k in range(50)]
    whole = lines(tmp_path / "w.json", events).read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole[: len(whole) // 2])
    # Not the core's own file (valid after every write): a cut is an error.
    with pytest.raises(mxprof.TraceFormatError, match="cut.json: .*mxprof repair"):
        mxprof.load(cut)
    gz = tmp_path / "cut.json.gz"
    gz.write_bytes(gzip.compress(whole)[:-30])
    with pytest.raises(mxprof.TraceFormatError, match="cut.json.gz: the gzip stream ends"):
        mxprof.load(gz)
    damaged = tmp_path / "d.json"
    damaged.write_bytes(whole.replace(b'"name": "x"', b'"name": x', 1))
    with pytest.raises(mxprof.TraceFormatError, match="d.json: not valid JSON at line 2"):
        mxprof.load(damaged)


def test_shared_empty_args_refuse_changes(tmp_path):
    path = lines(tmp_path / "n.json", [{"ph": "X", "name": "x", "ts": 1, "pid": 1, "tid": 1}])
    (event,) = read_events(path)
    assert event.args == {}
    with pytest.raises(TypeError, match="shared"):
        event.args["k"] = 1


@pytest.mark.parametrize("huge", [1e23, 1e308, 10**30])
def test_a_duration_past_int64_ns_is_no_length_both_ways(tmp_path, huge):
    """Found by tests/fuzz/fuzz_reader.py, then 1e308 by hand (an
    OverflowError in every command): a time beyond ±2**63 ns is no time, read
    alike both ways; a range of such a length has none."""
    events = [
        {"ph": "X", "name": "big", "ts": 1, "dur": huge, "pid": 1, "tid": 1},
        {"ph": "X", "name": "big", "ts": 2, "dur": 1, "pid": 1, "tid": 1},
        {"ph": "X", "name": "lost", "ts": huge, "dur": 1, "pid": 1, "tid": 1},
    ]
    path = lines(tmp_path / "h.json", events)
    fast, slow = mxprof.load(path), general(path)
    (row,) = fast.key_averages()  # the range starting at `huge` has no time: not read
    assert (row.name, row.count, row.max, row.total) == ("big", 2, 1000, 1000)
    assert fast.durations()[("big", "")] == [0, 1000]
    same(fast, slow)
