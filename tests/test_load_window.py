"""load(path, window=...): the events overlapping a span of time, read from the
indexed blocks that may hold them (or a scan, or a whole load), the same events
whatever the path: those load(path).filter(start, end) keeps."""

import gzip
import json
import shutil

import pytest

import mxprof
from mxprof import _testing, cli
from mxprof.trace import _scan

BASE = 1_795_000_000_000_000_000


@pytest.fixture(autouse=True)
def _fresh():
    _testing.reset()
    yield
    _testing.reset()


def _record(path, flushes=6, per_flush=5):
    """flushes blocks of per_flush steps, each step a frame holding a task."""
    mxprof.set_config(filename=str(path), aggregate_stats=False, profile_api=False)
    d = mxprof.Domain("train")
    step, work = d.new_frame("step"), d.new_task("work")
    mxprof.set_state("run")
    for _ in range(flushes):
        for _ in range(per_flush):
            with step, work:
                sum(range(2000))  # some time inside, so that the ranges have length
        mxprof.dump(finished=False)
    mxprof.set_state("stop")
    mxprof.dump()
    return path


def seen(trace):
    return [(e.name, e.category, e.ph, e.ts, e.dur, e.pid, e.tid, e.args) for e in trace]


def steps_window(trace, first, last):
    """(start, end) ns: from step first's start to step last's start."""
    steps = sorted(e.ts for e in trace if e.name == "step")
    return steps[first], steps[last]


def test_an_indexed_window_reads_only_its_blocks_and_keeps_what_filter_keeps(tmp_path, monkeypatch):
    path = _record(tmp_path / "t.json")
    whole = mxprof.load(path)
    start, end = steps_window(whole, 12, 16)
    taken = []
    real = _scan.indexed_blocks

    def counting(f, blocks, keep):
        taken.extend(b for b in blocks if keep(b))
        return real(f, blocks, keep)

    monkeypatch.setattr(_scan, "indexed_blocks", counting)
    cut = mxprof.load(path, window=(start, end))
    expected = seen(whole.filter(start=start, end=end))
    assert seen(cut) == expected
    # Steps 12 to 16 (the window ends at 16's start) and the tasks of 12 to 15.
    assert [e[0] for e in expected].count("step") == 5 and len(expected) == 9
    assert 1 <= len(taken) <= 2  # of 6 blocks of 5 steps: those of steps 12-16
    assert cut.process_names == whole.process_names and cut.thread_names == whole.thread_names
    assert cut.metadata["mxprofIndex"] == whole.metadata["mxprofIndex"]


@pytest.mark.parametrize("how", ["gzip", "no index", "one line"])
def test_without_an_index_the_window_is_the_same(tmp_path, how):
    path = _record(tmp_path / "t.json")
    whole = mxprof.load(path)
    start, end = steps_window(whole, 3, 21)
    if how == "gzip":
        other = tmp_path / "t.json.gz"
        with open(path, "rb") as f, gzip.open(other, "wb") as g:
            shutil.copyfileobj(f, g)
    elif how == "no index":  # another writer's file in the same shape: no trailer index
        other = tmp_path / "plain.json"
        other.write_bytes(path.read_bytes().replace(b'"mxprofIndex"', b'"notAnIndex"'))
    else:  # one line: not mxprof's shape, loaded whole then cut
        other = tmp_path / "line.json"
        other.write_text(json.dumps(json.loads(path.read_text())))
    expected = seen(whole.filter(start=start, end=end))
    assert [e[0] for e in expected].count("step") == 19
    assert seen(mxprof.load(other, window=(start, end))) == expected


def test_halves_of_a_range_around_the_window_are_paired_first(tmp_path):
    """B before the window, E after: the range overlaps it and is kept whole."""
    events = [
        {"name": "outer", "ph": "B", "ts": 10, "pid": 1, "tid": 1, "cat": "c"},
        {"name": "early", "ph": "X", "ts": 20, "dur": 5, "pid": 1, "tid": 1, "cat": "c"},
        {"name": "inside", "ph": "X", "ts": 100, "dur": 5, "pid": 1, "tid": 1, "cat": "c"},
        {"name": "late", "ph": "X", "ts": 300, "dur": 5, "pid": 1, "tid": 1, "cat": "c"},
        {"ph": "E", "ts": 400, "pid": 1, "tid": 1},
        {"name": "n", "ph": "C", "ts": 102, "pid": 1, "tid": 1, "args": {"v": 3}},
    ]
    path = tmp_path / "t.json"
    lines = ",\n".join(json.dumps(e) for e in events)
    path.write_text(f'{{"baseTimeNanoseconds": {BASE}, "traceEvents": [\n{lines}\n]}}\n')
    cut = mxprof.load(path, window=(90_000, 110_000))
    assert [e.name for e in cut] == ["outer", "inside", "n"]
    assert (cut[0].ts, cut[0].dur, cut[1].ts, cut[2].ts) == (10_000, 390_000, 100_000, 102_000)
    assert seen(cut) == seen(mxprof.load(path).filter(start=90_000, end=110_000))


@pytest.mark.parametrize(
    "window, said",
    [
        ((5, 1), "the end comes before the start"),
        ((0, float("nan")), "two finite numbers"),
        ("0:1", "must be (start_ns, end_ns)"),
        ((1, 2, 3), "must be (start_ns, end_ns)"),
    ],
)
def test_a_bad_window_is_refused_with_the_reason(tmp_path, window, said):
    path = _record(tmp_path / "t.json", flushes=1)
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        mxprof.load(path, window=window)


def test_export_window_keeps_the_samples_taken_in_it(tmp_path, capsys):
    from _samples import record, spin

    path = record(tmp_path / "s.json", lambda: spin(0.3), rate=500)
    ts = sorted(s.ts for s in mxprof.load(path).samples.samples)
    assert len(ts) >= 8  # a loaded machine gives fewer than the rate asks for
    k, m = len(ts) // 4, 3 * len(ts) // 4
    lo, hi = (ts[k - 1] + ts[k]) / 2e9, (ts[m - 1] + ts[m]) / 2e9  # halfway between samples
    inside = sum(1 for t in ts if lo * 1e9 <= t <= hi * 1e9)
    assert 0 < inside < len(ts)
    out = tmp_path / "w.folded"
    assert cli.main(["export", str(path), "--format", "collapsed", "-o", str(out),
                     "--window", f"{lo!r}:{hi!r}"]) == 0  # fmt: skip
    counts = [int(line.rsplit(" ", 1)[1]) for line in out.read_text().splitlines()]
    assert sum(counts) == inside
    assert f"{inside} samples of 1 thread(s) from {path} in the window" in capsys.readouterr().err
    assert cli.main(["export", str(path), "--format", "collapsed", "-o", "-",
                     "--window", "#1:#2"]) == 2  # fmt: skip
    assert "export --window takes START:END in seconds" in capsys.readouterr().err


@pytest.mark.slow
def test_benchmark_quick_mode(tmp_path):
    import _bench

    stdout, doc = _bench.quick("load_window.py", tmp_path)
    assert set(doc["median_s"]) == {"whole load", "window, indexed", "window, no index"}
    kept = doc["kept"]
    assert 0 < kept["window, indexed"] == kept["window, no index"] < kept["whole load"]
    assert doc["blocks"] >= 5 and "window 1.0% of the run" in stdout
