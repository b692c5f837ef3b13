"""mxprof.trace: loading traces (mxprof's, cut short, torch's, viztracer's) and analysing them."""

import bisect
import errno
import gzip
import json
import os
import threading
import zlib
from pathlib import Path

import pytest

import mxprof
from mxprof.errors import TraceFormatError, TraceReadError
from mxprof.trace import load, read_raw
from mxprof.trace.reader import salvage

MS = 1_000_000
ODD_NAME = 'q"uote \\ tab\t é ✓ 🎉 \x01'  # escapes and multi-byte characters to cut inside
SHUFFLED_MS = [i * 37 % 100 + 1 for i in range(100)]  # 1..100, out of order


def record(trace_file, clock):
    """Record a trace whose every time is known; returns the thread names' tids.

    Timeline (ms): w0 runs outer [0, 4] with inner [0, 1] and [2, 3], then a
    counter sample and a marker at 4; w1 runs outer [4, 10] with inner [4, 5]
    and [6, 9]; the main thread runs frame step [10, 11], then 'p' ranges of
    SHUFFLED_MS back to back, then ODD_NAME for 1 ms.
    """
    dom = mxprof.Domain("dom")
    outer, inner, p = dom.new_task("outer"), dom.new_task("inner"), dom.new_task("p")
    odd = dom.new_task(ODD_NAME)
    step = dom.new_frame("step")
    counter, marker = dom.new_counter("c", 0), dom.new_marker("mk")
    mxprof.set_config(filename=trace_file, aggregate_stats=True, profile_api=False)
    mxprof.set_state("run")

    def work(second_inner_ms):
        with outer:
            with inner:
                clock(1 * MS)
            clock(1 * MS)
            with inner:
                clock(second_inner_ms * MS)
            clock(1 * MS)
        if second_inner_ms == 1:
            counter.increment(3)
            marker.mark("thread")

    for name, ms in (("w0", 1), ("w1", 3)):
        # One thread at a time: the fake clock is shared, the timeline stays exact.
        t = threading.Thread(target=work, args=(ms,), name=name)
        t.start()
        t.join()
    with step:
        clock(1 * MS)
    for ms in SHUFFLED_MS:
        with p:
            clock(ms * MS)
    with odd:
        clock(1 * MS)
    mxprof.set_state("stop")
    mxprof.dump()
    raw = json.loads(Path(trace_file).read_text(encoding="utf-8"))["traceEvents"]
    return {e["args"]["name"]: e["tid"] for e in raw if e.get("name") == "thread_name"}


def stats():
    return json.loads(mxprof.dumps(format="json"))


def in_ms(item, *fields):
    """A row's or node's fields, times in ms (count as is)."""
    return tuple(getattr(item, f) if f == "count" else getattr(item, f) / MS for f in fields)


def row(trace, name):
    (found,) = [r for r in trace.key_averages() if r.name == name]
    return found


def test_statistics_equal_dumps_and_the_known_times(trace_file, clock):
    record(trace_file, clock)
    trace = load(trace_file)
    assert not trace.truncated and trace.unmatched == 0
    rows = {(r.category, r.name): r for r in trace.key_averages()}
    expected = {(cat, name) for cat, names in stats()["Time"].items() for name in names}
    assert set(rows) == expected
    for (cat, name), r in rows.items():
        s = stats()["Time"][cat][name]
        assert r.count == s["Count"]
        assert (r.total, r.min, r.max) == tuple(round(s[k] * MS) for k in ("Total", "Min", "Max"))
        assert round(r.avg) == round(s["Avg"] * MS)

    outer, inner, p = row(trace, "outer"), row(trace, "inner"), row(trace, "p")
    assert in_ms(outer, "count", "total", "self", "min", "max") == (2, 10, 4, 4, 6)
    assert in_ms(inner, "count", "total", "self", "min", "max") == (4, 6, 6, 1, 3)
    assert outer.avg == 5 * MS
    # Nearest rank: [4, 6] -> ranks 1, 2, 2; [1, 1, 1, 3] -> ranks 2, 4, 4; 1..100 -> 50, 90, 99.
    assert in_ms(outer, "p50", "p90", "p99") == (4, 6, 6)
    assert in_ms(inner, "p50", "p90", "p99") == (1, 3, 3)
    assert in_ms(p, "count", "total", "self") == (100, 5050, 5050)
    assert in_ms(p, "min", "p50", "p90", "p99", "max") == (1, 50, 90, 99, 100)
    assert row(trace, ODD_NAME).total == MS

    step = row(trace, "step")
    assert (step.category, step.count, step.total) == ("dom,frame", 1, MS)
    assert trace.key_averages()[0].name == "p"  # largest total first
    assert trace.table(sort_by="count", row_limit=1).splitlines()[3].startswith("p ")


def test_events_names_and_metadata_as_written(trace_file, clock):
    tids = record(trace_file, clock)
    trace = load(Path(trace_file))
    raw = json.loads(Path(trace_file).read_text(encoding="utf-8"))
    assert trace.path == trace_file
    assert trace.base_time_ns == raw["baseTimeNanoseconds"]
    assert trace.metadata == {k: v for k, v in raw.items() if k != "traceEvents"}
    assert trace.metadata["otherData"]["clock"] == "fake"
    assert set(tids) == {"w0", "w1", "MainThread"}
    assert set(trace.process_names) == {os.getpid()}
    assert len(trace) == sum(e["ph"] != "M" for e in raw["traceEvents"])
    assert all(e.ph != "M" for e in trace)

    w0 = [(e.name, e.ph, e.ts, e.dur) for e in trace if e.tid == tids["w0"]]
    assert w0 == [
        ("outer", "X", 0, 4 * MS),
        ("inner", "X", 0, MS),
        ("inner", "X", 2 * MS, MS),
        ("c", "C", 4 * MS, None),
        ("mk", "i", 4 * MS, None),
    ]
    (sample,) = trace.filter(name="c")
    assert sample.args == {"c": 3} and sample.end == sample.ts
    (frame,) = trace.filter(name="step")
    assert (frame.ts, frame.end, frame.args) == (10 * MS, 11 * MS, {"frame": 0})
    assert trace[1:3] == trace.events[1:3] and trace[-1] == trace.events[-1]


def test_gzip_and_array_forms_load_identically(trace_file, clock, tmp_path):
    record(trace_file, clock)
    plain = load(trace_file)
    packed = tmp_path / "trace.data"  # gzip is known by its magic bytes, not its name
    packed.write_bytes(gzip.compress(Path(trace_file).read_bytes()))
    from_gzip = load(packed)
    assert from_gzip.events == plain.events
    assert from_gzip.metadata == plain.metadata and not from_gzip.truncated
    assert from_gzip.key_averages() == plain.key_averages()

    raw_events, metadata, _ = read_raw(trace_file)
    assert raw_events == json.loads(Path(trace_file).read_text(encoding="utf-8"))["traceEvents"]
    array = tmp_path / "array.json"
    array.write_text(json.dumps(raw_events), encoding="utf-8")
    from_array = load(array)
    assert from_array.events == plain.events and from_array.metadata == {}
    assert from_array.thread_names == plain.thread_names
    assert from_array.key_averages() == plain.key_averages()
    assert str(from_array.tree()) == str(plain.tree())


def event_ends(data):
    """Byte offsets just past each event's '}' in an mxprof file (one event per line)."""
    ends, pos = [], 0
    for i, line in enumerate(data.split(b"\n")):
        if i > 0 and line.startswith(b"{"):
            ends.append(pos + len(line.rstrip(b",")))
        pos += len(line) + 1
    return ends


def test_cut_files_load_exactly_the_events_before_the_cut(trace_file, clock, tmp_path):
    record(trace_file, clock)
    data = Path(trace_file).read_bytes()
    full, full_metadata, truncated = read_raw(trace_file)
    assert not truncated
    ends = event_ends(data)
    assert len(ends) == len(full)
    cut = tmp_path / "cut.json"
    # Every 37 bytes lands inside names, numbers, escapes, UTF-8 and the trailer;
    # end + 2 is a crashed writer's file: whole event lines, no closing.
    offsets = sorted(set(range(1, len(data), 37)) | {end + 2 for end in ends})
    head = data.index(b"\n") + 1  # the core's head: whose file it is shows once it is whole
    for n in offsets:
        cut.write_bytes(data[:n])
        expected = full[: bisect.bisect_right(ends, n)]
        if n < head:
            with pytest.raises(TraceFormatError, match="cut.json: .*cut short"):
                read_raw(cut)
            assert salvage(cut)[0] == expected, n
            continue
        events, metadata, truncated = read_raw(cut)
        assert truncated, n
        assert events == expected, n
        assert all(metadata[k] == full_metadata[k] for k in metadata), n
        trace = load(cut)
        assert trace.truncated and len(trace) == sum(e["ph"] != "M" for e in events), n
    assert len(offsets) > 300
    # Only complete members are kept: never a number cut short.
    cut.write_bytes(data[: data.index(b'"baseTimeNanoseconds":') + 30])
    assert "baseTimeNanoseconds" not in salvage(cut)[1]

    # A crash can also leave never-written (zero) blocks at the end.
    cut.write_bytes(data[: ends[5] + 2] + b"\0" * 4096)
    events, _, truncated = read_raw(cut)
    assert truncated and events == full[:6]


def test_cut_gzip_loads_what_decompresses(trace_file, clock, tmp_path):
    record(trace_file, clock)
    data = Path(trace_file).read_bytes()
    full, _, _ = read_raw(trace_file)
    ends = event_ends(data)
    packed = gzip.compress(data)
    cut = tmp_path / "cut.gz"
    for n in range(1, len(packed), 7):
        cut.write_bytes(packed[:n])
        text_length = len(zlib.decompressobj(wbits=31).decompress(packed[:n]))
        expected = full[: bisect.bisect_right(ends, text_length)]
        if text_length < data.index(b"\n") + 1:  # inside the core's head: whose file?
            with pytest.raises(TraceFormatError, match="cut.gz: the gzip stream ends inside"):
                read_raw(cut)
            assert salvage(cut)[0] == expected, n
            continue
        events, _, truncated = read_raw(cut)
        assert truncated, n
        assert events == expected, n
    cut.write_bytes(packed)
    assert read_raw(cut) == (full, read_raw(trace_file)[1], False)


def test_damage_is_an_error_naming_file_and_line(trace_file, clock, tmp_path):
    record(trace_file, clock)
    damaged = tmp_path / "damaged.json"
    damaged.write_bytes(Path(trace_file).read_bytes().replace(b'"ph":"X"', b'"ph":X"', 1))
    with pytest.raises(TraceFormatError, match=r"damaged\.json: not valid JSON at line \d+ column"):
        load(damaged)


def test_filter_by_name_category_thread_and_time(trace_file, clock):
    tids = record(trace_file, clock)
    trace = load(trace_file)

    assert [e.name for e in trace.filter(name="inner")] == ["inner"] * 4
    assert len(trace.filter(name={"inner", "outer"})) == 6
    assert [e.name for e in trace.filter(category="dom,frame")] == ["step"]
    assert len(trace.filter(category=["dom"], name="p")) == 100
    assert trace.filter(category="frame").events == []  # categories match whole

    by_name = trace.filter(thread="w1")
    assert [(e.name, e.dur) for e in by_name] == [
        ("outer", 6 * MS),
        ("inner", MS),
        ("inner", 3 * MS),
    ]
    assert trace.filter(thread=tids["w1"]).events == by_name.events
    assert by_name.thread_names is trace.thread_names and by_name.metadata is trace.metadata

    window = trace.filter(start=2.5 * MS, end=4.5 * MS)
    assert sorted((e.name, e.ts) for e in window) == [
        ("c", 4 * MS),
        ("inner", 2 * MS),
        ("inner", 4 * MS),
        ("mk", 4 * MS),
        ("outer", 0),
        ("outer", 4 * MS),
    ]
    # Bounds are inclusive: a range ending at start, an instant at end, both stay.
    assert {e.name for e in trace.filter(thread="w0", start=MS, end=MS)} == {"outer", "inner"}
    assert {e.name for e in trace.filter(thread="w0", start=4 * MS)} == {"outer", "c", "mk"}

    # Self times are the whole trace's: filtering children out does not change them.
    assert row(trace.filter(name="outer"), "outer").self == 4 * MS
    with pytest.raises(TypeError, match="name"):
        trace.filter(name=[1])


def test_tree_of_the_known_nesting(trace_file, clock):
    tids = record(trace_file, clock)
    trace = load(trace_file)
    tree = trace.tree()
    pid = os.getpid()
    (w0_outer,) = tree.roots[(pid, tids["w0"])]
    (w1_outer,) = tree.roots[(pid, tids["w1"])]
    assert (w0_outer.name, w1_outer.name) == ("outer", "outer")
    assert in_ms(w0_outer, "count", "total", "self") == (1, 4, 2)
    assert in_ms(w1_outer, "count", "total", "self") == (1, 6, 2)
    w0_inner, w1_inner = w0_outer.child("inner"), w1_outer.child("inner")
    assert in_ms(w0_inner, "count", "total", "self") == (2, 2, 2) and w0_inner.children == []
    assert in_ms(w1_inner, "count", "total", "self") == (2, 4, 4)
    main = tree.roots[(pid, tids["MainThread"])]
    assert [(n.name, n.count, n.total) for n in main] == [
        ("step", 1, MS),
        ("p", 100, 5050 * MS),
        (ODD_NAME, 1, MS),
    ]

    lines = [" ".join(line.split()) for line in str(tree).splitlines()]
    at = lines.index(f"w0 (pid {pid}, tid {tids['w0']})")
    assert lines[at + 1 : at + 3] == [
        "outer count 1 total 4.000ms self 2.000ms",
        "inner count 2 total 2.000ms self 2.000ms",
    ]
    assert str(tree).splitlines()[at + 2].startswith("    inner")

    # Filtered out ranges are spliced out of the tree: inner moves to the top.
    (only_inner,) = trace.filter(name="inner", thread="w0").tree().roots.values()
    assert [(n.name, n.count) for n in only_inner] == [("inner", 2)]


def test_begin_end_and_async_pairs_and_other_phases(tmp_path):
    path = tmp_path / "chrome.json"
    pid = 1
    raw = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": "gpu", "args": {"name": "stream 7"}},
        {"ph": "B", "name": "a", "cat": "c", "ts": 0, "pid": pid, "tid": "gpu", "args": {"x": 1}},
        {"ph": "B", "name": "b", "cat": "c", "ts": 1, "pid": pid, "tid": "gpu"},
        {"ph": "E", "ts": 3, "pid": pid, "tid": "gpu", "args": {"y": 2}},
        {"ph": "E", "ts": 10, "pid": pid, "tid": "gpu"},
        {"ph": "E", "ts": 11, "pid": pid, "tid": "gpu"},  # closes nothing
        {"ph": "B", "name": "never_closed", "ts": 12, "pid": pid, "tid": "gpu"},
        {"ph": "b", "name": "req", "cat": "net", "id": "0x1", "ts": 2, "pid": pid, "tid": 5},
        {"ph": "b", "name": "req", "cat": "net", "id": "0x2", "ts": 4, "pid": pid, "tid": 6},
        {"ph": "e", "name": "req", "cat": "net", "id": "0x1", "ts": 7.5, "pid": pid, "tid": 7},
        {"ph": "e", "name": "req", "cat": "net", "id": "0x2", "ts": 9, "pid": pid, "tid": 6},
        {"ph": "X", "name": "no_dur", "ts": 20, "pid": pid, "tid": 5},
        {"ph": "I", "name": "tick", "ts": 21, "pid": pid, "tid": 5, "s": "t"},
        {"ph": "C", "name": "mem", "ts": 22, "pid": pid, "args": {"bytes": 10}},
        {"ph": "s", "name": "flow", "id": 1, "ts": 1, "pid": pid, "tid": 5},  # flows: not kept
        {"ph": "X", "name": "no_ts", "dur": 1, "pid": pid, "tid": 5},
        {"ph": "X", "name": "kineto", "ts": 4385908729271.476, "dur": 0.061, "pid": pid, "tid": 9},
    ]
    path.write_text(json.dumps({"traceEvents": raw, "otherData": {}}), encoding="utf-8")
    trace = load(path)
    assert trace.unmatched == 2
    got = {(e.name, e.tid): (e.ph, e.ts, e.dur, e.category, e.args) for e in trace}
    assert got == {
        ("a", "gpu"): ("X", 0, 10_000, "c", {"x": 1}),
        ("b", "gpu"): ("X", 1_000, 2_000, "c", {"y": 2}),
        ("req", 5): ("X", 2_000, 5_500, "net", {}),
        ("req", 6): ("X", 4_000, 5_000, "net", {}),
        ("no_dur", 5): ("X", 20_000, 0, "", {}),
        ("tick", 5): ("i", 21_000, None, "", {}),
        ("mem", 0): ("C", 22_000, None, "", {"bytes": 10}),
        # Exact to the ns although the float in the file is not exactly this.
        ("kineto", 9): ("X", 4385908729271476, 61, "", {}),
    }
    assert row(trace, "a").self == 8_000 and row(trace, "b").self == 2_000
    assert [e.name for e in trace.filter(thread="stream 7")] == ["a", "b"]
    assert trace.base_time_ns is None


def test_torch_profiler_trace(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.ones(8, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            with record_function("my_block"):
                (x @ x + 1).sum()
    path = tmp_path / "torch_trace.json"
    prof.export_chrome_trace(str(path))

    trace = load(path)
    assert not trace.truncated and trace.unmatched == 0
    block = row(trace, "my_block")
    assert (block.count, block.category) == (5, "user_annotation")
    raw = [e for e in read_raw(path)[0] if e.get("name") == "my_block"]
    assert abs(block.total - sum(e["dur"] * 1000 for e in raw)) <= 5
    assert trace.base_time_ns == trace.metadata["baseTimeNanoseconds"]

    (event,) = trace.filter(name="my_block")[:1]
    thread = (event.pid, event.tid)
    roots = trace.tree().roots[thread]
    # Every op ran inside a my_block: one root, the ops beneath it.
    assert [(n.name, n.count) for n in roots] == [("my_block", 5)]
    ops = {n.name: n for n in roots[0].children}
    assert {"aten::matmul", "aten::add", "aten::sum"} <= set(ops)
    assert ops["aten::matmul"].count == 5 and ops["aten::matmul"].child("aten::mm").count == 5
    assert roots[0].self == block.self < block.total
    assert len(trace.filter(thread=trace.thread_names[thread], name="my_block")) == 5


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def fib_three_times():
    total = 0
    for _ in range(3):
        total += fib(5)
    return total


def test_viztracer_trace(tmp_path):
    viztracer = pytest.importorskip("viztracer")
    path = tmp_path / "viz.json"
    tracer = viztracer.VizTracer(output_file=str(path), verbose=0, tracer_entries=10_000)
    tracer.start()
    fib_three_times()
    tracer.stop()
    tracer.save()

    trace = load(path)
    counts = {r.name.split(" ")[0]: r.count for r in trace.key_averages()}
    assert counts["fib"] == 3 * 15  # fib(5) makes 15 calls
    assert counts["fib_three_times"] == 1
    assert trace.base_time_ns == trace.metadata["viztracer_metadata"]["baseTimeNanoseconds"]

    (top,) = [n for nodes in trace.tree().roots.values() for n in nodes if "fib_three" in n.name]
    depths = []
    node = top
    while node.children:
        (node,) = node.children
        depths.append(node.count)
    assert depths == [3, 6, 12, 18, 6]  # calls of fib(5) at each depth, three times


def test_errors_name_the_file(tmp_path):
    with pytest.raises(TraceReadError, match="nope.json: cannot read") as missing:
        load(tmp_path / "nope.json")
    assert missing.value.errno == errno.ENOENT
    cases = {
        "empty.json": (b"", "empty"),
        "blank.json": (b" \n\t", "empty"),
        "text.json": (b"hello, world", "not JSON"),
        "html.json": (b"<html></html>", "not JSON"),
        "braces.json": (b"{hello}", "not valid JSON at line 1 column 2"),
        "object.json": (b'{"a": 1}', "no 'traceEvents'"),
        "number.json": (b"42", "top level is a number"),
        "numbers.json": (b"[1, 2]", "event 0 is a number"),
        "mixed.json": (b'[{"ph": "i", "ts": 0}, "x"]', "event 1 is a string"),
        "events.json": (b'{"traceEvents": {}}', "'traceEvents' is an object"),
        "cut_numbers.json": (b"[1, 2", "event 0 is a number"),
        "gzipped.bin": (gzip.compress(b"hello"), "not JSON"),
    }
    for name, (content, problem) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(TraceFormatError) as info:
            load(path)
        assert str(path) in str(info.value) and problem in str(info.value), name
