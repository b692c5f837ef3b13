"""One model of a job's processes (mxprof.trace.processes): identity from
structured metadata, one label rule, one outlier rule, time in no range,
memory peaks; and that the page, the hints and ``mxprof ranks`` agree on
them.  Traces are JSON files in the form mxprof writes, built here."""

import json

import pytest

import mxprof
from mxprof import cli
from mxprof._render import format_bytes
from mxprof.report import ranks
from mxprof.report.hints import find_hints
from mxprof.trace import merge, processes

MS = 1_000_000  # ns
BASE = 1_795_000_000_000_000_000


def X(name, ts_ms, dur_ms, *, cat="train", tid=1, pid=100, args=None):
    event = {"name": name, "cat": cat, "ph": "X", "ts": ts_ms * 1000, "dur": dur_ms * 1000}
    return {**event, "pid": pid, "tid": tid, "args": args or {}}


def frame(index, ts_ms, dur_ms, **kw):
    return X("step", ts_ms, dur_ms, cat="train,frame", args={"frame": index}, **kw)


def meta(pid, tid, what, name):
    return {"name": what, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def write(path, events, *, pid=100, dist=None, tallies=True):
    doc = {"displayTimeUnit": "ms", "baseTimeNanoseconds": BASE}
    doc["traceEvents"] = [meta(pid, 0, "process_name", "python")] + events
    other = {"mxprof_version": mxprof.__version__, "host": "vm", "pid": pid}
    if tallies:
        other |= {"dropped_events": 0, "unmatched_stops": 2, "cut_ranges": 0}
    doc["otherData"] = other
    if dist is not None:
        doc["distributedInfo"] = dist
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def rank_file(tmp_path, rank, *, pid, role="worker", host="hostA", steps=5, work_ms=8):
    events = []
    for k in range(steps):
        events += [frame(k, 10 * k, 10, pid=pid), X("forward", 10 * k + 1, work_ms, pid=pid)]
    dist = {"rank": rank, "role": role, "host": host, "pid": pid, "world_size": 2}
    return write(tmp_path / f"{role}{rank}.json", events, pid=pid, dist=dist)


def merged(tmp_path, pids=(100, 200)):
    files = [rank_file(tmp_path, r, pid=pid) for r, pid in enumerate(pids)]
    out = tmp_path / "merged.json"
    merge.merge(files, out)
    return out


# ---- identity ----


def test_merge_writes_each_rank_s_pid_in_the_merged_file(tmp_path):
    """Two ranks recorded with the same pid: merge renumbers one, and the rank
    list says which merged pid is which rank (the join no reader could make)."""
    path = merged(tmp_path, pids=(100, 100))
    info = json.loads(path.read_text())["distributedInfo"]
    assert [(r["rank"], r["pid"], r["merged_pid"]) for r in info["ranks"]] == [
        (0, 100, 100),
        (1, 100, 101),
    ]
    procs = processes.processes(mxprof.load(path))
    assert [(p.label, p.pid, p.identity.original_pid, p.rank, p.identity.host) for p in procs] == [
        ("worker 0", 100, 100, 0, "hostA"),
        ("worker 1", 101, 100, 1, "hostA"),
    ]


def test_identity_comes_from_metadata_not_from_the_display_name(tmp_path):
    """A merged file whose process names were edited to something else (and
    one named like another rank) keeps each process's role and rank."""
    path = merged(tmp_path)
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            e["args"]["name"] = "server 7 (elsewhere, pid 1)"
    path.write_text(json.dumps(doc))
    procs = processes.processes(mxprof.load(path))
    assert [(p.role, p.rank, p.label) for p in procs] == [("worker", 0, "worker 0"),
                                                          ("worker", 1, "worker 1")]  # fmt: skip
    assert [p.name for p in procs] == ["server 7 (elsewhere, pid 1)"] * 2


def test_a_file_merged_before_merged_pid_is_joined_by_pid(tmp_path):
    path = merged(tmp_path)
    doc = json.loads(path.read_text())
    for r in doc["distributedInfo"]["ranks"]:
        del r["merged_pid"]
    path.write_text(json.dumps(doc))
    assert [p.label for p in processes.processes(mxprof.load(path))] == ["worker 0", "worker 1"]


def test_merge_names_processes_by_the_model_s_rule(tmp_path):
    path = merged(tmp_path)
    trace = mxprof.load(path)
    assert trace.process_names == {100: "worker 0 (hostA, pid 100)",
                                   200: "worker 1 (hostA, pid 200)"}  # fmt: skip
    ident = processes.Identity(100, 100, "worker", 0, "hostA")
    assert processes.display_name(ident) == "worker 0 (hostA, pid 100)"


def test_two_inputs_of_one_rank_get_labels_apart(tmp_path):
    a = rank_file(tmp_path, 0, pid=100)
    b = write(tmp_path / "again.json", [frame(0, 0, 10, pid=101)], pid=101,
              dist={"rank": 0, "role": "worker", "pid": 101})  # fmt: skip
    labels = [p.label for p in processes.job([mxprof.load(a), mxprof.load(b)])]
    assert labels == ["worker 0 (pid 100, worker0.json)", "worker 0 (pid 101, again.json)"]


def test_the_model_is_built_once_per_trace(tmp_path):
    trace = mxprof.load(rank_file(tmp_path, 0, pid=100))
    assert processes.processes(trace) is processes.processes(trace)


# ---- one label on the whole page ----


def test_labels_are_the_same_across_the_page_of_a_merged_job(tmp_path):
    pytest.importorskip("plotly")
    from mxprof.report import _sections

    path = merged(tmp_path)
    doc = json.loads(path.read_text())
    for k, pid in enumerate((100, 200)):  # memory counters, so the memory section names them
        doc["traceEvents"].append({"name": "Memory: cpu/0", "cat": "Device Storage", "ph": "C",
                                   "ts": 5000, "pid": pid, "tid": 1,
                                   "args": {"Memory: cpu/0": (k + 1) * 3 * 2**20}})  # fmt: skip
    path.write_text(json.dumps(doc))
    trace = mxprof.load(path)
    s = _sections.build([str(path)], [trace])
    assert [p.label for p in s.processes] == ["worker 0", "worker 1"]
    assert {m.process for m in s.peaks} == {"worker 0", "worker 1"}
    assert {c.process for c in s.devices} == {"worker 0", "worker 1"}
    assert s.steps is not None and s.steps.thread.endswith("of worker 0")
    assert ranks.analyze([trace]).ranks == ["worker 0", "worker 1"]
    out = tmp_path / "r.html"
    mxprof.report.report([path], out)
    import plotly.offline

    page = out.read_text().replace(plotly.offline.get_plotlyjs(), "")
    assert "(pid 100) (pid 100)" not in page and "worker 0 (hostA, pid 100) (pid" not in page
    assert "Memory peaks at 6.00 MiB" in page  # the hint, in the unit of the memory table
    assert "<td>6.00 MiB</td>" in page and " MB" not in page


# ---- one outlier rule ----


def nine_and_one(tmp_path):
    events = []
    t = 0
    for k in range(10):
        d = 11 if k == 6 else 8
        events += [frame(k, t, d), X("forward", t, d - 1)]
        t += d
    return write(tmp_path / "steps.json", events)


def test_the_steps_section_and_the_hints_agree_on_outlier_steps(tmp_path):
    """9 steps of 8 ms and one of 11 ms: the page's step chart and the
    step-variance hint flag the same step, by the same threshold."""
    pytest.importorskip("plotly")
    from mxprof.report import _sections

    path = nine_and_one(tmp_path)
    trace = mxprof.load(path)
    st = _sections.build([str(path)], [trace]).steps
    assert st.outliers == [(6, 11 * MS)] and st.threshold_ns == pytest.approx(9.6 * MS)
    (hint,) = [h for h in find_hints([trace]) if h.rule == "step-variance"]
    assert "step 6" in hint.subjects
    assert hint.title == "1 outlier step over 10: step 6 takes 1.4 x the median"
    assert hint.severity == "low"  # 3 ms over 83 ms of steps: worth knowing, not alarming
    assert "> 9.600ms" in hint.evidence[1]


def test_outliers_by_the_one_rule():
    assert processes.outliers([8] * 9 + [11]) == (8.0, 9.6, [9])
    assert processes.outliers([10, 10, 10, 11, 10]) == (10.0, 12.0, [])  # jitter: none
    assert processes.outliers([5]) == (5.0, 6.0, [])
    assert processes.outliers([]) == (0.0, 0.0, [])


# ---- time in no range ----


def test_time_in_no_range_per_step_and_between_steps(tmp_path):
    """Steps of 10 ms with 'forward' 6 ms: 4 ms of each in no range; 2 ms
    gaps between steps, half of each covered by 'log'."""
    events = []
    for k in range(3):
        t = 12 * k
        events += [frame(k, t, 10), X("forward", t + 2, 6)]
        if k < 2:
            events.append(X("log", t + 10, 1))
    (p,) = processes.processes(mxprof.load(write(tmp_path / "t.json", events)))
    assert {name: list(ns) for name, ns in p.steps.children.items()} == {"forward": [6 * MS] * 3}
    assert list(p.steps.in_no_range) == [4 * MS] * 3
    assert list(p.steps.between) == [1 * MS, 1 * MS]
    spans = p.no_range()  # the same time as spans: 2 + 2 ms of each step, 1 ms of each gap
    assert spans[:3] == [(0, 2 * MS), (8 * MS, 10 * MS), (11 * MS, 14 * MS)]  # log: 10-11 ms
    assert sum(b - a for a, b in spans) == sum(p.steps.in_no_range) + sum(p.steps.between)
    assert p.step_at(13 * MS) == 1 and p.step_at(11 * MS) is None


# ---- % of wall, bytes, tallies ----


def test_percent_of_wall_is_per_process_at_most_100(tmp_path):
    """Both ranks are in 'forward' 80 % of their time: 80 %, not 160 % of
    the job's wall time."""
    pytest.importorskip("plotly")
    from mxprof.report import _sections

    path = merged(tmp_path)
    s = _sections.build([str(path)], [mxprof.load(path)])
    shares = {r.name: 100 * r.total / w for r, w in zip(s.rows, s.row_walls)}
    assert shares["forward"] == pytest.approx(80.0)
    assert all(v <= 100 for v in shares.values())


def test_bytes_are_shown_in_binary_units():
    assert [format_bytes(v) for v in (999, 1024, 1_500_000, 3 * 2**30)] == [
        "999 B", "1.00 KiB", "1.43 MiB", "3.00 GiB",
    ]  # fmt: skip


def test_a_merged_file_carries_its_inputs_tallies(tmp_path):
    pytest.importorskip("plotly")
    from mxprof.report import _sections

    path = merged(tmp_path)
    other = json.loads(path.read_text())["otherData"]
    assert other["unmatched_stops"] == 4 and other["dropped_events"] == 0
    s = _sections.build([str(path)], [mxprof.load(path)])
    assert s.tallies["unmatched_stops"] == 4
    assert [p.tallies for p in s.processes] == [None, None]  # not one process's alone
    hint = next(h for h in find_hints([mxprof.load(path)]) if h.rule == "misuse")
    assert "unmatched_stops = 4" in hint.evidence[0]


def test_a_merged_file_without_tallies_is_still_mxprof_s(tmp_path):
    pytest.importorskip("plotly")
    from mxprof.report import _sections

    files = [write(tmp_path / f"{k}.json", [X("a", 0, 1, pid=k + 1)], pid=k + 1, tallies=False)
             for k in range(2)]  # fmt: skip
    merge.merge(files, tmp_path / "m.json")
    s = _sections.build(["m.json"], [mxprof.load(tmp_path / "m.json")])
    assert s.tallies == {}
    assert s.tallies_missing == "not in the trace (mxprof merge of inputs that held none)"


# ---- the CLI ----


def test_hints_as_json_and_text(tmp_path, capsys):
    path = nine_and_one(tmp_path)
    assert cli.main(["hints", "--format", "json", str(path)]) == 0
    found = json.loads(capsys.readouterr().out)
    rules = {h["rule"]: h for h in found}
    assert set(rules["step-variance"]) == {
        "rule", "severity", "title", "evidence", "suggestion", "subjects"
    }  # fmt: skip
    assert rules["step-variance"]["subjects"][0] == "step 6"
    assert cli.main(["hints", str(path)]) == 0
    text = capsys.readouterr().out
    assert "[low] 1 outlier step over 10" in text
    assert "Not checked:\n  no stack samples" in text


def test_hints_of_bad_input_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert cli.main(["hints", str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err
    assert cli.main(["hints", str(tmp_path / "missing.json")]) == 2
