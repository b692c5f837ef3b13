"""merge streams its inputs: the result equals moving every input's events by
hand, in every output format, and --window / --ranks cut it down."""

import gzip
import json

import _bench
import pytest

import mxprof
from mxprof.trace.merge import merge, parse_ranks, parse_window

BASE = 1_795_000_000_000_000_000


def write(path, events, base=None, info=None, shape="lines"):
    """A trace file: one event per line (as mxprof writes), or one line."""
    head = {"displayTimeUnit": "ms"}
    if base is not None:
        head["baseTimeNanoseconds"] = base
    if info is not None:
        head["distributedInfo"] = info
    if shape == "lines":
        text = (
            json.dumps(head)[:-1]
            + ', "traceEvents": [\n'
            + ",\n".join(json.dumps(e) for e in events)
            + '\n],\n"otherData": {"pid": 1}}\n'
        )
    else:
        text = json.dumps({**head, "traceEvents": events})
    data = text.encode()
    path.write_bytes(gzip.compress(data) if str(path).endswith(".gz") else data)
    return path


def steps(pid, first_ts, n=4, tid=1):
    """n frames of 1 ms, each with a child, written in the order they end."""
    out = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "main"}}]
    for k in range(n):
        ts = first_ts + k * 1000.0
        out += [
            {"ph": "X", "name": "fwd", "cat": "d", "ts": ts + 100.25, "dur": 500.5, "pid": pid,
             "tid": tid},
            {"ph": "C", "name": "loss", "cat": "d", "ts": ts + 700, "pid": pid, "tid": tid,
             "args": {"loss": k}},
            {"ph": "X", "name": "step", "cat": "d,frame", "ts": ts, "dur": 900.0, "pid": pid,
             "tid": tid, "args": {"frame": k}},
        ]  # fmt: skip
    return out


def inputs(tmp_path):
    """Three inputs: lines, gzip lines, and one-line JSON (read whole); pid 7 twice."""
    return [
        write(tmp_path / "a.json", steps(7, 0.0), base=BASE),
        write(tmp_path / "b.json.gz", steps(7, 50.0), base=BASE + 2_000_000),
        write(tmp_path / "c.json", steps(9, 0.0), base=BASE + 5_000, shape="one line"),
    ]


def shape(trace):
    """Ranges and counter samples (a counter's thread aside: Perfetto keeps
    counters per process)."""
    return sorted(
        (e.name, e.ph, e.ts, e.dur, str(e.pid), str(e.tid) if e.ph == "X" else "")
        for e in trace
        if e.ph in ("X", "C")
    )


def by_hand(paths):
    """What merging must give: each input's events moved by its base's distance
    from the earliest base, a pid two inputs share renumbered in the later."""
    loaded = [mxprof.load(p) for p in paths]
    ref = min(t.base_time_ns for t in loaded)
    out, used = [], set()
    for t in loaded:
        shift = t.base_time_ns - ref
        pids = {}
        for e in t:
            if e.pid not in pids:
                pids[e.pid] = e.pid if e.pid not in used else max(used) + 1
                used.add(pids[e.pid])
        out += [
            (e.name, e.ph, e.ts + shift, e.dur, str(pids[e.pid]), str(e.tid) if e.ph == "X" else "")
            for e in t
            if e.ph in ("X", "C")
        ]
    return sorted(out)


@pytest.mark.parametrize("name", ["m.json", "m.json.gz", "m.pftrace"])
def test_merged_events_are_the_inputs_moved_by_hand(tmp_path, name):
    paths = inputs(tmp_path)
    summary = merge(paths, tmp_path / name)
    merged = mxprof.load(tmp_path / name)
    assert shape(merged) == by_hand(paths)
    assert summary["events"] >= len(by_hand(paths))
    assert [i["shift_us"] for i in summary["inputs"]] == [0.0, 2000.0, 5.0]
    labels = set(merged.process_names.values())
    assert {"a.json (pid 7)", "b.json.gz (pid 7)", "c.json (pid 9)"} <= labels
    assert not list(tmp_path.glob("*.tmp*"))


def test_a_merged_json_file_is_in_the_shape_load_streams(tmp_path):
    merge(inputs(tmp_path), tmp_path / "m.json")
    lines = (tmp_path / "m.json").read_text().splitlines()
    assert lines[0].endswith('"traceEvents": [') and lines[-2] == "],"
    merged = mxprof.load(tmp_path / "m.json")
    assert merged._events is None  # read without holding its events
    assert merged.metadata["otherData"]["merged_from"] == [str(p) for p in inputs(tmp_path)]
    assert merged.base_time_ns == BASE


def test_a_window_in_seconds_keeps_what_overlaps_it_whole(tmp_path):
    paths = inputs(tmp_path)
    # 1.2 ms to 2.05 ms: a's step 1 ends at 1.9, b's step 1 runs 3.05..3.95 (not kept).
    summary = merge(paths, tmp_path / "w.json", window=parse_window("0.0012:0.00205"))
    assert summary["window_ns"] == [1_200_000, 2_050_000]
    got = shape(mxprof.load(tmp_path / "w.json"))
    want = [e for e in by_hand(paths) if e[2] <= 2_050_000 and e[2] + (e[3] or 0) >= 1_200_000]
    assert got == want and 0 < len(got) < len(by_hand(paths))
    assert ("step", "X", 1_000_000, 900_000, "7", "1") in got  # overlaps: kept whole


def test_a_window_in_steps_spans_those_steps_of_every_input(tmp_path):
    paths = inputs(tmp_path)
    summary = merge(paths, tmp_path / "s.json", window=parse_window("#2:#2"))
    # step 2: a 2.000..2.900 ms, b 4.050..4.950, c 2.005..2.905
    assert summary["window_ns"] == [2_000_000, 4_950_000]
    steps_kept = {(e.pid, e.args["frame"]) for e in mxprof.load(tmp_path / "s.json")
                  if e.name == "step"}  # fmt: skip
    assert (7, 2) in steps_kept and (8, 2) in steps_kept and (9, 2) in steps_kept
    assert (7, 0) not in steps_kept
    with pytest.raises(mxprof.TraceFormatError, match="no step numbered 40"):
        merge(paths, tmp_path / "none.json", window=parse_window("#40:#41"))


def test_ranks_keep_the_inputs_they_name(tmp_path):
    paths = []
    for role, rank in (("worker", 0), ("worker", 1), ("server", 0), ("worker", 2)):
        info = {"role": role, "rank": rank, "world_size": 4, "host": "h", "pid": rank}
        paths.append(
            write(tmp_path / f"{role}{rank}.json", steps(100 + len(paths), 0.0), BASE, info)
        )
    merge(paths, tmp_path / "r.json", ranks=parse_ranks("worker:1-2,server:0"))
    info = mxprof.load(tmp_path / "r.json").metadata["distributedInfo"]
    assert [(r["role"], r["rank"]) for r in info["ranks"]] == [
        ("worker", 1), ("worker", 2), ("server", 0)
    ]  # fmt: skip
    merge(paths, tmp_path / "r0.json", ranks=parse_ranks("0"))
    info = mxprof.load(tmp_path / "r0.json").metadata["distributedInfo"]
    assert [(r["role"], r["rank"]) for r in info["ranks"]] == [("worker", 0), ("server", 0)]
    with pytest.raises(mxprof.TraceFormatError, match="keeps none"):
        merge(paths, tmp_path / "x.json", ranks=parse_ranks("9"))


@pytest.mark.parametrize(
    "bad, why",
    [("3:1", "end comes before"), ("1:#2", "expected START:END"), ("a:b", "expected"),
     ("", "expected")],
)  # fmt: skip
def test_bad_windows_and_ranks_are_named(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_window(bad)


def test_the_command_takes_window_and_ranks(tmp_path):
    from mxprof import _testing

    paths = [str(p) for p in inputs(tmp_path)]
    done = _testing.cli("merge", *paths, "-o", "w.pftrace", "--window", "#1:#1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert {e.args.get("frame") for e in mxprof.load(tmp_path / "w.pftrace")
            if e.name == "step"} >= {1}  # fmt: skip
    bad = _testing.cli("merge", *paths, "-o", "x.json", "--ranks", "one", cwd=tmp_path)
    assert bad.returncode == 2 and "'one' is not N" in bad.stderr
    assert not (tmp_path / "x.json").exists()


def test_a_big_plain_inputs_metadata_comes_from_its_two_ends(tmp_path):
    """Past 16 MB a plain input's members are read from its head and tail
    (members after the events may hold lines that open with ']')."""
    events = [
        {"ph": "X", "name": f"r{k % 7}", "cat": "c", "ts": k * 2.0, "dur": 1.5, "pid": 3,
         "tid": 1}
        for k in range(200_000)
    ]  # fmt: skip
    big = write(tmp_path / "big.json", events, base=BASE + 7_000)
    assert big.stat().st_size > 16 << 20
    small = write(tmp_path / "small.json", steps(5, 0.0), base=BASE)
    summary = merge([small, big], tmp_path / "m.json")
    assert [i["shift_us"] for i in summary["inputs"]] == [0.0, 7.0]
    odd = tmp_path / "odd.json"  # a member after the events with a line opening with ']'
    odd.write_bytes(big.read_bytes().replace(b'"otherData": {"pid": 1}}', b'"x": [\n1\n]}'))
    summary = merge([small, odd], tmp_path / "m2.json")
    assert [i["shift_us"] for i in summary["inputs"]] == [0.0, 7.0]
    assert mxprof.load(tmp_path / "m2.json").metadata["otherData"]["merged_from"][1] == str(odd)
    from mxprof.trace import _scan

    with open(odd, "rb") as f:
        assert _scan.metadata(f)["x"] == [1]


@pytest.mark.slow
def test_benchmark_quick_mode(tmp_path):
    stdout, doc = _bench.quick("merge.py", tmp_path)
    assert doc["merged_events"] >= 2 * 19_000 and 0 < doc["window_events"] < doc["merged_events"]
    assert doc["ranges"] > 0 and "merge, peak RSS GB" in stdout


@pytest.mark.parametrize("name", ["i.json", "i.json.gz"])
def test_info_adds_keys_to_the_merged_distributed_info(tmp_path, name):
    """What distributed.collect writes of the processes it is missing."""
    info = {"role": "worker", "rank": 0, "world_size": 2, "host": "h", "pid": 1}
    worker = write(tmp_path / "w.json", steps(1, 0.0), BASE, info)
    gone = [{"process": "server 0", "why": "its process (pid 9) has exited"}]
    merge([worker], tmp_path / name, info={"missing": gone})
    merged = mxprof.load(tmp_path / name).metadata["distributedInfo"]
    assert merged["missing"] == gone and merged["world_size"] == 2
    assert [r["rank"] for r in merged["ranks"]] == [0]
    plain = write(tmp_path / "p.json", steps(2, 0.0), BASE)
    merge([plain], tmp_path / "p2.json", info={"missing": gone})
    assert mxprof.load(tmp_path / "p2.json").metadata["distributedInfo"]["missing"] == gone
