"""merge to .pftrace: what loads back equals the JSON merge of the same inputs,
in mxprof's reader and in Perfetto's own engine, whether an input's events
fit in one sorted run or are spilled to disk in many; and it is compact."""

import collections
import json

import _perfetto_engine
import pytest
from test_merge_stream import BASE, steps, write

import mxprof
from mxprof.trace import writer
from mxprof.trace.merge import merge
from mxprof.trace.writer import PERFETTO, encode


def info(rank, pid):
    return {
        "role": "worker",
        "rank": rank,
        "world_size": 3,
        "num_workers": 3,
        "num_servers": 0,
        "host": "node",
        "pid": pid,
        "clock": {"estimates": []},
    }


def awkward(pid, tid=2):
    """Ranges a sort gets wrong easily: a parent and child that start (and
    two that end) at one ns, back-to-back ranges, a zero-length range inside
    a range, two ranges that overlap without nesting, instants of each scope
    and a counter, all in the order they end."""

    def x(name, ts, dur, **more):
        return {"ph": "X", "name": name, "cat": "c", "ts": ts, "dur": dur, "pid": pid,
                "tid": tid, **more}  # fmt: skip

    named = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "work"}}]
    return (named if tid else []) + [  # tid 0 without a name: no thread, the process's
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "trainer"}},
        x("inner", 10, 5),
        x("zero", 12, 0),
        x("next", 15, 5),
        x("same_end", 18, 2),
        x("outer", 10, 10, args={"frame": 3, "note": "x", "ratio": 0.5, "neg": -2}),
        x("left", 30, 10),
        x("right", 35, 10),  # overlaps left without nesting in it
        {"ph": "i", "name": "mark_t", "cat": "m", "ts": 11, "pid": pid, "tid": tid, "s": "t",
         "args": {"scope": "thread"}},
        {"ph": "i", "name": "mark_p", "cat": "m", "ts": 12, "pid": pid, "tid": tid, "s": "p",
         "args": {"scope": "process"}},
        {"ph": "C", "name": "depth", "cat": "c", "ts": 16, "pid": pid, "tid": tid,
         "args": {"depth": -3}},
        x("last", 50, 1),
    ]  # fmt: skip


@pytest.fixture
def job(tmp_path):
    """A job's inputs: ranks 0 and 1 in mxprof's one-event-per-line shape (one
    gzipped, both with pid 7: merge renumbers one), rank 2 a one-line JSON
    read whole, and a .pftrace of two processes."""
    perfetto = tmp_path / "d.pftrace"
    doc = {"traceEvents": steps(11, 3.0) + awkward(12), "baseTimeNanoseconds": BASE + 7_000}
    perfetto.write_bytes(encode(doc, PERFETTO))
    return [
        write(tmp_path / "a.json", steps(7, 0.0) + awkward(7), base=BASE, info=info(0, 7)),
        write(tmp_path / "b.json.gz", steps(7, 50.0), base=BASE + 2_000_000, info=info(1, 7)),
        write(
            tmp_path / "c.json",
            awkward(9, tid=0),
            base=BASE + 5_000,
            info=info(2, 9),
            shape="one line",
        ),  # fmt: skip
        perfetto,
    ]


def ranges(trace):
    """Every range; one that overlaps its thread's ranges without nesting
    ("right") has a Perfetto track of its own, of its process: no tid."""
    return sorted(
        (
            str(e.pid),
            "" if e.name == "right" else str(e.tid),
            e.ts,
            e.dur,
            e.name,
            e.category,
            json.dumps(e.args, sort_keys=True),
        )
        for e in trace
        if e.dur is not None
    )


def counters(trace):
    """Samples by process: Perfetto keeps a counter per process (tid 0 on load)."""
    return sorted((str(e.pid), e.name, e.ts, json.dumps(e.args)) for e in trace if e.ph == "C")


def instants(trace):
    return sorted((str(e.pid), e.name, e.category, e.ts) for e in trace if e.ph == "i")


def same_as_json(tmp_path, paths, name):
    merge(paths, tmp_path / "m.json")
    summary = merge(paths, tmp_path / name)
    pf, js = mxprof.load(tmp_path / name), mxprof.load(tmp_path / "m.json")
    assert ranges(pf) == ranges(js)
    assert counters(pf) == counters(js)
    assert instants(pf) == instants(js)
    assert pf.process_names == js.process_names
    assert pf.thread_names == js.thread_names
    assert pf.base_time_ns == js.base_time_ns
    for key in ("distributedInfo", "otherData"):
        assert pf.metadata[key] == js.metadata[key]
    return pf, summary


def test_pftrace_loads_as_the_json_merge(tmp_path, job):
    pf, summary = same_as_json(tmp_path, job, "m.pftrace")
    # The inputs' events, not fewer: 4 steps x 2 ranges x 3 inputs with steps,
    # 8 awkward ranges x 3 inputs with them.
    assert len(ranges(pf)) == 4 * 2 * 3 + 8 * 3
    assert [r["rank"] for r in pf.metadata["distributedInfo"]["ranks"]] == [0, 1, 2]
    # Rank 1 had pid 7 too: renumbered, and its entry says to what.
    merged_pids = [r["merged_pid"] for r in pf.metadata["distributedInfo"]["ranks"]]
    assert merged_pids[0] == 7 and merged_pids[1] not in (7, 9, 11, 12)
    assert pf.metadata["otherData"]["merged_from"] == [str(p) for p in job]
    assert [i["path"] for i in summary["inputs"]] == [str(p) for p in job]
    # The ranges nest as in the input: outer contains inner and zero; right,
    # which overlaps left, keeps its times (on a track of its own).
    ours = {(e.name, e.ts, e.dur) for e in pf if e.pid == 7 and e.dur is not None}
    assert {("outer", 10_000, 10_000), ("inner", 10_000, 5_000), ("zero", 12_000, 0),
            ("right", 35_000, 10_000), ("left", 30_000, 10_000)} <= ours  # fmt: skip


def test_spilled_runs_write_the_same_file(tmp_path, job, monkeypatch):
    """Inputs far bigger than a run (here 5 events) go through the disk and
    give the very bytes of a merge that sorted each input in memory."""
    merge(job, tmp_path / "whole.pftrace")
    spills = []
    spill = writer.Part._spill

    def counted(part):
        spills.append(len(part.held))
        spill(part)

    monkeypatch.setattr(writer, "RUN", 5)
    monkeypatch.setattr(writer.Part, "_spill", counted)
    same_as_json(tmp_path, job, "runs.pftrace")
    assert (tmp_path / "runs.pftrace").read_bytes() == (tmp_path / "whole.pftrace").read_bytes()
    assert len(spills) > 10 and max(spills) <= 5
    # The runs' temporary files are gone: only the inputs and outputs are left.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [p.name for p in job] + ["m.json", "runs.pftrace", "whole.pftrace"]
    )


def test_windowed_pftrace_loads_as_the_windowed_json(tmp_path, job):
    """A window sends the events through dicts (the other way into the writer)."""
    window = ("seconds", 0.0, 0.0025)
    merge(job, tmp_path / "w.json", window=window)
    merge(job, tmp_path / "w.pftrace", window=window)
    pf, js = mxprof.load(tmp_path / "w.pftrace"), mxprof.load(tmp_path / "w.json")
    assert ranges(pf) == ranges(js) and len(ranges(pf)) > 10
    assert counters(pf) == counters(js)
    assert pf.metadata["otherData"]["window_ns"] == [0, 2_500_000]


def test_compact_encoding(tmp_path):
    """Interned names and time deltas: a plain range costs under 32 bytes
    (begin and end), about a third of inline names and absolute times."""
    n = 20_000
    events = [
        {"ph": "X", "name": f"layer{k % 16}", "cat": "train", "ts": k * 3.0, "dur": 2.0,
         "pid": 1, "tid": 1}
        for k in range(n)
    ]  # fmt: skip
    path = write(tmp_path / "in.json", events, base=BASE)
    merge([path], tmp_path / "out.pftrace")
    size = (tmp_path / "out.pftrace").stat().st_size
    assert size / n < 32
    assert len(ranges(mxprof.load(tmp_path / "out.pftrace"))) == n


def test_a_merged_pftrace_merges_again_as_its_json_does(tmp_path, job):
    """A merged .pftrace is an input like any other: read streaming, its
    metadata (the job's distributedInfo) reaches the next merge as the JSON's."""
    merge(job[:2], tmp_path / "first.pftrace")
    merge(job[:2], tmp_path / "first.json")
    merge([tmp_path / "first.pftrace"], tmp_path / "again.pftrace")
    merge([tmp_path / "first.json"], tmp_path / "again.json")
    pf, js = mxprof.load(tmp_path / "again.pftrace"), mxprof.load(tmp_path / "again.json")
    assert ranges(pf) == ranges(js) == ranges(mxprof.load(tmp_path / "first.json"))
    pf_info, js_info = pf.metadata["distributedInfo"], js.metadata["distributedInfo"]
    assert [r.pop("file") for r in pf_info["ranks"]] == ["first.pftrace"]
    assert [r.pop("file") for r in js_info["ranks"]] == ["first.json"]
    assert pf_info == js_info
    assert pf_info["world_size"] == 3


# ---- Perfetto's own engine ----


@pytest.fixture(scope="module")
def engine():
    try:
        started = _perfetto_engine.Engine.start()
    except _perfetto_engine.Unavailable as e:
        pytest.skip(str(e))
    yield started
    started.close()


SLICES = """
select s.ts, s.dur, s.name, s.depth, t.tid, p.name as process
from slice s
left join thread_track tt on s.track_id = tt.id
left join thread t using (utid)
left join process_track pt on s.track_id = pt.id
left join process p on p.upid = coalesce(t.upid, pt.upid)
where s.dur >= 0
"""
COUNTERS = """
select c.ts, c.value, t.name from counter c join counter_track t on c.track_id = t.id
"""


def seen(engine, path):
    """The load's errors and data losses, slices and counter samples."""
    assert engine.load(path) == []
    problems = engine.query(
        "select name, value from stats where value > 0 and severity in ('error', 'data_loss')"
    )
    # Times from the trace's start (a .pftrace's clock counts from a base of its own).
    start = engine.query("select start_ts from trace_bounds")[0]["start_ts"]
    slices = engine.query(SLICES)
    return (
        {r["name"]: r["value"] for r in problems},
        sorted(
            (r["ts"] - start, r["dur"], r["name"], r["depth"], r["tid"], r["process"])
            for r in slices
        ),
        sorted((r["ts"] - start, r["value"], r["name"]) for r in engine.query(COUNTERS)),
    )


def test_perfetto_engine_shows_the_json_merge(engine, tmp_path, job):
    """The same slices (times, names, processes; depths and threads where
    both have threads) and counter samples in Perfetto's engine as the JSON
    merge of the same (JSON) inputs, but for the ranges that overlap their
    thread's without nesting: the viewer drops them from JSON, and shows
    them from .pftrace on tracks of their own."""
    merge(job[:3], tmp_path / "m.json")
    merge(job[:3], tmp_path / "m.pftrace")
    pf_problems, pf_slices, pf_counters = seen(engine, tmp_path / "m.pftrace")
    js_problems, js_slices, js_counters = seen(engine, tmp_path / "m.json")
    assert pf_problems == {}
    assert set(js_problems) == {"slice_drop_overlapping_complete_event"}
    # Where both have threads, the same slices at the same depths; rank 2's
    # ranges on tid 0 without a thread name are no thread's in .pftrace (a
    # track each), where the JSON importer makes a thread of them.
    no_thread = "worker 2 (node, pid 9)"

    def threaded(slices):
        return [s for s in slices if s[4] is not None and s[5] != no_thread and s[2] != "right"]

    assert threaded(pf_slices) == threaded(js_slices)
    # 32 ranges less rank 2's 8 and rank 0's "right", and rank 0's thread instant
    assert len(threaded(pf_slices)) == 32 - 8 - 1 + 1
    assert collections.Counter(
        (s[0], s[1], s[2], s[5]) for s in pf_slices if s[2] != "right"
    ) == collections.Counter((s[0], s[1], s[2], s[5]) for s in js_slices if s[2] != "right")
    # Each "right" where it was, in its process, on no thread.
    right = [(s[1], s[4], s[5]) for s in pf_slices if s[2] == "right"]
    assert right == [(10_000, None, "worker 0 (node, pid 7)"), (10_000, None, no_thread)]
    # JSON's counter tracks are named "event key", Perfetto's by their own name.
    assert [(ts, v, f"{n} {n}") for ts, v, n in pf_counters] == js_counters
    assert len(pf_counters) == 4 * 2 + 2
