"""mxprof export --format parquet: the tables, their values, the merged clock, bad input."""

import json
import sys

import pytest

pytest.importorskip("pyarrow")
duckdb = pytest.importorskip("duckdb")

import mxprof  # noqa: E402
from mxprof import cli  # noqa: E402
from mxprof.errors import OutputError, TraceFormatError  # noqa: E402
from mxprof.trace import _scan, parquet  # noqa: E402
from mxprof.trace.processes import processes  # noqa: E402

from ._sql_traces import rank, steps, write  # noqa: E402


def table(folder, name, query="SELECT * FROM t ORDER BY ALL"):
    """Rows of one exported table as dicts (query over the view t)."""
    con = duckdb.connect()
    if name in parquet.PARTITIONED:
        con.execute(
            f"CREATE VIEW t AS SELECT * FROM read_parquet('{folder}/{name}/**/*.parquet', "
            "hive_partitioning = true)"
        )
    else:
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{folder}/{name}.parquet')")
    cur = con.execute(query)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def test_slices_have_depth_step_and_thread_in_ns(tmp_path):
    trace = write(tmp_path / "t.json", steps())
    manifest = parquet.write_parquet([trace], tmp_path / "out")
    assert manifest["tables"] == {"slice": 5, "counter": 1, "instant": 1, "thread": 1, "process": 1}
    rows = table(
        tmp_path / "out", "slice",
        "SELECT ts, dur, name, category, depth, step, step_number, thread, pid, tid, args, rank "
        "FROM t ORDER BY ts",
    )  # fmt: skip
    got = [(r["ts"], r["dur"], r["name"], r["depth"], r["step"], r["step_number"]) for r in rows]
    assert got == [
        (0, 10_000, "step", 0, 0, 0),
        (1_000, 2_000, "forward", 1, 0, None),
        (4_000, 3_000, "backward", 1, 0, None),
        (10_000, 10_000, "step", 0, 1, 1),
        (11_000, 2_000, "forward", 1, 1, None),
    ]
    assert {(r["thread"], r["pid"], r["tid"], r["rank"]) for r in rows} == {("MainThread", 7, 1, 0)}
    assert json.loads(rows[0]["args"]) == {"frame": 0} and rows[1]["args"] is None
    counter = table(tmp_path / "out", "counter")
    assert [(c["ts"], c["name"], c["value"], c["step"]) for c in counter] == [
        (12_000, "queue", 3.0, 1)
    ]
    instant = table(tmp_path / "out", "instant")
    assert [(i["ts"], i["name"], i["scope"], i["step"]) for i in instant] == [
        (12_000, "mark", "process", 1)
    ]
    assert table(tmp_path / "out", "thread")[0]["name"] == "MainThread"
    assert table(tmp_path / "out", "process")[0]["name"] == "python"
    # Partitioned by rank, hive style.
    assert [p.name for p in (tmp_path / "out" / "slice").iterdir()] == ["rank=0"]


def test_row_groups_flushed_early_give_the_same_tables(tmp_path, monkeypatch):
    """Events written block by block as they come (tiny blocks, a tiny
    buffer): the same rows as when written in one go."""
    trace = write(tmp_path / "t.json", steps())
    parquet.write_parquet([trace], tmp_path / "whole")
    written = []
    real = parquet._Rows._write

    def counted(self, name, columns):
        written.append(name)
        real(self, name, columns)

    monkeypatch.setattr(_scan, "BLOCK", 64)  # a few events per block
    monkeypatch.setattr(parquet, "_ROWS", 1)
    monkeypatch.setattr(parquet._Rows, "_write", counted)
    parquet.write_parquet([trace], tmp_path / "small")
    assert written.count("slice") >= 3  # several row groups, not one
    for name in parquet.PARTITIONED:
        assert table(tmp_path / "small", name) == table(tmp_path / "whole", name)


def test_b_e_pairs_of_another_tool_nest_too(tmp_path):
    """A file read the general way (a bare array of B/E events, start order)."""
    ev = [
        {"name": "outer", "ph": "B", "ts": 0, "pid": 1, "tid": 2},
        {"name": "inner", "ph": "B", "ts": 1, "pid": 1, "tid": 2},
        {"name": "inner", "ph": "E", "ts": 2, "pid": 1, "tid": 2},
        {"name": "outer", "ph": "E", "ts": 5, "pid": 1, "tid": 2},
        {"name": "other", "ph": "X", "ts": 6, "dur": 0, "pid": 1, "tid": 2},
    ]
    trace = write(tmp_path / "t.json", ev, lines=False)
    parquet.write_parquet([trace], tmp_path / "out")
    rows = table(tmp_path / "out", "slice", "SELECT name, ts, dur, depth FROM t ORDER BY ts")
    assert rows == [
        {"name": "outer", "ts": 0, "dur": 5000, "depth": 0},
        {"name": "inner", "ts": 1000, "dur": 1000, "depth": 1},
        {"name": "other", "ts": 6000, "dur": 0, "depth": 0},
    ]


def test_ranks_on_the_merged_clock_partitioned_by_rank(tmp_path):
    """Rank 1's clock runs 5 µs ahead of rank 0's: its events move by 5 µs."""
    e0, i0 = rank(0, 100, [(10, 5)])
    e1, i1 = rank(1, 200, [(10, 5)], offset_ns=5_000)
    paths = [write(tmp_path / "r0.json", e0, info=i0), write(tmp_path / "r1.json", e1, info=i1)]
    parquet.write_parquet(paths, tmp_path / "out")
    rows = table(
        tmp_path / "out", "slice", "SELECT rank, role, host, pid, ts, file FROM t ORDER BY rank"
    )
    assert rows == [
        {"rank": 0, "role": "worker", "host": "host0", "pid": 100, "ts": 10_000, "file": "r0.json"},
        {"rank": 1, "role": "worker", "host": "host1", "pid": 200, "ts": 15_000, "file": "r1.json"},
    ]
    assert sorted(p.name for p in (tmp_path / "out" / "slice").iterdir()) == ["rank=0", "rank=1"]
    procs = table(tmp_path / "out", "process", "SELECT upid, rank, host FROM t ORDER BY upid")
    assert procs == [
        {"upid": 0, "rank": 0, "host": "host0"},
        {"upid": 1, "rank": 1, "host": "host1"},
    ]


def test_steps_and_identity_are_the_process_models(tmp_path):
    """A main thread's 5 steps and a loader thread's 3 batch frames inside
    them: the process model's steps are the main thread's (most ranges), so
    a range in step k is in step k for SQL too, not in no step because a
    batch frame began later; the host the trace names is the process's."""
    x = {"ph": "X", "pid": 7}
    events = []
    for k in range(5):
        events.append({**x, "tid": 1, "name": "fwd", "cat": "train", "ts": 100 * k + 30, "dur": 5})
        events.append({**x, "tid": 1, "name": "step", "cat": "train,frame", "ts": 100 * k,
                       "dur": 80, "args": {"frame": k}})  # fmt: skip
        if k < 3:
            events.append({**x, "tid": 2, "name": "batch", "cat": "load,frame",
                           "ts": 100 * k + 10, "dur": 10, "args": {"frame": 50 + k}})  # fmt: skip
    trace = write(tmp_path / "t.json", events)
    text = trace.read_text().replace('"otherData": {}', '"otherData": {"host": "hostA"}')
    trace.write_text(text)
    p = processes(mxprof.load(trace))[0]
    assert p.steps is not None and (p.steps.name, p.steps.index) == ("step", [0, 1, 2, 3, 4])
    assert p.identity.host == "hostA"
    parquet.write_parquet([trace], tmp_path / "out")
    rows = table(
        tmp_path / "out", "slice",
        "SELECT ts, step, step_number, host FROM t WHERE name = 'fwd' OR name = 'batch' "
        "ORDER BY ts",
    )  # fmt: skip
    assert [(r["ts"], r["step"], r["step_number"]) for r in rows] == [
        (10_000, 0, 50), (30_000, 0, None), (110_000, 1, 51), (130_000, 1, None),
        (210_000, 2, 52), (230_000, 2, None), (330_000, 3, None), (430_000, 4, None),
    ]  # fmt: skip
    assert {r["host"] for r in rows} == {"hostA"}
    assert [p.step_at(r["ts"]) for r in rows] == [r["step"] for r in rows]


@pytest.mark.parametrize("command", ["merge", "export", "sql"])
def test_inputs_that_are_not_one_job_are_refused_by_every_command(tmp_path, command, capsys):
    """The same rank in two inputs, or two world sizes: merge.one_job, the
    check ``mxprof ranks`` makes, refuses them in merge, export and sql too,
    with exit 2 and nothing written."""
    e0, i0 = rank(0, 100, [(10, 5)])
    e1, i1 = rank(0, 200, [(10, 5)])
    a, b = write(tmp_path / "a.json", e0, info=i0), write(tmp_path / "b.json", e1, info=i1)
    other = write(tmp_path / "c.json", e1, info={**i1, "rank": 1, "world_size": 4})
    run = {
        "merge": lambda *ins: ["merge", *ins, "-o", str(tmp_path / "m.json")],
        "export": lambda *ins: ["export", "--format", "parquet", *ins, "-o", str(tmp_path / "o")],
        "sql": lambda *ins: ["sql", "select count(*) from slice", *ins],
    }[command]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli.main(run(str(a), str(b))) == 2
    err = capsys.readouterr().err
    assert f"worker 0 is in two inputs, {a} and {b}: give each rank once" in err
    assert cli.main(run(str(a), str(other))) == 2
    assert "inputs of different jobs: a.json says world_size 2, c.json says 4" in (
        capsys.readouterr().err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_existing_folder_of_tables_is_replaced_anything_else_refused(tmp_path, capsys):
    trace = write(tmp_path / "t.json", steps())
    out = tmp_path / "out"
    assert cli.main(["export", str(trace), "--format", "parquet", "-o", str(out)]) == 0
    assert "5 slice" in capsys.readouterr().err
    write(tmp_path / "t.json", steps()[:5])  # one step only now
    assert cli.main(["export", str(trace), "--format", "parquet", "-o", str(out)]) == 0
    assert len(table(out, "slice")) == 3
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a folder of mxprof's Parquet tables"):
        parquet.write_parquet([trace], other)
    assert cli.main(["export", str(trace), "--format", "parquet", "-o", str(other)]) == 2
    assert (other / "keep.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mxprof-parquet-")]


def test_a_missing_extra_names_the_pip_command(tmp_path, monkeypatch, capsys):
    trace = write(tmp_path / "t.json", steps())
    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb fails
    assert cli.main(["export", str(trace), "--format", "parquet", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install "mxprof[sql]"' in err
    assert not (tmp_path / "o").exists()


def test_the_samples_formats_still_take_one_trace(tmp_path, capsys):
    trace = write(tmp_path / "t.json", steps())
    assert cli.main(["export", str(trace), str(trace), "--format", "collapsed", "-o", "-"]) == 2
    assert "exports one trace" in capsys.readouterr().err


def test_damage_past_the_first_blocks_is_named_and_writes_nothing(tmp_path, monkeypatch):
    trace = write(tmp_path / "t.json", steps())
    text = trace.read_text()
    trace.write_text(text.replace('"ts": 11,', '"ts": 1x1,'))  # a late event's line
    monkeypatch.setattr(_scan, "BLOCK", 64)  # the damage is blocks after the first rows
    monkeypatch.setattr(parquet, "_ROWS", 1)
    with pytest.raises(TraceFormatError, match="t.json: damaged past its first blocks"):
        parquet.write_parquet([trace], tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_ranges_in_start_order_take_the_general_depth(tmp_path, monkeypatch):
    """mxprof's files hold ranges in the order they ended (one backwards pass);
    other tools write them in start order: depth then comes from DuckDB, the
    same numbers."""
    calls = []
    real = parquet._duckdb_depths

    def counted(duckdb, raw):
        calls.append(raw)
        return real(duckdb, raw)

    monkeypatch.setattr(parquet, "_duckdb_depths", counted)
    ended = write(tmp_path / "ended.json", steps())
    parquet.write_parquet([ended], tmp_path / "a")
    assert calls == []
    started = sorted(steps(), key=lambda e: (e.get("ts", -1), -e.get("dur", 0)))
    parquet.write_parquet([write(tmp_path / "started.json", started)], tmp_path / "b")
    assert len(calls) == 1
    query = "SELECT ts, name, depth, step FROM t ORDER BY ts, depth"
    assert table(tmp_path / "b", "slice", query) == table(tmp_path / "a", "slice", query)
