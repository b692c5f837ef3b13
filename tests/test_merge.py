"""mxprof.trace.merge and its clock model: times moved without breaking any thread's nesting.

Synthetic per-process files with a known clock model: a process whose
clock is 3 s ahead, measured twice 60 ms apart, once with as much noise as
the parameter-server example sees (a drift of 2,500 ppm that its error
bound does not allow to tell from none) and twice with tight bounds (a
real ±2,500 ppm drift, applied).
"""

import json
import math
from fractions import Fraction

import pytest

import mxprof
from mxprof import _testing
from mxprof.trace import clock as _clock
from mxprof.trace.merge import merge

# Not a float: floats near here step by 256 ns.
BASE = 1_795_448_643_479_177_517
AHEAD = 3_000_000_000  # the peer's clock reads 3 s more than the hub's
SPAN = 60_000_000  # ns between the peer's two clock estimates
MS = 1000.0  # µs


def estimates(drift_ns, error_ns, at_ns=BASE + AHEAD):
    """Two estimates SPAN apart whose offsets differ by drift_ns."""
    return [
        {"at_ns": at_ns, "offset_ns": -AHEAD, "error_ns": error_ns, "samples": 16},
        {"at_ns": at_ns + SPAN, "offset_ns": -AHEAD + drift_ns, "error_ns": error_ns,
         "samples": 16},
    ]  # fmt: skip


NOISY = (150_000, 100_000)  # 2,500 ppm measured, ±3,333 ppm error bound: not applied
FAST = (150_000, 5_000)  # 2,500 ppm, ±167 ppm: applied
SLOW = (-150_000, 5_000)


def model(drift_ns, error_ns):
    return _clock.ClockModel.from_json({"estimates": estimates(drift_ns, error_ns, at_ns=0)})


# ---- the clock model ----


def test_a_drift_within_its_error_bound_is_not_applied():
    m = model(*NOISY)
    assert m.measured_drift == pytest.approx(0.0025)
    assert m.drift_error == pytest.approx(200_000 / SPAN)  # both bounds over the span
    assert not m.drift_applied and m.drift == 0.0
    # One offset: the middle of what both estimates allow, [-3 s + 50 µs, -3 s + 100 µs].
    for t in (-SPAN, 0, SPAN // 2, SPAN, 2 * SPAN):
        assert m.offset_at(t) == -AHEAD + 75_000
    # Bound: each estimate's own, plus how far the constant lies from it.
    assert m.error_ns == 75_000 + 100_000
    clock = m.to_json()
    assert (clock["offset_ns"], clock["drift"]) == (-AHEAD + 75_000, 0.0)
    assert clock["measured_drift"] == pytest.approx(0.0025)
    assert clock["drift_error"] == pytest.approx(200_000 / SPAN)
    assert _clock.ClockModel.from_json(json.loads(json.dumps(clock))) == m


@pytest.mark.parametrize("clock", [FAST, SLOW], ids=["fast", "slow"])
def test_a_drift_beyond_its_error_bound_is_applied_in_whole_ns(clock):
    m = model(*clock)
    drift = clock[0] / SPAN
    assert m.drift_applied and m.drift == pytest.approx(drift)
    assert m.drift_error == pytest.approx(10_000 / SPAN)
    assert m.offset_at(0) == -AHEAD and m.offset_at(SPAN) == -AHEAD + clock[0]
    assert m.offset_at(SPAN // 3) == -AHEAD + clock[0] // 3  # exact, an int
    assert m.offset_at(-5) == -AHEAD and m.offset_at(5 * SPAN) == -AHEAD + clock[0]  # held
    assert m.error_ns == 5_000


def test_time_moved_by_the_clock_model_never_runs_backwards():
    # The steepest drift allowed, over a short span: t + offset_at(t) still
    # never decreases from one ns to the next.
    for drift in (-999, 999):
        m = _clock.ClockModel((_clock.Estimate(100, 0, 0, 1), _clock.Estimate(1100, drift, 0, 1)))
        moved = [t + m.offset_at(t) for t in range(0, 1300)]
        assert all(b >= a for a, b in zip(moved, moved[1:])), drift
        assert moved[-1] - moved[0] == 1299 + drift
    with pytest.raises(ValueError, match="impossible drift"):
        _clock.ClockModel.from_json(
            {"estimates": [{"at_ns": 0, "offset_ns": 0, "error_ns": 0, "samples": 1},
                           {"at_ns": 10, "offset_ns": -20, "error_ns": 0, "samples": 1}]}
        )  # fmt: skip


# ---- merging ----


def thread_events(pid):
    """One process's events, µs on its own axis, all between its clock estimates.

    Thread 1: 'parent' [1, 41] ms holds 'first' [1, 11] and 'second' [11, 41]
    back to back; 'second' holds 'last' ending with it; a marker at 11 ms and
    a counter sample inside 'first'; a B/E range [42, 50] holding 'tail'
    that ends with it; an async range [2, 41] ms; a flow from 'first' to
    thread 2, whose 'other' [0, 50] ms holds the flow's end.
    """

    def x(name, ts, dur, tid=1):
        return {"ph": "X", "name": name, "cat": "c", "pid": pid, "tid": tid, "ts": ts, "dur": dur}

    def point(ph, name, ts, tid=1, **kw):
        return {"ph": ph, "name": name, "cat": "c", "pid": pid, "tid": tid, "ts": ts, **kw}

    return [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "main"}},
        x("parent", 1 * MS, 40 * MS),
        x("first", 1 * MS, 10 * MS),
        x("second", 11 * MS, 30 * MS),
        x("last", 35_000.5, 5_999.5),
        point("i", "mark", 11 * MS, s="t"),
        point("C", "queue", 7_654.321, args={"queue": 3}),
        point("B", "be", 42 * MS),
        x("tail", 45 * MS, 5 * MS),
        point("E", "be", 50 * MS),
        point("b", "async", 2 * MS, id=7),
        point("e", "async", 41 * MS, id=7),
        point("s", "flow", 5 * MS, id=9),
        x("other", 0.0, 50 * MS, tid=2),
        point("f", "flow", 30 * MS, tid=2, id=9, bp="e"),
    ]


def ns(value):
    """A time in µs as the loader takes it: whole ns, rounded from the exact value."""
    return math.floor(Fraction(value) * 1000 + Fraction(1, 2))


def points(events):
    """{(name, ph, which): ns} for every time of every event; X ends included."""
    out = {}
    for e in events:
        if e["ph"] == "M":
            continue
        out[(e["name"], e["ph"], "start")] = ns(e["ts"])
        if e["ph"] == "X":
            out[(e["name"], e["ph"], "end")] = ns(Fraction(e["ts"]) + Fraction(e["dur"]))
    return out


def ranges(events):
    """{name: (start, end)} in ns: X events, B/E and b/e pairs."""
    p = points(events)
    out = {name: (p[(name, "X", "start")], p[(name, "X", "end")]) for name, ph, _ in p if ph == "X"}
    out["be"] = (p[("be", "B", "start")], p[("be", "E", "start")])
    out["async"] = (p[("async", "b", "start")], p[("async", "e", "start")])
    return out


def relations(spans):
    """For every two ranges: whether one holds the other, or ends before it starts."""
    rel = set()
    for a, (a0, a1) in spans.items():
        for b, (b0, b1) in spans.items():
            if a != b and a0 <= b0 and b1 <= a1:
                rel.add((a, "holds", b))
            if a != b and a1 <= b0:
                rel.add((a, "before", b))
    return rel


def write_trace(path, base_ns, events, info=None):
    doc = {"traceEvents": events, "baseTimeNanoseconds": base_ns}
    if info is not None:
        doc["distributedInfo"] = info
    path.write_text(json.dumps(doc))


def job_files(tmp_path, clock):
    """A hub file and a peer file whose clock is `clock` = (drift_ns, error_ns)."""
    info = {"role": "worker", "rank": 0, "host": "h0", "pid": 10, "world_size": 2,
            "num_workers": 1, "num_servers": 1, "backend": "zmq",
            "clock": {"estimates": []}}  # fmt: skip
    peer_info = {**info, "role": "server", "host": "h1", "pid": 20,
                 "clock": {"estimates": estimates(*clock)}}  # fmt: skip
    hub_events = [{"ph": "X", "name": "hub", "pid": 10, "tid": 1, "ts": 1 * MS, "dur": 1 * MS}]
    write_trace(tmp_path / "hub.json", BASE, hub_events, info)
    # The peer began 1 µs after its first estimate, on its own clock.
    write_trace(tmp_path / "peer.json", BASE + AHEAD + 1000, thread_events(20), peer_info)
    return [tmp_path / "hub.json", tmp_path / "peer.json"]


@pytest.mark.parametrize("clock", [NOISY, FAST, SLOW], ids=["noisy", "fast", "slow"])
def test_merge_keeps_every_threads_nesting(tmp_path, clock):
    paths = job_files(tmp_path, clock)
    merge(paths, tmp_path / "merged.json")
    merged = _testing.load_trace(tmp_path / "merged.json")
    before = thread_events(20)
    after = [e for e in merged["traceEvents"] if e["pid"] == 20]
    # Every time lands on a whole ns, so readers that round ts and dur
    # separately (Perfetto) see the same ends as those that round ts + dur.
    for e in after:
        for key in ("ts", "dur"):
            if key in e:
                assert e[key] * 1000 == pytest.approx(round(e[key] * 1000), abs=1e-6), e
    old, new = points(before), points(after)
    assert old.keys() == new.keys()
    # The mapping never runs backwards: times in order stay in order.
    order = sorted(old, key=lambda k: old[k])
    assert [new[k] for k in order] == sorted(new[k] for k in order)
    # Ranges that held others still hold them; back-to-back ones do not overlap.
    spans_before, spans_after = ranges(before), ranges(after)
    assert relations(spans_after) == relations(spans_before)
    assert ("parent", "holds", "second") in relations(spans_after)
    assert ("first", "before", "second") in relations(spans_after)
    # Points stay inside the ranges they fell in.
    assert spans_after["second"][0] == new[("mark", "i", "start")]
    assert spans_after["first"][0] <= new[("queue", "C", "start")] <= spans_after["first"][1]
    assert spans_after["first"][0] <= new[("flow", "s", "start")] <= spans_after["first"][1]
    assert spans_after["other"][0] <= new[("flow", "f", "start")] <= spans_after["other"][1]
    # Where the drift is applied, lengths change by it; otherwise not at all.
    m = _clock.ClockModel.from_json({"estimates": estimates(*clock)})
    for name, (start, end) in spans_before.items():
        moved = spans_after[name][1] - spans_after[name][0]
        assert abs(moved - (end - start) * (1 + m.drift)) <= 1, name
    if clock is NOISY:
        # One offset for every event: -3 s + 75 µs; the peer began 1 µs after
        # the hub's ts 0 on its own clock.
        assert new[("parent", "X", "start")] == 1_000_000 + 1000 + 75_000


def test_merge_of_the_noisy_clock_with_a_fixed_drift_was_what_broke_nesting(tmp_path):
    # The failure the fix is about, spelled out: with the measured drift
    # applied to starts only, 'second' (starting 10 ms after 'parent') ended
    # 25 µs past it.  Now both keep their length and their common end.
    merge(job_files(tmp_path, NOISY), tmp_path / "merged.json")
    merged = _testing.load_trace(tmp_path / "merged.json")
    ev = {e["name"]: e for e in _testing.events(merged, "X") if e["pid"] == 20}
    assert ev["second"]["dur"] == 30 * MS and ev["parent"]["dur"] == 40 * MS
    assert ns(ev["second"]["ts"] + ev["second"]["dur"]) == ns(ev["parent"]["ts"] + 40 * MS)


@pytest.mark.parametrize("clock", [NOISY, FAST], ids=["noisy", "fast"])
def test_merged_base_time_is_an_exact_integer(tmp_path, clock):
    merge(job_files(tmp_path, clock), tmp_path / "merged.json")
    text = (tmp_path / "merged.json").read_text()
    merged = json.loads(text)
    assert type(merged["baseTimeNanoseconds"]) is int
    assert merged["baseTimeNanoseconds"] == BASE  # the hub began first
    assert f'"baseTimeNanoseconds": {BASE}' in text
    # The hub's own events are where its file put them.
    (hub,) = [e for e in merged["traceEvents"] if e.get("name") == "hub"]
    assert (hub["ts"], hub["dur"]) == (1 * MS, 1 * MS)
    # The merged file states the clock as applied.
    drifts = [r["clock"]["drift"] for r in merged["distributedInfo"]["ranks"]]
    assert drifts == [0.0, pytest.approx(clock[0] / SPAN if clock is FAST else 0.0)]


def test_merged_from_names_the_inputs_as_given_or_as_the_caller_says(tmp_path):
    paths = job_files(tmp_path, NOISY)
    merge([str(p) for p in paths], tmp_path / "a.json")
    other = _testing.load_trace(tmp_path / "a.json")["otherData"]
    assert other["merged_from"] == [str(p) for p in paths]
    merge(paths, tmp_path / "b.json", sources=["worker 0: hub.json", "server 0: peer.json"])
    other = _testing.load_trace(tmp_path / "b.json")["otherData"]
    assert other["merged_from"] == ["worker 0: hub.json", "server 0: peer.json"]
    with pytest.raises(ValueError, match="1 sources named for 2 inputs"):
        merge(paths, tmp_path / "c.json", sources=["one"])


def test_a_clock_with_an_impossible_drift_is_a_trace_format_error(tmp_path):
    # Offsets 120 ms apart over a 60 ms span: the clock would run backwards.
    paths = job_files(tmp_path, (-120_000_000, 0))
    with pytest.raises(mxprof.TraceFormatError, match="peer.json: bad distributedInfo.clock"):
        merge(paths, tmp_path / "out.json")


def test_plain_inputs_keep_their_nesting_and_lengths(tmp_path):
    # No clock model: each input moves by its base time only, in whole ns.
    write_trace(tmp_path / "a.json", BASE, thread_events(1))
    write_trace(tmp_path / "b.json", BASE - 123_457, thread_events(2))
    merge([tmp_path / "a.json", tmp_path / "b.json"], tmp_path / "m.json")
    merged = _testing.load_trace(tmp_path / "m.json")
    assert merged["baseTimeNanoseconds"] == BASE - 123_457
    for pid, shift in ((1, 123_457), (2, 0)):
        old = points(thread_events(pid))
        new = points([e for e in merged["traceEvents"] if e["pid"] == pid])
        assert new == {k: v + shift for k, v in old.items()}


def test_merged_and_repaired_files_write_backslashes_as_the_core_does(tmp_path):
    """A name ending in a backslash must not end in an escaped backslash,
    which Perfetto reads as an escaped quote; readers get the name back."""
    from mxprof.trace.repair import repair

    trace = str(tmp_path / "t.json")
    _testing.start(trace)
    with mxprof.Domain("dom\\").new_task("ends\\"):
        pass
    _testing.finish(trace)
    merged, repaired = str(tmp_path / "m.json"), str(tmp_path / "r.json")
    merge([trace], merged)
    repair(trace, repaired)
    for path in (merged, repaired):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        assert "\\\\" not in text and '"ends\\u005c"' in text
        (e,) = _testing.events(json.loads(text), "X", "ends\\")
        assert e["cat"] == "dom\\"


def test_python_writers_choose_the_format_by_name_as_the_core_does():
    from mxprof._native import lib
    from mxprof.trace.writer import JSON, JSON_GZ, PERFETTO, file_format

    codes = {lib.MXP_FORMAT_JSON: JSON, lib.MXP_FORMAT_JSON_GZ: JSON_GZ,
             lib.MXP_FORMAT_PERFETTO: PERFETTO}  # fmt: skip
    names = ["t.json", "t.json.gz", "t.gz", "t.pftrace", "t.perfetto-trace", "t", "t.JSON.GZ",
             "t.PFTRACE", "t.pftrace.json", "t.gz.json", "dir.gz/t.json", "t.tgz", "données.gz",
             ".pftrace", "t.json.pftrace"]  # fmt: skip
    for name in names:
        data = name.encode("utf-8")
        assert file_format(name) == codes[lib.mxp_trace_format(data, len(data))], name


def range_names(path):
    return [e.name for e in mxprof.load(path) if e.dur is not None]


def test_repair_writes_the_format_its_output_names(tmp_path):
    """The output's name decides its format, as for every file mxprof writes
    (a JSON file cut short repaired to a .pftrace name was written as JSON)."""
    from mxprof.trace.perfetto import looks_like_perfetto
    from mxprof.trace.repair import repair

    trace = tmp_path / "t.json"
    _testing.start(trace, continuous_dump=False)
    task = mxprof.Domain("d").new_task("t")
    for _ in range(40):
        with task:
            pass
    _testing.finish(trace)
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) * 2 // 3])  # cut short
    repair(trace, tmp_path / "r.json")
    kept = len(_testing.events(_testing.load_trace(tmp_path / "r.json"), "X", "t"))
    assert 0 < kept < 40

    assert repair(trace, tmp_path / "r.pftrace")["truncated"] is True
    assert looks_like_perfetto((tmp_path / "r.pftrace").read_bytes())
    assert [e.name for e in mxprof.load(tmp_path / "r.pftrace") if e.dur is not None] == [
        "t"
    ] * kept

    # And back: Perfetto repaired to a JSON name is JSON with the same ranges.
    result = repair(tmp_path / "r.pftrace", tmp_path / "back.json")
    doc = _testing.load_trace(tmp_path / "back.json")  # parses as JSON
    assert result == {"events": len(doc["traceEvents"]), "truncated": False, "problem": None}
    assert [e.name for e in mxprof.load(tmp_path / "back.json") if e.dur is not None] == [
        "t"
    ] * kept
