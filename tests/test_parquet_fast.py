"""The Parquet form the compiled way (rows as columns, depth in C) against the pure way.

Every trace here is converted twice, with ``MXPROF_PURE_READER=1`` (events
one by one, depth in Python) and without (the compiled reader's rows, the
C depth pass), in small blocks and small batches so that rows, runs of
text, flushes and row groups meet at every boundary; every table must come
out the same, row for row, column for column.  The traces: ones the live
core writes (frames, counters, markers, memory scopes, args), ranks on
clocks with an offset and with a drift, lines in the core's shape mixed
with hostile ones and B/E pairs, and a file cut short.

Run under AddressSanitizer by native/offline/asan.sh.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

import pyarrow.parquet as pq  # noqa: E402

from mxprof.errors import TraceFormatError  # noqa: E402
from mxprof.trace import _fastread, _scan, parquet  # noqa: E402
from mxprof.trace.merge import timeline  # noqa: E402

from ._sql_traces import BASE, rank, steps, write  # noqa: E402
from .test_fastjson import GOOD, HOSTILE, _record  # noqa: E402
from .test_fastjson import _write as write_lines  # noqa: E402

pytestmark = pytest.mark.skipif(not _fastread.available(), reason="_fastjson is not built")


@pytest.fixture
def small(monkeypatch):
    """Small blocks and batches; the rows the compiled way took, counted."""
    monkeypatch.setattr(_scan, "BLOCK", 700)
    monkeypatch.setattr(parquet, "_ROWS", 37)
    taken: list[int] = []
    take = parquet._Rows.take_rows

    def spy(self, block):
        taken.append(len(block))
        take(self, block)

    monkeypatch.setattr(parquet._Rows, "take_rows", spy)
    return taken


def _tables(paths, folder: Path, pure: bool, monkeypatch) -> dict:
    """Every table of the paths' Parquet form (or the error), one way."""
    monkeypatch.setenv("MXPROF_PURE_READER", "1" if pure else "0")
    try:
        manifest = parquet.write_parquet(paths, folder)
    except TraceFormatError as e:
        return {"error": str(e)}
    out: dict = {"counts": manifest["tables"]}
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".parquet"):
                table = pq.read_table(os.path.join(root, name))
                out[os.path.relpath(os.path.join(root, name), folder)] = (
                    table.schema,
                    table.to_pylist(),
                )
    return out


def _same(paths, tmp_path: Path, monkeypatch) -> dict:
    """Convert both ways; assert every table equal; return the compiled way's."""
    pure = _tables(paths, tmp_path / "pure", True, monkeypatch)
    fast = _tables(paths, tmp_path / "fast", False, monkeypatch)
    assert fast.keys() == pure.keys()
    for name in pure:
        assert fast[name] == pure[name], name
    return fast


def _rows(got: dict, table: str) -> list[dict]:
    return [r for name in got if name.startswith(table + "/") for r in got[name][1]]


def test_a_core_trace_gives_the_same_tables(tmp_path, monkeypatch, small):
    path = tmp_path / "core.json"
    _record(path, 120)
    got = _same([path], tmp_path, monkeypatch)
    assert sum(small) > 120 * 8  # the compiled way took most rows: not a vacuous comparison
    slices = _rows(got, "slice")
    assert got["counts"]["slice"] == len(slices) > 120 * 6
    assert max(r["depth"] for r in slices) >= 2  # backward inside forward inside step
    assert {r["step"] for r in slices if r["name"] == "backward"} == set(range(120))
    assert sorted(r["step_number"] for r in slices if r["name"] == "step") == list(range(120))
    counters = _rows(got, "counter")
    assert {r["name"] for r in counters} >= {"loss"} and len(counters) >= 120
    assert any(r["scope"] == "fwd:" for r in counters)  # a Scope Storage counter
    assert len(_rows(got, "instant")) >= 120  # the markers
    assert any(r["args"] for r in slices)  # the frames' args


def test_ranks_with_an_offset_and_a_drift(tmp_path, monkeypatch, small):
    info = {"role": "worker", "rank": 0, "host": "h0", "pid": 7, "world_size": 3,
            "clock": {"estimates": []}}  # fmt: skip
    paths = [write(tmp_path / "rank0.json", steps(pid=7), info=info)]
    events, info = rank(1, 200, [(10 + 30 * k, 5 + k) for k in range(40)], offset_ns=5_000)
    info["world_size"] = 3
    paths.append(write(tmp_path / "rank1.json", events + steps(pid=200, tid=2), info=info))
    events, info = rank(2, 300, [(10 + 30 * k, 5) for k in range(40)])
    info["rank"], info["host"], info["world_size"] = 2, "host2", 3
    info["clock"]["estimates"] = [  # the offset grows: a drift, mapped per event
        {"at_ns": BASE, "offset_ns": 1_000, "error_ns": 10, "samples": 1},
        {"at_ns": BASE + 10**9, "offset_ns": 900_000, "error_ns": 10, "samples": 1},
    ]
    paths.append(write(tmp_path / "rank2.json", events, info=info))
    from mxprof.trace.parquet import _metadata

    moves = [m for _, m in timeline([(str(p), _metadata(str(p))) for p in paths])]
    assert [m(0) != 0 for m in moves] == [False, True, True]
    assert not moves[2].clock.constant  # the drifting input goes the per-event way
    got = _same(paths, tmp_path, monkeypatch)
    # Rows the compiled way, but for the marker with "s" (a run, for the pure decoding).
    assert sum(small) == sum(got["counts"][t] for t in ("slice", "counter", "instant")) - 2
    assert sorted(r["rank"] for r in got["process.parquet"][1]) == [0, 1, 2]
    ranks = {name.split("/")[1] for name in got if name.startswith("slice/")}
    assert ranks == {"rank=0", "rank=1", "rank=2"}


def test_hostile_lines_and_b_e_pairs_mixed_in(tmp_path, monkeypatch, small):
    pairs = [
        '{"name":"B1","cat":"c","ph":"B","ts":20,"pid":1,"tid":1}',
        '{"name":"B2","cat":"c","ph":"B","ts":21,"pid":1,"tid":1,"args":{"a":1}}',
        '{"name":"B2","cat":"c","ph":"E","ts":22,"pid":1,"tid":1,"args":{"b":"x"}}',
        '{"name":"B1","cat":"c","ph":"E","ts":23,"pid":1,"tid":1}',
        '{"name":"step","cat":"t,frame","ph":"X","ts":19,"dur":10,"pid":1,"tid":1,'
        '"args":{"frame":3}}',
        '{"name":"ProfilerStep#7","cat":"","ph":"X","ts":30,"dur":5,"pid":1,"tid":4}',
        '{"name":"sc","cat":"c","ph":"X","ts":31,"dur":1,"pid":1,"tid":4,"args":{"scope":"s:"}}',
        '{"name":"two","cat":"c","ph":"C","ts":32,"pid":1,"tid":4,"args":{"x":1,"y":2.5,"z":"q"}}',
        '{"name":"Scope","cat":"Scope Storage","ph":"C","ts":33,"pid":1,"tid":4,'
        '"args":{"Scope":7}}',
    ]
    # (An event over several lines is damage to the block reader: not here.)
    good, hostile = ([line for line in ls if "\n" not in line] for ls in (GOOD, HOSTILE))
    outcomes = set()
    for seed in range(6):
        rng = random.Random(seed)
        lines = [rng.choice(good + pairs) for _ in range(150)]
        for _ in range(6):
            lines.insert(rng.randrange(len(lines)), rng.choice(hostile))
        path = tmp_path / f"mixed{seed}.json"
        write_lines(path, lines)
        got = _same([path], tmp_path / str(seed), monkeypatch)
        outcomes.add("error" in got)
        assert "error" in got or got["counts"]["slice"] > 50
    assert outcomes == {False}  # every mix read (hostile lines are runs, not damage)


def test_a_cut_file_and_damage(tmp_path, monkeypatch):
    path = tmp_path / "core.json"
    _record(path, 80)
    text = path.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) * 2 // 3])
    monkeypatch.setattr(_scan, "BLOCK", 700)
    whole = _same([path], tmp_path / "whole", monkeypatch)["counts"]["slice"]
    # Found cut at its end: read again whole, the general way (a batch not yet written).
    assert 0 < _same([cut], tmp_path / "cut", monkeypatch)["counts"]["slice"] < whole
    # ... or, rows written already, refused the same way both ways.
    monkeypatch.setattr(parquet, "_ROWS", 37)
    assert "damaged past" in _same([cut], tmp_path / "cut2", monkeypatch)["error"]
    damaged = tmp_path / "damaged.json"
    damaged.write_bytes(text[:300] + b'{"name":"x","ts":NaN},\n' + text[300:])
    assert "error" in _same([damaged], tmp_path / "damaged", monkeypatch)


def test_the_c_depth_pass_is_the_python_one():
    rng = random.Random(5)
    for trial in range(40):
        # Ranges per thread in the order they ended, met backwards (as _finish
        # meets them), over several calls; sometimes one out of order.
        rows = []
        for thread in range(3):
            clock, open_ = 0, []
            ended = []
            for _ in range(rng.randrange(1, 60)):
                if open_ and rng.random() < 0.5:
                    start = open_.pop()
                    ended.append((thread, start, clock - start))
                elif rng.random() < 0.2:
                    ended.append((thread, clock, 0))
                else:
                    open_.append(clock)
                clock += rng.randrange(0, 3)
            ended += [(thread, s, clock - s) for s in reversed(open_)]
            rows += ended
        rows.reverse()
        if trial % 5 == 4 and len(rows) > 2:
            rows[0], rows[-1] = rows[-1], rows[0]
        compiled = _fastread.Depths()
        stacks: dict = {}
        last: dict = {}
        cut = rng.randrange(len(rows) + 1)
        for part in (rows[:cut], rows[cut:]):
            t, s, d = (np.array(c, dtype=np.int64).reshape(-1) for c in zip(*part or [(0, 0, 0)]))
            if not part:
                t, s, d = t[:0], s[:0], d[:0]
            out = np.zeros(len(part), dtype=np.int32)
            try:
                want = parquet._depths(t.tolist(), s.tolist(), d.tolist(), stacks, last)
            except parquet._Unordered:
                assert not compiled.run(t, s, d, out)
                break
            assert compiled.run(t, s, d, out)
            assert out.tolist() == want
    one, out = np.array([1]), np.zeros(1, np.int32)
    with pytest.raises(ValueError):  # a negative thread id
        _fastread.Depths().run(np.array([-1]), one, one, out)
    with pytest.raises(ValueError):  # columns of different lengths
        _fastread.Depths().run(np.array([0, 1]), one, one, out)


def test_step_numbers_are_steps_number_in_file_order(tmp_path, monkeypatch, small):
    """Frames with and without a frame arg (an int, a bool, text), ProfilerStep#N,
    on several threads and processes, across batches: each range's step_number
    is steps.number of its args and its place among its thread's of its name."""
    from mxprof.trace.steps import group, number

    rng = random.Random(3)
    events, order, expected = [], {}, []
    for i in range(600):
        e = {"name": "x", "cat": "c", "ph": "X", "ts": i, "dur": rng.randint(0, 5),
             "pid": rng.choice([1, 2]), "tid": rng.choice([1, 2, 3])}  # fmt: skip
        kind = rng.randrange(6)
        if kind == 0:
            e.update(name="it", cat="t,frame")
        elif kind == 1:
            e.update(name="it", cat="t,frame", args={"frame": rng.choice([i, True, "s", 7])})
        elif kind == 2:
            e.update(name=f"ProfilerStep#{rng.randrange(50)}", cat=rng.choice(["", "op"]))
        elif kind == 3:
            e.update(name="ProfilerStep#x", cat="")
        events.append(e)
        if group(e["name"], e["cat"]) is not None:
            key = (e["pid"], e["tid"], e["name"])
            n = order.get(key, 0)
            order[key] = n + 1
            expected.append((e["pid"], e["tid"], e["name"], e["ts"] * 1000,
                             number(e["name"], e.get("args", {}), n)))  # fmt: skip
    path = tmp_path / "steps.json"
    write_lines(path, [json.dumps(e, separators=(",", ":")) for e in events])
    got = _same([path], tmp_path, monkeypatch)
    assert sum(small) > 500  # (a bool arg is no row: the Python way takes it)
    rows = [r for r in _rows(got, "slice") if r["step_number"] is not None]
    found = sorted((r["pid"], r["tid"], r["name"], r["ts"], r["step_number"]) for r in rows)
    assert found == sorted(expected) and len(expected) > 250
