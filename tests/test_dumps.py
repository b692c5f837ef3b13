"""dumps(): MXNet's exact table and JSON layouts, sorting, reset, long names."""

import json
from collections import OrderedDict

import _bench
import pytest

import mxprof
from mxprof import _testing, stats

MS = 1_000_000


def scenario(clock):
    """research/mxnet.md §2.2, minus MXNet's own engine and C-API rows."""
    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    d = mxprof.Domain("PythonDomain")
    compute, frame = d.new_task("compute"), d.new_frame("frame0")
    counter, marker = d.new_counter("PythonCounter"), d.new_marker("mark")
    event = mxprof.Event("myevent")
    mxprof.set_state("run")
    for dur in (1.5, 2.5):
        compute.start()
        clock(int(dur * MS))
        compute.stop()
    frame.start()
    clock(3 * MS)
    frame.stop()
    event.start()
    clock(1_234_000)
    event.stop()
    counter.set_value(5)
    counter.set_value(6)
    marker.mark()
    mxprof.set_state("stop")


EXPECTED_TABLE = """
Profile Statistics:
\tNote the difference in units for different entries.
PythonDomain
=================
Name                          Total Count        Time (ms)    Min Time (ms)    Max Time (ms)    Avg Time (ms)        Self (ms)                %
----                          -----------        ---------    -------------    -------------    -------------        ---------                -
compute                                 2           4.0000           1.5000           2.5000           2.0000           4.0000            48.58

PythonDomain,counter
=================
Name                          Total Count             Last              Min              Max              Avg
----                          -----------             ----              ---              ---              ---
PythonCounter                           2                6                5                6           5.5000

PythonDomain,frame
=================
Name                          Total Count        Time (ms)    Min Time (ms)    Max Time (ms)    Avg Time (ms)        Self (ms)                %
----                          -----------        ---------    -------------    -------------    -------------        ---------                -
frame0                                  1           3.0000           3.0000           3.0000           3.0000           3.0000            36.43

PythonDomain,marker
=================
Name                          Total Count
----                          -----------
mark                                    1

event
=================
Name                          Total Count        Time (ms)    Min Time (ms)    Max Time (ms)    Avg Time (ms)        Self (ms)                %
----                          -----------        ---------    -------------    -------------    -------------        ---------                -
myevent                                 1           1.2340           1.2340           1.2340           1.2340           1.2340            14.99

"""

# Self and % (wall time recorded: 1.5 + 2.5 + 3 + 1.234 = 8.234 ms) and the
# percentiles (nearest rank: rank 1 is the minimum, rank n the maximum).
EXPECTED_JSON_HEAD = """{
    "Time": {
        "PythonDomain": {
            "compute": {
                "Count": 2,
                "Total": 4.0,
                "Min": 1.5,
                "Max": 2.5,
                "Avg": 2.0,
                "Self": 4.0,
                "%": 48.5791,
                "P50": 1.5,
                "P90": 2.5,
                "P99": 2.5
            }
        }
        ,
        "PythonDomain,frame": {
            "frame0": {
                "Count": 1,
                "Total": 3.0,
                "Min": 3.0,
                "Max": 3.0,
                "Avg": 3.0,
                "Self": 3.0,
                "%": 36.4343,
                "P50": 3.0,
                "P90": 3.0,
                "P99": 3.0
            }
        }
        ,
        "event": {
            "myevent": {
                "Count": 1,
                "Total": 1.234,
                "Min": 1.234,
                "Max": 1.234,
                "Avg": 1.234,
                "Self": 1.234,
                "%": 14.9866,
                "P50": 1.234,
                "P90": 1.234,
                "P99": 1.234
            }
        }
    }
    ,
    "Memory": {
    }
    ,
    "Counter": {
        "PythonDomain": {
            "PythonCounter": {
                "Count": 2,
                "Last": 6,
                "Min": 5,
                "Max": 6,
                "Avg": 5.5
            }
        }
    }
    ,
    "Marker": {
        "PythonDomain": {
            "mark": {
                "Count": 1
            }
        }
    }
    ,
    "Profiler": {
        "dropped_events": 0,
        "unmatched_stops": 0,
        "non_lifo_stops": 0,
        "ignored_calls": 0,
        "unknown_frees": 0,
        "cut_ranges": 0,
        "saturated_values": 0,
        "invalid_calls": 0
    }
,
    "Unit": {
        "Time": "ms",
        "Memory": "kB"
    }
}
"""


def test_table_is_mxnet_layout_byte_for_byte(clock):
    scenario(clock)
    assert mxprof.dumps() == EXPECTED_TABLE


def test_json_is_mxnet_layout_byte_for_byte(clock):
    scenario(clock)
    assert mxprof.dumps(format="json") == EXPECTED_JSON_HEAD


def test_json_parses_in_order(clock):
    scenario(clock)
    data = json.loads(mxprof.dumps(format="json"), object_pairs_hook=OrderedDict)
    assert list(data) == ["Time", "Memory", "Counter", "Marker", "Profiler", "Unit"]
    assert list(data["Time"]) == ["PythonDomain", "PythonDomain,frame", "event"]
    assert list(data["Time"]["PythonDomain"]["compute"]) == [
        "Count",
        "Total",
        "Min",
        "Max",
        "Avg",
        "Self",
        "%",
        "P50",
        "P90",
        "P99",
    ]
    assert data["Unit"] == {"Time": "ms", "Memory": "kB"}


def test_empty_statistics():
    mxprof.set_config(aggregate_stats=True)
    data = json.loads(mxprof.dumps(format="json"))
    assert data["Time"] == data["Memory"] == data["Counter"] == data["Marker"] == {}
    assert mxprof.dumps().startswith("\nProfile Statistics:\n")


def rows(clock, durations_ms):
    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    d = mxprof.Domain("d")
    mxprof.set_state("run")
    for name, durs in durations_ms.items():
        t = d.new_task(name)
        for ms in durs:
            t.start()
            clock(int(ms * MS))
            t.stop()


def order(**kw):
    return list(json.loads(mxprof.dumps(format="json", **kw))["Time"]["d"])


def test_sort_by_every_key_both_directions(clock):
    rows(clock, {"a": [1, 1, 1, 1], "b": [10], "c": [2, 6], "d": [0.5, 3.5]})
    # totals 4, 10, 8, 4; avgs 1, 10, 4, 2; mins 1, 10, 2, .5; maxes 1, 10, 6, 3.5; counts 4,1,2,2
    assert order() == ["b", "c", "a", "d"]  # ties by name, ascending
    assert order(sort_by="total", ascending=True) == ["a", "d", "c", "b"]
    assert order(sort_by="avg") == ["b", "c", "d", "a"]
    assert order(sort_by="min") == ["b", "c", "a", "d"]
    assert order(sort_by="max", ascending=True) == ["a", "d", "c", "b"]
    assert order(sort_by="count") == ["a", "c", "d", "b"]
    assert order(sort_by="count", ascending=1) == ["b", "c", "d", "a"]


def test_table_rows_follow_the_same_order(clock):
    rows(clock, {"a": [1], "b": [3], "c": [2]})
    table = mxprof.dumps(sort_by="total", ascending=True)
    names = [ln.split()[0] for ln in table.splitlines() if ln[:1] in "abc" and ln.strip()]
    assert names == ["a", "c", "b"]


def test_counter_and_marker_sorting(clock):
    mxprof.set_config(aggregate_stats=True, write_trace=False)
    d = mxprof.Domain("d")
    c1, c2 = d.new_counter("one"), d.new_counter("two")
    m1, m2 = d.new_marker("m1"), d.new_marker("m2")
    mxprof.set_state("run")
    c1.set_value(100)
    c1.set_value(1)  # last 1, mean 50.5
    c2.set_value(10)  # last 10, mean 10
    m2.mark()
    m2.mark()
    m1.mark()
    data = json.loads(mxprof.dumps(format="json"))
    assert list(data["Counter"]["d"]) == ["two", "one"]  # by last value
    assert list(json.loads(mxprof.dumps(format="json", sort_by="avg"))["Counter"]["d"]) == [
        "one",
        "two",
    ]
    assert list(data["Marker"]["d"]) == ["m2", "m1"]


def test_reset_clears_after_rendering(clock):
    rows(clock, {"a": [1, 2]})
    first = json.loads(mxprof.dumps(format="json", reset=True))
    assert first["Time"]["d"]["a"]["Count"] == 2
    assert json.loads(mxprof.dumps(format="json"))["Time"] == {}
    t = mxprof.Domain("d").new_task("a")
    t.start()
    clock(MS)
    t.stop()
    row = json.loads(mxprof.dumps(format="json"))["Time"]["d"]["a"]
    assert row == {
        "Count": 1,
        "Total": 1.0,
        "Min": 1.0,
        "Max": 1.0,
        "Avg": 1.0,
        "Self": 1.0,
        "%": 100.0,  # the only range in the 1 ms recorded since the reset
        "P50": 1.0,
        "P90": 1.0,
        "P99": 1.0,
    }


def test_reset_also_restarts_the_profiler_tallies():
    mxprof.set_config(aggregate_stats=True)
    mxprof.set_state("run")
    mxprof.Domain("d").new_task("t").stop()
    assert json.loads(mxprof.dumps(format="json", reset=True))["Profiler"]["unmatched_stops"] == 1
    assert json.loads(mxprof.dumps(format="json"))["Profiler"]["unmatched_stops"] == 0


def test_aggregate_off_and_on_again_starts_fresh(clock, monkeypatch):
    monkeypatch.setattr(stats, "_warned_off", True)  # test_config checks the warning
    rows(clock, {"a": [1]})
    mxprof.set_config(aggregate_stats=False)
    assert mxprof.dumps() == ""
    mxprof.set_config(aggregate_stats=True)
    assert json.loads(mxprof.dumps(format="json"))["Time"] == {}


def test_long_names_widen_the_column(clock):
    long = "a_really_long_operator_name_that_goes_on_and_on"
    rows(clock, {long: [1], "short": [2]})
    lines = mxprof.dumps().splitlines()
    header = next(ln for ln in lines if ln.startswith("Name"))
    body = [ln for ln in lines if ln.startswith((long, "short"))]
    col = header.index("Total Count") + len("Total Count")
    for ln in body:
        assert ln[:col].rstrip().endswith("1")  # counts end in the header's column
        assert ln.split()[0] in (long, "short")
    assert len({len(ln) for ln in body + [header]}) == 1


def test_wide_and_control_characters_keep_alignment(clock):
    rows(clock, {"漢字漢字": [1], "tab\there": [1], "x": [1]})
    lines = mxprof.dumps().splitlines()
    header = next(ln for ln in lines if ln.startswith("Name"))
    col = header.index("Total Count") + len("Total Count")
    row_lines = [ln for ln in lines if ln.startswith(("漢", "tab", "x "))]
    assert len(row_lines) == 3
    assert "tab\\there" in "\n".join(row_lines)
    import unicodedata

    def width(s):
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)

    for ln in row_lines:
        count_end = width(ln[: ln.index(" 1 ") + 2]) if " 1 " in ln else None
        assert count_end == col


NASTY = ['q"uote', "back\\slash", "new\nline", "emoji 🚀", "z" * 10_000]


def test_names_round_trip_through_json(clock):
    mxprof.set_config(aggregate_stats=True, write_trace=False, profile_api=False)
    objs = [(mxprof.Domain(n).new_task(n), mxprof.Domain(n).new_counter(n)) for n in NASTY]
    mxprof.set_state("run")
    for task, counter in objs:
        task.start()
        task.stop()
        counter.set_value(1)
    data = json.loads(mxprof.dumps(format="json"))
    assert sorted(data["Time"]) == sorted(NASTY)
    for n in NASTY:
        assert list(data["Time"][n]) == [n]
        assert list(data["Counter"][n]) == [n]
    table = mxprof.dumps()
    assert "new\\nline" in table and "emoji 🚀" in table


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_dumps_writes_no_file(tmp_path, fmt):
    mxprof.set_config(aggregate_stats=True, filename=str(tmp_path / "t.json"))
    mxprof.set_state("run")
    mxprof.dumps(format=fmt)
    assert not (tmp_path / "t.json").exists()


MXNET_TIME_COLUMNS = ["Total Count", "Time (ms)", "Min Time (ms)", "Max Time (ms)", "Avg Time (ms)"]


def header_cells(line):
    return [h.strip() for h in line.split("  ") if h.strip()]


def test_table_has_mxnets_columns_first_then_ours(clock):
    # Readers split a row on whitespace and take MXNet's columns by position
    # from the left; mxprof's own columns used to stand between Max and Avg.
    scenario(clock)
    for pct in (False, True):
        lines = mxprof.dumps(percentiles=pct).splitlines()
        header = header_cells(next(ln for ln in lines if ln.startswith("Name")))
        ours = ["Self (ms)", "%"] + (["P50 (ms)", "P90 (ms)", "P99 (ms)"] if pct else [])
        assert header == ["Name"] + MXNET_TIME_COLUMNS + ours
        row = next(ln for ln in lines if ln.startswith("compute")).split()
        assert row[:6] == ["compute", "2", "4.0000", "1.5000", "2.5000", "2.0000"]
        assert row[6:8] == ["4.0000", "48.58"]  # self, %


def test_table_blocks_follow_mxnets_map_order(tmp_path, clock):
    # MXNet prints one block per category in std::map order (byte-wise by
    # title: upper case first); counter, marker and memory blocks take their
    # place among them by title too, and the Profiler tallies come last.
    from mxprof import memory

    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    b, big_a = mxprof.Domain("b"), mxprof.Domain("A")
    objs = [b.new_task("t"), big_a.new_task("t"), mxprof.Event("e"), b.new_frame("f")]
    mxprof.set_state("run")
    for obj in objs:
        with obj:
            clock(MS)
    b.new_counter("c").set_value(1)
    big_a.new_marker("m").mark()
    memory.record_alloc(1000, device="cpu")
    mxprof.Domain("z").new_task("never").stop()  # an unmatched stop: a Profiler tally
    lines = mxprof.dumps().splitlines()
    titles = [lines[i - 1] for i, ln in enumerate(lines) if ln == "=" * 17]
    assert titles == [
        "A",
        "A,marker",
        "Device Storage",
        "Scope Storage",
        "b",
        "b,counter",
        "b,frame",
        "event",
        "Profiler",
    ]
    assert sorted(titles[:-1]) == titles[:-1]  # code point order, as MXNet's byte-wise map


def test_memory_block_has_mxnets_columns_first(tmp_path):
    from mxprof import memory

    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    mxprof.set_state("run")
    handle = memory.record_alloc(3000, device="cpu")
    memory.record_alloc(1000, device="cpu")
    memory.record_free(handle)  # samples 3000, 4000, 1000 bytes
    lines = mxprof.dumps().splitlines()
    at = lines.index("Device Storage")
    heads = ["Min Use  (kB)", "Max Use  (kB)", "Avg Use  (kB)", "Peak Use  (kB)"]
    assert lines[at + 2].split()[:3] == ["Name", "Total", "Count"]
    assert [lines[at + 2].index(h) for h in heads] == sorted(lines[at + 2].index(h) for h in heads)
    assert lines[at + 4].split()[2:] == ["3", "1.0000", "4.0000", "2.6667", "4.0000"]
    entry = json.loads(mxprof.dumps(format="json"))["Memory"]["Device Storage"]["Memory: cpu/0"]
    assert list(entry) == ["Count", "Min", "Max", "Avg", "Peak"]  # MXNet's keys, then ours


def test_counter_average_is_rounded_like_every_other_value(clock):
    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    c = mxprof.Domain("d").new_counter("c")
    mxprof.set_state("run")
    for v in (1, 1, 2):
        c.set_value(v)
    text = mxprof.dumps(format="json")
    assert '"Avg": 1.333333\n' in text  # 6 decimals, not 1.3333333333333333
    assert json.loads(text)["Counter"]["d"]["c"]["Avg"] == 1.333333
    row = next(ln for ln in mxprof.dumps().splitlines() if ln.startswith("c "))
    assert row.split() == ["c", "3", "2", "1", "2", "1.3333"]


def test_json_keeps_mxnets_keys_first_and_ours_after(clock):
    scenario(clock)
    data = json.loads(mxprof.dumps(format="json"), object_pairs_hook=OrderedDict)
    top = list(data)
    assert [k for k in top if k in ("Time", "Memory", "Unit")] == ["Time", "Memory", "Unit"]
    for cat in data["Time"].values():
        for entry in cat.values():
            assert list(entry)[:5] == ["Count", "Total", "Min", "Max", "Avg"]


def test_self_time_excludes_nested_ranges_and_sorts(clock):
    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    d = mxprof.Domain("d")
    outer, inner, leaf = d.new_task("outer"), d.new_task("inner"), d.new_task("leaf")
    mxprof.set_state("run")
    with outer:  # 10 ms, of which inner 6 ms (of which leaf 2 ms twice)
        clock(2 * MS)
        with inner:
            for _ in range(2):
                with leaf:
                    clock(2 * MS)
            clock(2 * MS)
        clock(2 * MS)
    data = json.loads(mxprof.dumps(format="json", sort_by="self"))["Time"]["d"]
    assert {k: (v["Total"], v["Self"]) for k, v in data.items()} == {
        "outer": (10.0, 4.0),
        "inner": (6.0, 2.0),
        "leaf": (4.0, 4.0),
    }
    assert list(data) == ["leaf", "outer", "inner"]  # self 4, 4 (ties by name), 2
    assert sum(v["%"] for v in data.values()) == pytest.approx(100.0)


def test_percent_is_of_recorded_wall_time_only(clock):
    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    t = mxprof.Domain("d").new_task("t")
    mxprof.set_state("run")
    with t:
        clock(1 * MS)
    clock(1 * MS)  # recording, nothing running: wall 2 ms
    mxprof.pause()
    clock(50 * MS)  # paused: not part of the wall time
    mxprof.resume()
    assert json.loads(mxprof.dumps(format="json"))["Time"]["d"]["t"]["%"] == 50.0


def test_percentiles_of_a_known_distribution(clock):
    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    t = mxprof.Domain("d").new_task("t")
    mxprof.set_state("run")
    for ms in (37 * k % 100 + 1 for k in range(100)):  # 1..100 ms, shuffled
        with t:
            clock(ms * MS)
    row = json.loads(mxprof.dumps(format="json"))["Time"]["d"]["t"]
    for key, exact in (("P50", 50.0), ("P90", 90.0), ("P99", 99.0)):
        assert row[key] == pytest.approx(exact, rel=0.01), key
    assert (row["Min"], row["Max"]) == (1.0, 100.0)
    order = [
        list(json.loads(mxprof.dumps(format="json", sort_by=k))["Time"]["d"])
        for k in ("p50", "p90", "p99", "self")
    ]
    assert order == [["t"]] * 4


def test_percentiles_restart_with_reset(clock):
    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    t = mxprof.Domain("d").new_task("t")
    mxprof.set_state("run")
    for _ in range(10):
        with t:
            clock(100 * MS)
    mxprof.dumps(reset=True)
    with t:
        clock(1 * MS)
    row = json.loads(mxprof.dumps(format="json"))["Time"]["d"]["t"]
    assert (row["Count"], row["P50"], row["P99"], row["Max"]) == (1, 1.0, 1.0, 1.0)


def test_percentiles_argument_is_checked():
    with pytest.raises(mxprof.ConfigError, match="percentiles"):
        mxprof.dumps(percentiles="yes")


def add_gpu_ranges(domain, name, durations_ms, track_name=b"GPU 0 stream 0"):
    """GPU ranges as mxprof.cuda records them: KIND_GPU objects on a track."""
    from mxprof import _native
    from mxprof._native import ffi, lib

    gid = _native.register(_native.KIND_GPU, domain.encode(), name.encode())
    tid = ffi.new("uint32_t *")
    assert lib.mxp_track_new(track_name, len(track_name), tid) == 0
    start = lib.mxp_clock_ns()
    for dur in durations_ms:
        assert lib.mxp_range_add(gid, tid[0], start, int(dur * MS)) == 0
        start += int(dur * MS)
    return tid[0]


def test_gpu_time_beside_the_task_of_the_same_name(tmp_path, clock):
    mxprof.set_config(aggregate_stats=True, profile_api=False, filename=str(tmp_path / "t.json"))
    d = mxprof.Domain("net")
    kernel, host = d.new_task("kernel"), d.new_task("host_only")
    mxprof.set_state("run")
    for _ in range(2):
        with kernel:
            clock(1 * MS)
    with host:
        clock(1 * MS)
    track = add_gpu_ranges("net", "kernel", [1.5, 2.5])
    add_gpu_ranges("net", "orphan", [0.25], b"GPU 0 stream 7")
    mxprof.set_state("stop")
    lines = mxprof.dumps().splitlines()
    head = lines[lines.index("net") + 2]
    assert header_cells(head) == ["Name"] + MXNET_TIME_COLUMNS + ["Self (ms)", "%", "GPU (ms)"]
    rows = {ln.split()[0]: ln.split() for ln in lines if ln.startswith(("kernel", "host_only"))}
    assert rows["kernel"][5] == "1.0000" and rows["kernel"][-1] == "4.0000"  # CPU avg, GPU total
    assert rows["host_only"][5] == "1.0000" and rows["host_only"][-1] == "-"
    orphan = lines[lines.index("net,gpu") + 4].split()
    assert orphan[:3] == ["orphan", "1", "0.2500"] and orphan[-1] == "0.2500"
    data = json.loads(mxprof.dumps(format="json"))
    assert data["Time"]["net"]["kernel"]["GPU"] == 4.0
    assert data["Time"]["net"]["kernel"]["Count"] == 2
    assert "GPU" not in data["Time"]["net"]["host_only"]
    assert data["Time"]["net,gpu"]["orphan"]["GPU"] == 0.25
    mxprof.dump()
    trace = _testing.load_trace(tmp_path / "t.json")
    gpu = [e for e in trace["traceEvents"] if e.get("cat") == "net,gpu"]
    assert sorted((e["name"], e["dur"]) for e in gpu) == [
        ("kernel", 1500.0),
        ("kernel", 2500.0),
        ("orphan", 250.0),
    ]
    names = {
        e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"
    }
    assert {names[e["tid"]] for e in gpu if e["name"] == "kernel"} == {"GPU 0 stream 0"}
    assert track in names


def test_no_gpu_column_without_gpu_ranges(clock):
    scenario(clock)
    assert "GPU" not in mxprof.dumps()
    assert '"GPU"' not in mxprof.dumps(format="json")


def core_info(oid):
    """What the core itself stores for an id (not the Python-side cache)."""
    from mxprof._native import ffi, lib

    kind, name, name_len = ffi.new("int *"), ffi.new("const char **"), ffi.new("size_t *")
    dom, dom_len = ffi.new("const char **"), ffi.new("size_t *")
    assert lib.mxp_object_info(oid, kind, name, name_len, dom, dom_len) == 0
    return (
        kind[0],
        ffi.unpack(dom[0], dom_len[0]).decode(),
        ffi.unpack(name[0], name_len[0]).decode(),
    )


def test_names_are_read_from_the_core_as_it_keeps_them(clock):
    # dumps() reads each id's domain and name from the core once per process
    # (in bulk: the per-id object_info cost seconds over 100,000 names).
    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    d = mxprof.Domain("créer 漢")
    ranges = [d.new_task("t 🚀"), d.new_frame("f"), mxprof.Event("ev"), mxprof.Task(d, "x")]
    counter, marker = d.new_counter("c"), d.new_marker("m")
    mxprof.set_state("run")
    for r in ranges:
        with r:
            clock(MS)
    counter.set_value(3)
    marker.mark()
    data = json.loads(mxprof.dumps(format="json"))
    assert sorted(data["Time"]["créer 漢"]) == ["t 🚀", "x"]
    assert list(data["Time"]["créer 漢,frame"]) == ["f"]
    assert list(data["Time"]["event"]) == ["ev"]
    assert list(data["Counter"]["créer 漢"]) == ["c"] and list(data["Marker"]["créer 漢"]) == ["m"]
    for obj in ranges + [counter, marker]:
        kind, domain, name = core_info(obj._id)
        assert (stats._domains[obj._id], stats._names[obj._id]) == (domain, name)


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_many_names_render_every_row(clock, fmt):
    mxprof.set_config(aggregate_stats=True, profile_api=False, write_trace=False)
    d = mxprof.Domain("many")
    tasks = [d.new_task(f"n{i:04d}") for i in range(2000)]
    mxprof.set_state("run")
    for i, t in enumerate(tasks):
        t.start()
        clock((i % 7 + 1) * 1000)
        t.stop()
    text = mxprof.dumps(format=fmt, sort_by="avg")
    if fmt == "json":
        rows = json.loads(text)["Time"]["many"]
        names = list(rows)
        assert rows["n0006"]["Avg"] == 0.007 and rows["n0007"]["Avg"] == 0.001
    else:
        names = [ln.split()[0] for ln in text.splitlines() if ln.startswith("n")]
    assert len(names) == 2000
    # by average descending (7 us .. 1 us), ties by name ascending
    assert names[:3] == ["n0006", "n0013", "n0020"] and names[-1] == "n1995"


def test_dumps_benchmark_quick_mode_runs(tmp_path):
    stdout, doc = _bench.quick("dumps.py", tmp_path)
    assert doc["names"] == 2000
    cases = {"create", "table, first", "table", "table avg", "json"}
    for kind in ("seconds", "cpu_seconds"):
        assert set(doc[kind]) == cases and all(v > 0 for v in doc[kind].values())
    targets = stdout.split("\ntarget", 1)[1].splitlines()[1:]
    assert {ln.split("  ")[0] for ln in targets} == cases
