"""mxprof sql / mxprof.sql: queries over traces and Parquet folders, the cache,
the built-in views, the output formats and bad input."""

import csv
import io
import json
import os
import sys

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

import mxprof  # noqa: E402
from mxprof import cli  # noqa: E402
from mxprof.report import sql  # noqa: E402
from mxprof.trace import parquet  # noqa: E402

from ._sql_traces import rank, steps, write  # noqa: E402

BY_NAME = "SELECT name, count(*) AS n, sum(dur) AS total FROM slice GROUP BY name ORDER BY name"


def caches(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(sql.CACHE_PREFIX))


def test_a_query_over_a_trace_returns_its_rows(tmp_path):
    trace = write(tmp_path / "t.json", steps())
    assert mxprof.sql(BY_NAME, trace) == [
        {"name": "backward", "n": 1, "total": 3_000},
        {"name": "forward", "n": 2, "total": 4_000},
        {"name": "step", "n": 2, "total": 20_000},
    ]
    got = mxprof.sql("SELECT count(*) AS n FROM thread", [trace], arrow=True)
    assert got.column_names == ["n"] and got.to_pylist() == [{"n": 1}]


def test_the_tables_are_cached_beside_the_trace_until_it_changes(tmp_path):
    trace = write(tmp_path / "t.json", steps())
    assert mxprof.sql("SELECT count(*) AS n FROM slice", trace) == [{"n": 5}]
    [cache] = caches(tmp_path)
    manifest = tmp_path / cache / parquet.MANIFEST
    made = manifest.stat().st_mtime_ns
    assert mxprof.sql("SELECT count(*) AS n FROM slice", trace) == [{"n": 5}]
    assert manifest.stat().st_mtime_ns == made  # used again, not converted again
    write(trace, steps()[:5])  # the trace changed (its size): converted again
    assert mxprof.sql("SELECT count(*) AS n FROM slice", trace) == [{"n": 3}]
    assert caches(tmp_path) == [cache]
    st = os.stat(trace)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: converted again
    assert sql.fresh(str(tmp_path / cache), [trace]) is False


def test_a_parquet_folder_and_traces_together(tmp_path):
    e0, i0 = rank(0, 100, [(10, 5)])
    e1, i1 = rank(1, 200, [(10, 5)])
    r0 = write(tmp_path / "r0.json", e0, info=i0)
    r1 = write(tmp_path / "r1.json", e1, info=i1)
    parquet.write_parquet([r0], tmp_path / "p0")
    got = mxprof.sql("SELECT rank, count(*) AS n FROM slice GROUP BY rank ORDER BY rank",
                     [tmp_path / "p0", r1])  # fmt: skip
    assert got == [{"rank": 0, "n": 1}, {"rank": 1, "n": 1}]


def test_step_breakdown_and_time_in_no_range(tmp_path):
    trace = write(tmp_path / "t.json", steps())
    breakdown = mxprof.sql(
        "SELECT step, name, count, total_ns, share FROM step_breakdown ORDER BY step, name", trace
    )
    assert breakdown == [
        {"step": 0, "name": "backward", "count": 1, "total_ns": 3_000, "share": 0.3},
        {"step": 0, "name": "forward", "count": 1, "total_ns": 2_000, "share": 0.2},
        {"step": 1, "name": "forward", "count": 1, "total_ns": 2_000, "share": 0.2},
    ]
    idle = mxprof.sql("SELECT step, step_ns, no_range_ns FROM no_range ORDER BY step", trace)
    assert idle == [
        {"step": 0, "step_ns": 10_000, "no_range_ns": 5_000},
        {"step": 1, "step_ns": 10_000, "no_range_ns": 8_000},
    ]


def test_collective_waits_per_rank(tmp_path):
    """Two all_reduce calls: rank 1 arrives 30 µs late to the first, rank 0
    4 µs late to the second; each waits for the other (at most its call)."""
    e0, i0 = rank(0, 100, [(100, 50), (300, 10)])
    e1, i1 = rank(1, 200, [(130, 20), (296, 14)])
    paths = [write(tmp_path / "r0.json", e0, info=i0), write(tmp_path / "r1.json", e1, info=i1)]
    got = mxprof.sql("SELECT * FROM collective_waits ORDER BY rank", paths)
    assert got == [
        {"rank": 0, "role": "worker", "host": "host0", "calls": 2, "comm_ns": 60_000,
         "matched_calls": 2, "wait_ns": 30_000},
        {"rank": 1, "role": "worker", "host": "host1", "calls": 2, "comm_ns": 34_000,
         "matched_calls": 2, "wait_ns": 4_000},
    ]  # fmt: skip


def test_output_formats(tmp_path, capsys):
    trace = str(write(tmp_path / "t.json", steps()))
    assert cli.main(["sql", BY_NAME, trace, "--format", "csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows == [["name", "n", "total"], ["backward", "1", "3000"], ["forward", "2", "4000"],
                    ["step", "2", "20000"]]  # fmt: skip
    assert cli.main(["sql", BY_NAME, trace, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[2] == {"name": "step", "n": 2, "total": 20000}
    assert cli.main(["sql", BY_NAME, trace]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "n", "total"]
    assert lines[2].split() == ["backward", "1", "3000"] and lines[-1] == "(3 rows)"


def test_a_syntax_error_is_duckdbs_message_and_writes_nothing(tmp_path, capsys):
    trace = str(write(tmp_path / "t.json", steps()))
    assert cli.main(["sql", "SELEC name FROM slice", trace]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mxprof sql: Parser Error: syntax error at or near") and "SELEC" in err
    assert caches(tmp_path) == []  # nothing converted, nothing written
    with pytest.raises(sql.SqlError, match='Referenced column "nope" not found'):
        mxprof.sql("SELECT nope FROM slice", trace)


def test_only_one_select_runs(tmp_path, capsys):
    trace = str(write(tmp_path / "t.json", steps()))
    target = tmp_path / "x.csv"
    assert cli.main(["sql", f"COPY (SELECT 1) TO '{target}'", trace]) == 2
    assert "one SELECT" in capsys.readouterr().err and not target.exists()
    assert cli.main(["sql", "SELECT 1; SELECT 2", trace]) == 2
    assert "got SELECT, SELECT" in capsys.readouterr().err


def test_bad_inputs_are_named(tmp_path, capsys):
    assert cli.main(["sql", "SELECT 1", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    (tmp_path / "folder").mkdir()
    assert cli.main(["sql", "SELECT 1", str(tmp_path / "folder")]) == 2
    assert "not one of mxprof's Parquet tables" in capsys.readouterr().err


def test_an_unwritable_folder_uses_a_temporary_one(tmp_path, monkeypatch):
    trace = write(tmp_path / "t.json", steps())
    real = parquet.write_parquet

    def refuse_beside(paths, output, **how):
        if str(output).startswith(str(tmp_path)):
            raise parquet.OutputError("cannot write: refused", str(output), 13)
        return real(paths, output, **how)

    monkeypatch.setattr(parquet, "write_parquet", refuse_beside)
    assert mxprof.sql("SELECT count(*) AS n FROM slice", trace) == [{"n": 5}]
    assert caches(tmp_path) == []


def test_a_missing_extra_is_one_line_naming_the_pip_command(tmp_path, monkeypatch, capsys):
    trace = str(write(tmp_path / "t.json", steps()))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow fails
    assert cli.main(["sql", "SELECT 1", trace]) == 2
    err = capsys.readouterr().err
    assert err == 'mxprof sql: pyarrow is missing: pip install "mxprof[sql]"\n'
    assert caches(tmp_path) == []
