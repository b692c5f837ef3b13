"""NVIDIA profiler databases (nvprof/nvvp and Nsight Systems SQLite) read as traces:
GPU work on device/stream tracks tied to the NVTX range that launched it,
calls and ranges on their CPU threads, flows, the per-range GPU table, clock
alignment with an mxprof trace, and a clear error for every kind of bad file."""

import collections
import contextlib
import io
import json
import os
import random
import sqlite3
import subprocess
import sys
import textwrap

import pytest

import mxprof
from mxprof import cli
from mxprof.trace import nvidia
from mxprof.trace.gpu import GpuRow, align, gpu_rows, gpu_table

sys.path.insert(0, os.path.dirname(__file__))
import _nvidia_dbs as dbs  # noqa: E402

GPU = nvidia.GPU_PID_BASE
BUILDERS = {"nsys": dbs.nsys, "nvprof": dbs.nvprof}


@pytest.fixture(params=["nsys", "nvprof"])
def database(request, tmp_path):
    return BUILDERS[request.param](str(tmp_path / f"{request.param}.sqlite"))


def gpu_events(trace):
    return [e for e in trace if e.category in ("cuda_kernel", "cuda_memcpy", "cuda_memset")]


def short(name):
    """The kernel's base name from either schema's (demangled or plain) name."""
    return name.removeprefix("void ").split("<")[0]


def run_cli(*argv):
    out = io.StringIO()
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_every_unit_of_gpu_work_is_tied_to_its_launch_and_innermost_range(database):
    """pyprof's rule: nested ranges, a range closed on another thread (it belongs to the
    thread that opened it), a range never closed, a call straddling a range's end, a
    driver launch, work launched outside every range and work with no call at all."""
    trace = mxprof.load(database)
    work = gpu_events(trace)
    assert sorted(e.args["correlation_id"] for e in work) == sorted(dbs.EXPECTED)
    by_corr = {e.args["correlation_id"]: e for e in work}
    for corr, (ranges, launch) in dbs.EXPECTED.items():
        e = by_corr[corr]
        assert e.args.get("launch") == launch, corr
        if ranges:
            assert e.args["range"] == ranges[-1], corr
            assert e.args["ranges"] == ranges, corr
        else:
            assert "range" not in e.args and "ranges" not in e.args, corr
    for kind, name, start, end, device, stream, corr, size in dbs.WORK:
        e = by_corr[corr]
        assert e.category == f"cuda_{kind}"
        assert (e.pid, e.tid) == (GPU + device, stream)  # one track per device and stream
        assert e.dur == end - start
        if kind == "kernel":
            assert short(e.name) == name
            assert e.args["grid"] == [8, 1, 1] and e.args["block"] == [128, 1, 1]
        else:
            assert e.name == name and e.args["bytes"] == size
    assert trace.process_names[GPU] == "GPU 0" and trace.process_names[GPU + 1] == "GPU 1"
    assert trace.thread_names[(GPU, 7)] == "stream 7"
    assert trace.thread_names[(GPU, 13)] == "stream 13"


def test_a_range_encloses_a_call_only_strictly():
    """pyprof's comparisons: opened before the call began and closed after it ended;
    a range opened or closed at the very ns of the call's ends does not enclose it."""
    from mxprof.trace._nvidia_db import Call, Database, Range
    from mxprof.trace._nvidia_events import enclosing_ranges

    db = Database("nsys", None, None, 0)
    db.ranges = [
        Range("outer", 0, 100, 1, 1, 1, 1),
        Range("same_start", 10, 50, 1, 1, 1, 1),
        Range("same_end", 5, 30, 1, 1, 1, 1),
        Range("other_thread", 0, 100, 1, 2, 1, 2),
        Range("open", 1, None, 1, 1, 1, 1),
    ]
    call = Call("runtime", "cudaLaunchKernel", 10, 30, 1, 1, 7)
    db.calls = [call]
    assert [r.name for r in enclosing_ranges(db)[id(call)]] == ["outer", "open"]


def test_calls_ranges_and_marks_are_on_their_cpu_threads(database):
    trace = mxprof.load(database)
    calls = [e for e in trace if e.category in ("cuda_runtime", "cuda_driver")]
    got = sorted((e.args["correlation_id"], e.category, e.name, e.pid, e.tid, e.dur) for e in calls)
    want = sorted(
        (corr, f"cuda_{api}", name, dbs.PID, tid, end - start)
        for api, name, start, end, tid, corr in dbs.CALLS
    )
    assert got == want
    ranges = {e.name: e for e in trace if e.category == "nvtx" and e.ph == "X"}
    for name, _, _, tid, _, _ in dbs.RANGES:
        assert (ranges[name].pid, ranges[name].tid) == (dbs.PID, tid)
    assert ranges["prefetch"].args["end_tid"] == dbs.MAIN  # closed on another thread
    assert ranges["tail"].args["cut_short"] is True  # never closed: open to the capture's end
    assert ranges["tail"].end == max(e.end for e in trace)
    # Nested ranges nest: the call tree of the main thread.
    parents = {e.name: e for e in trace.filter(thread=dbs.MAIN)}
    assert parents["attention"].ts >= parents["forward"].ts
    assert parents["attention"].end <= parents["forward"].end
    [mark] = [e for e in trace if e.ph == "i"]
    assert (mark.name, mark.pid, mark.tid) == ("checkpoint", dbs.PID, dbs.MAIN)
    assert mark.category == "nvtx"
    step = ranges["step"]
    assert mark.ts - step.ts == 8500 - 1000  # one axis for CPU and GPU


def test_times_and_names(tmp_path):
    """Nsight: ts 0 is the session start, its UTC time the base; thread and process
    names from ThreadNames and PROCESSES.  nvprof: ts 0 is the earliest record."""
    trace = mxprof.load(dbs.nsys(str(tmp_path / "a.sqlite")))
    assert trace.base_time_ns == dbs.T0
    assert trace.metadata["otherData"]["nvidia"]["schema_version"] == "3.17.2"
    step = next(e for e in trace if e.name == "step")
    assert step.ts == 1000
    assert trace.thread_names[(dbs.PID, dbs.MAIN)] == "MainThread"
    assert trace.thread_names[(dbs.PID, dbs.LOADER)] == "loader"
    assert trace.process_names[dbs.PID] == "python"
    forward = next(e for e in trace if e.name == "forward")
    assert forward.args["domain"] == "train"  # NVTX domain from its NvtxDomainCreate row
    trace = mxprof.load(dbs.nvprof(str(tmp_path / "b.sqlite")))
    assert trace.base_time_ns == dbs.T0 + 1000 and step.ts - 1000 == 0
    assert next(e for e in trace if e.name == "step").ts == 0
    assert trace.metadata["otherData"]["nvidia"]["source"] == "nvprof"


def test_the_serialized_kernel_table_of_nvprof_is_read_too(tmp_path):
    path = dbs.nvprof(str(tmp_path / "s.sqlite"), kernel_table="CUPTI_ACTIVITY_KIND_KERNEL")
    work = {e.args["correlation_id"]: e.args.get("range") for e in gpu_events(mxprof.load(path))}
    assert work[2] == "attention" and work[4] == "prefetch" and work[99] is None


def test_schema_variants(tmp_path):
    """The export's own copy-kind names (ENUM_CUDA_MEMCPY_OPER); GPU records without a
    globalPid, joined to their call by correlation id alone; an nvprof file holding
    both kernel tables (the concurrent one is read, nothing twice)."""
    path = dbs.nsys(str(tmp_path / "e.sqlite"))
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER, name TEXT, label TEXT)")
        db.execute("INSERT INTO ENUM_CUDA_MEMCPY_OPER VALUES (1, 'HTOD', 'Host-to-Device')")
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = NULL")
    work = {e.args["correlation_id"]: e for e in gpu_events(mxprof.load(path))}
    assert work[5].name == "Memcpy Host-to-Device" and work[5].args["copy_kind"] == "Host-to-Device"
    assert work[2].args["range"] == "attention" and work[4].args["range"] == "prefetch"
    path = dbs.nvprof(str(tmp_path / "k.sqlite"))
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL AS "
            "SELECT * FROM CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL"
        )
    kernels = [e for e in mxprof.load(path) if e.category == "cuda_kernel"]
    assert len(kernels) == sum(1 for w in dbs.WORK if w[0] == "kernel")


def test_flows_go_from_each_launching_call_to_its_gpu_work(database):
    events, _, _ = nvidia.read_raw(database)
    starts = {e["id"]: e for e in events if e.get("ph") == "s"}
    finishes = {e["id"]: e for e in events if e.get("ph") == "f"}
    assert starts.keys() == finishes.keys()
    assert len(starts) == len(dbs.EXPECTED) - 1  # not the work whose id no call has
    calls = {c[5]: c for c in dbs.CALLS}
    work = {w[6]: w for w in dbs.WORK}
    origin = 0 if "nsys" in database else 1000
    for flow_id, s in starts.items():
        corr = flow_id & 0xFFFFFFFF
        f = finishes[flow_id]
        assert s["cat"] == f["cat"] == "cuda_flow" and f["bp"] == "e"
        _, _, start, end, tid, _ = calls[corr]
        assert (s["pid"], s["tid"]) == (dbs.PID, tid)
        assert start < s["ts"] * 1000 + origin < end  # inside the call's slice
        _, _, wstart, wend, device, stream, _, _ = work[corr]
        assert (f["pid"], f["tid"]) == (GPU + device, stream)
        assert wstart < f["ts"] * 1000 + origin < wend  # inside the kernel's slice


EXPECTED_ROWS = {
    # range: (kernels, count, total ns, copies, bytes, memsets)
    "forward": (2, 3, 1000 + 1000 + 50, 0, 0, 0),
    "(no range)": (2, 2, 1000 + 100, 0, 0, 0),
    "backward": (1, 1, 500, 1, 4096, 1),
    "attention": (1, 1, 500, 0, 0, 0),
    "prefetch": (1, 1, 100, 0, 0, 0),
    "tail": (1, 1, 100, 0, 0, 0),
}


def test_gpu_work_per_range(database):
    rows = gpu_rows(mxprof.load(database))
    got = {r.range: (r.kernels, r.count, r.total, r.copies, r.bytes, r.memsets) for r in rows}
    assert got == EXPECTED_ROWS
    assert [r.range for r in rows] == list(EXPECTED_ROWS)  # most kernel time first
    forward = rows[0]
    assert (forward.min, forward.max, forward.avg) == (50, 1000, 2050 / 3)
    assert sum(r.total for r in rows) == sum(
        w[3] - w[2] for w in dbs.WORK if w[0] == "kernel"
    )  # each kernel counted once


def test_stats_prints_the_gpu_table_and_its_json(database):
    code, out, err = run_cli("stats", database)
    assert code == 0, err
    table = out.split("GPU work by launching range\n", 1)[1].splitlines()
    assert table[1].split() == ["Range", "Kernels", "Count", "Total", "Avg", "Copies", "Bytes"]
    rows = {line.split()[0]: line.split() for line in table[3:-1]}
    assert rows["forward"][1:3] == ["2", "3"] and rows["forward"][3] == "2.050us"
    assert rows["backward"][5:] == ["1", "4.0KiB"]
    assert rows["(no"][2:4] == ["2", "2"]  # "(no range)" is two words
    code, out, err = run_cli("stats", "--format", "json", database)
    assert code == 0, err
    doc = json.loads(out)
    gpu = doc["GPU"]
    assert gpu["Unit"] == {"Time": "ns", "Size": "B"}
    assert list(gpu["Ranges"]) == list(EXPECTED_ROWS)
    backward = gpu["Ranges"]["backward"]
    assert (backward["Count"], backward["Total"], backward["Copies"], backward["Bytes"]) == (
        1,
        500,
        1,
        4096,
    )
    assert (backward["Memsets"], backward["Memset Bytes"], backward["Copy Time"]) == (1, 256, 400)
    [(name, kernel)] = gpu["Ranges"]["attention"]["By Kernel"].items()
    assert short(name) == "softmax" and kernel == {"Count": 1, "Total": 500, "Avg": 500.0}
    assert {r["name"] for r in doc["rows"]} >= {"step", "forward", "cudaLaunchKernel"}
    code, out, _ = run_cli("stats", "--format", "json", "--top", "1", database)
    assert list(json.loads(out)["GPU"]["Ranges"]) == ["forward"]


def test_stats_of_an_ordinary_trace_has_no_gpu_table(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]))
    code, out, _ = run_cli("stats", str(path))
    assert code == 0 and "GPU work" not in out
    code, out, _ = run_cli("stats", "--format", "json", str(path))
    assert "GPU" not in json.loads(out)


def test_gpu_table_layout():
    row = GpuRow("fwd", 2, 3000, 1000, 2000, 1, 4096, 500, by_kernel={"k": [2, 3000]})
    lines = gpu_table([row, GpuRow("(no range)")]).splitlines()
    assert lines[0] == "GPU work by launching range"
    assert lines[2].split() == ["Range", "Kernels", "Count", "Total", "Avg", "Copies", "Bytes"]
    assert lines[4].split() == ["fwd", "1", "2", "3.000us", "1.500us", "1", "4.0KiB"]
    assert lines[5].split() == ["(no", "range)", "0", "0", "0ns", "0ns", "0", "0B"]
    assert len({len(line) for line in lines[1:]}) == 1  # aligned columns
    assert len(gpu_table([row, row], row_limit=1).splitlines()) == 6


def test_merge_puts_cpu_and_gpu_on_one_timeline_with_flows(database, tmp_path):
    out = tmp_path / "merged.json"
    code, _, err = run_cli("merge", database, "-o", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} >= {"X", "s", "f", "M", "i"}
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    base = os.path.basename(database)
    assert f"GPU 0 [{base}]" in names and f"GPU 1 [{base}]" in names
    merged = mxprof.load(out)
    by_corr = {e.args["correlation_id"]: e.args.get("range") for e in gpu_events(merged)}
    assert by_corr == {c: (r[-1] if r else None) for c, (r, _) in dbs.EXPECTED.items()}


def mxprof_trace(path, base, ranges):
    """A trace as mxprof writes it: its own ts axis (µs) and base, ranges by name."""
    events = [
        {"ph": "X", "cat": "train", "name": name, "ts": ts, "dur": dur, "pid": 77, "tid": 1}
        for name, ts, dur in ranges
    ]
    events.append({"ph": "M", "name": "process_name", "pid": 77, "tid": 0, "args": {"name": "py"}})
    doc = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base,
        "otherData": {"mxprof_version": mxprof.__version__, "pid": 77},
    }
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_merged_result_opens_in_perfetto(tmp_path):
    """Loaded by the Perfetto UI's own trace processor (tests/_perfetto_engine.py): no
    import error, the GPU tracks named, and every flow arrow from a launching call
    to the very work it launched."""
    import _perfetto_engine

    try:
        engine = _perfetto_engine.Engine.start()
    except _perfetto_engine.Unavailable as e:
        pytest.skip(str(e))
    try:
        for build in (dbs.nsys, dbs.nvprof):
            db = build(str(tmp_path / f"{build.__name__}.sqlite"))
            out = tmp_path / f"{build.__name__}.json"
            assert run_cli("merge", db, "-o", str(out))[0] == 0
            assert engine.load(out) == []
            problems = engine.query(
                "select name from stats where value > 0 and severity in ('error', 'data_loss')"
            )
            assert problems == []
            flows = engine.query(
                "select a.name call, b.name work from flow "
                "join slice a on flow.slice_out = a.id join slice b on flow.slice_in = b.id"
            )
            launched = [(c[1], w[1]) for c in dbs.CALLS for w in dbs.WORK if w[6] == c[5]]
            assert sorted((f["call"], short(f["work"])) for f in flows) == sorted(launched)
            tracks = engine.query(
                "select p.name process, t.name thread, count(*) n from slice s "
                "join thread_track tt on s.track_id = tt.id join thread t using (utid) "
                "join process p using (upid) where p.name like 'GPU%' group by 1, 2"
            )
            base = os.path.basename(db)
            assert {(r["process"], r["thread"], r["n"]) for r in tracks} == {
                (f"GPU 0 [{base}]", "stream 7", 8),
                (f"GPU 0 [{base}]", "stream 13", 2),
                (f"GPU 1 [{base}]", "stream 7", 1),
            }
    finally:
        engine.close()


def test_merge_aligns_a_database_on_the_mxprof_trace_of_the_same_run(tmp_path):
    """The database's NVTX ranges are the mxprof trace's ranges (set_config(nvtx=True)):
    matched by name and order, they fix the clock even when the two wall clocks
    disagree by 3 ms (mxprof's base says the run began 3 ms later than Nsight's)."""
    db = dbs.nsys(str(tmp_path / "run.sqlite"))
    # mxprof's ts axis: step at 10 µs, forward 11, attention 12, backward 18 -- each
    # 9 µs after the database's times on its own axis.
    shift_us = 9
    ranges = [(n, s / 1000 + shift_us, (e - s) / 1000) for n, s, e, *_ in dbs.RANGES if e]
    trace = mxprof_trace(tmp_path / "run.json", dbs.T0 + 3_000_000, ranges)
    out = tmp_path / "merged.json"
    code, _, err = run_cli("merge", trace, db, "-o", str(out))
    assert code == 0, err
    merged = mxprof.load(out)
    ours = {e.name: e.ts for e in merged if e.category == "train"}
    theirs = {e.name: e.ts for e in merged if e.category == "nvtx" and e.dur is not None}
    for name in ("step", "forward", "attention", "backward"):
        assert theirs[name] == ours[name], name
    kernel = next(e for e in merged if e.args.get("correlation_id") == 2)
    assert kernel.ts - ours["attention"] == 3400 - 3000  # GPU work moved with its ranges


def test_merge_aligns_a_database_on_a_recorded_mxprof_trace(tmp_path, clock):
    """The same with a trace mxprof recorded: three steps of varying length; the
    database (as Nsight would have seen the NVTX ranges nvtx=True emits) holds
    them on its own clock, 7 ms off the trace's by wall clock, and a kernel
    launched in the second forward lands inside that forward."""
    from mxprof import _testing

    trace_path = tmp_path / "run.json"
    _testing.start(trace_path)
    train = mxprof.Domain("train")
    step, forward = train.new_task("step"), train.new_task("forward")
    for length in (300_000, 500_000, 200_000):
        with step:
            clock(10_000)
            with forward:
                clock(length)
            clock(20_000)
        clock(50_000)
    _testing.finish(trace_path)
    recorded = mxprof.load(trace_path)
    ours = [e for e in recorded if e.category == "train"]
    assert len(ours) == 6
    start = 123_456_789  # where the run lies on the database's own axis
    first = min(e.ts for e in ours)
    at = start - first  # a trace ts -> the database's ts
    ranges = [(e.name, e.ts + at, e.end + at, dbs.MAIN, dbs.MAIN, True) for e in ours]
    second = sorted((e for e in ours if e.name == "forward"), key=lambda e: e.ts)[1]
    launch = second.ts + at + 1000
    calls = [("runtime", "cudaLaunchKernel", launch, launch + 500, dbs.MAIN, 1)]
    work = [("kernel", "gemm", launch + 2000, launch + 9000, 0, 7, 1, None)]
    db = dbs.nsys(
        str(tmp_path / "run.sqlite"),
        ranges=ranges,
        calls=calls,
        work=work,
        marks=[],
        base=recorded.base_time_ns - start + first + 7_000_000,
    )
    out = tmp_path / "merged.json"
    code, _, err = run_cli("merge", str(trace_path), db, "-o", str(out))
    assert code == 0, err
    merged = mxprof.load(out)
    ours = sorted((e.ts, e.name) for e in merged if e.category == "train")
    theirs = sorted((e.ts, e.name) for e in merged if e.category == "nvtx")
    assert ours == theirs
    [kernel] = [e for e in merged if e.category == "cuda_kernel"]
    forward_2 = [ts for ts, name in ours if name == "forward"][1]
    assert kernel.args["range"] == "forward"
    assert kernel.ts - forward_2 == 1000 + 2000


def test_align_pairs_names_in_order_and_reports_the_spread():
    db = [{"ph": "X", "cat": "nvtx", "name": "step", "ts": t, "dur": 1} for t in (100, 200, 300)]
    db.append({"ph": "X", "cat": "nvtx", "name": "only_here", "ts": 5, "dur": 1})
    ours = [{"ph": "X", "cat": "d", "name": "step", "ts": t, "dur": 1} for t in (10, 110, 211)]
    found = align(db, ours)
    assert (found.offset_ns, found.pairs, found.spread_ns) == (90_000, 3, 1000)
    assert align(db, [{"ph": "X", "cat": "d", "name": "other", "ts": 1}]) is None


def test_align_finds_a_part_of_the_run_by_the_spacing_of_its_ranges():
    """mxprof recorded steps 3-5 of 8 (a schedule), the database all of them: every
    step is a 'step' with a 'forward', so only the steps' differing lengths say
    which database step is the trace's first."""
    lengths = [1000, 1300, 900, 1700, 1100, 1500, 1200, 1000]  # µs
    begins = [sum(lengths[:k]) for k in range(len(lengths))]
    db = []
    for t in begins:
        db.append({"ph": "X", "cat": "nvtx", "name": "step", "ts": t, "dur": 50})
        db.append({"ph": "X", "cat": "nvtx", "name": "forward", "ts": t + 100, "dur": 20})
    ours = []
    for t in begins[3:6]:
        ours.append({"ph": "X", "cat": "d", "name": "step", "ts": t - begins[3] + 50, "dur": 50})
        ours.append({"ph": "X", "cat": "d", "name": "forward", "ts": t - begins[3] + 150})
    found = align(db, ours)
    assert (found.offset_ns, found.pairs, found.spread_ns) == ((begins[3] - 50) * 1000, 6, 0)


def test_reading_a_database_loads_nothing_live(tmp_path):
    """The offline tier: stats and merge of a database start no session."""
    db = dbs.nsys(str(tmp_path / "a.sqlite"))
    code = """
        import contextlib, io, json, sys
        from mxprof import cli
        quiet = contextlib.redirect_stdout(io.StringIO())
        with quiet, contextlib.redirect_stderr(io.StringIO()):
            codes = [cli.main(["stats", sys.argv[1]])]
            codes.append(cli.main(["merge", sys.argv[1], "-o", "m.json"]))
        modules = sorted(m for m in sys.modules if m.startswith("mxprof"))
        print(json.dumps({"codes": codes, "modules": modules}))
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), db],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["codes"] == [0, 0]
    assert "mxprof._native" not in out["modules"] and "mxprof._session" not in out["modules"]


def test_the_report_reads_a_database(database, tmp_path):
    pytest.importorskip("plotly")
    out = tmp_path / "r.html"
    code, _, err = run_cli("report", database, "-o", str(out))
    assert code == 0, err
    assert "forward" in out.read_text(encoding="utf-8")


# Bad input: each a TraceFormatError naming the file and what is wrong, never a crash.


def expect_error(path, *fragments):
    with pytest.raises(mxprof.TraceFormatError) as info:
        mxprof.load(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    code, _, err = run_cli("stats", str(path))
    assert code == 2 and "Traceback" not in err and fragments[0] in err
    return message


def test_an_sqlite_file_of_neither_kind(tmp_path):
    path = tmp_path / "other.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE recipes (name TEXT)")
    db.commit()
    db.close()
    expect_error(path, "neither an nvprof/nvvp database", "recipes")


def test_a_database_cut_short(database):
    size = os.path.getsize(database)
    with open(database, "r+b") as f:
        f.truncate(size // 2)
    expect_error(database, "cut short", f"{size // 2} bytes")


def test_a_database_with_damaged_pages(tmp_path):
    path = dbs.nsys(str(tmp_path / "d.sqlite"))
    with open(path, "rb") as f:
        data = bytearray(f.read())
    for i in range(4096, len(data), 7):  # every page after the first, scrambled
        data[i] = (data[i] * 31 + 17) & 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(mxprof.TraceFormatError) as info:
        mxprof.load(path)
    assert path in str(info.value)


def test_a_file_named_sqlite_that_is_not_one(tmp_path):
    path = tmp_path / "x.sqlite"
    path.write_text('{"traceEvents": []}')
    expect_error(path, "not an SQLite database")
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    expect_error(empty, "not an SQLite database")


def test_an_unknown_export_schema_version(tmp_path):
    path = dbs.nsys(str(tmp_path / "v.sqlite"), version="4.0.0")
    expect_error(path, "META_DATA_EXPORT.value", "'4.0.0'", "3.x")
    path = dbs.nsys(str(tmp_path / "w.sqlite"), version="next")
    expect_error(path, "META_DATA_EXPORT.value", "'next'")


def test_string_ids_that_do_not_resolve(tmp_path):
    path = dbs.nsys(str(tmp_path / "s.sqlite"))
    with sqlite3.connect(path) as db:
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 999")
    expect_error(path, "CUPTI_ACTIVITY_KIND_KERNEL.demangledName", "string id 999", "StringIds")
    path = dbs.nsys(str(tmp_path / "t.sqlite"))
    with sqlite3.connect(path) as db:
        db.execute("UPDATE NVTX_EVENTS SET textId = 555, text = NULL WHERE eventType = 59")
    expect_error(path, "NVTX_EVENTS.textId", "string id 555")
    path = dbs.nvprof(str(tmp_path / "u.sqlite"))
    with sqlite3.connect(path) as db:
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL SET name = 777")
    expect_error(path, "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL.name", "string id 777", "StringTable")


def test_a_missing_column_or_a_value_of_the_wrong_type(tmp_path):
    path = dbs.nsys(str(tmp_path / "c.sqlite"))
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME DROP COLUMN correlationId")
    expect_error(path, "table CUPTI_ACTIVITY_KIND_RUNTIME has no column 'correlationId'")
    path = dbs.nsys(str(tmp_path / "t.sqlite"))
    with sqlite3.connect(path) as db:
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE correlationId = 1")
    expect_error(path, "CUPTI_ACTIVITY_KIND_KERNEL.start", "expected an integer", "'soon'")
    path = dbs.nvprof(str(tmp_path / "o.sqlite"))
    with sqlite3.connect(path) as db:
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_MARKER SET objectId = x'0102'")
    expect_error(path, "CUPTI_ACTIVITY_KIND_MARKER.objectId", "12 bytes")


def test_merge_names_a_bad_database(tmp_path):
    good = dbs.nsys(str(tmp_path / "good.sqlite"))
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00" * 10)
    code, _, err = run_cli("merge", good, str(bad), "-o", str(tmp_path / "m.json"))
    assert code == 2 and "bad.sqlite" in err and "cut short" in err


def test_repair_never_writes_over_a_database(tmp_path):
    """The reader takes databases, so repair would have rewritten one as JSON in place."""
    db = dbs.nsys(str(tmp_path / "run.sqlite"))
    with open(db, "rb") as f:
        before = f.read()
    code, _, err = run_cli("repair", db)
    assert code == 2 and "NVIDIA profiler database" in err and "-o" in err
    with open(db, "rb") as f:
        assert f.read() == before
    code, _, err = run_cli("repair", db, "-o", str(tmp_path / "run.json"))
    assert code == 0, err
    assert len(gpu_events(mxprof.load(tmp_path / "run.json"))) == len(dbs.WORK)


def test_damaged_databases_raise_trace_format_errors_only(tmp_path):
    """Bytes changed at random (seeded) in both kinds of database: each file reads or
    raises TraceFormatError naming it -- never another exception (before, a text cell
    that was not UTF-8 escaped as UnicodeDecodeError)."""
    rng = random.Random(15)
    outcomes = collections.Counter()
    for build in (dbs.nsys, dbs.nvprof):
        with open(build(str(tmp_path / f"{build.__name__}.sqlite")), "rb") as f:
            data = f.read()
        for n in range(60):
            damaged = bytearray(data)
            for _ in range(rng.choice((1, 4, 32))):
                damaged[rng.randrange(100, len(damaged))] = rng.randrange(256)
            path = tmp_path / f"damaged{n}.sqlite"
            path.write_bytes(bytes(damaged))
            try:
                trace = mxprof.load(path)
            except mxprof.TraceFormatError as e:
                assert str(path) in str(e)
                outcomes["refused"] += 1
            else:
                assert all(isinstance(e.name, str) for e in trace)
                outcomes["read"] += 1
    assert outcomes["refused"] > 0 and outcomes["read"] > 0


def test_a_damaged_schema_sqlite_answers_with_out_of_memory(tmp_path):
    """A 7 KB file the sqlite fuzz target found (kept in its corpus): SQLite
    answers SQLITE_NOMEM (Python's MemoryError) when it reads the schema."""
    seed = os.path.join(os.path.dirname(__file__), "fuzz", "corpus_sqlite", "cb4fb5a66994749f")
    path = tmp_path / "nomem.sqlite"
    with open(seed, "rb") as f:
        path.write_bytes(f.read())
    expect_error(path, "SQLite ran out of memory reading it")
