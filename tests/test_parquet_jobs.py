"""The Parquet form of several traces converted one input a task (``--jobs``,
``--engine``): the same tables in this process, on spawned processes and on a
Dask LocalCluster of 2 workers, by ``write_parquet``, ``export`` and ``sql``."""

import os

import pytest
from _isolated import isolated

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

import pyarrow.parquet as pq  # noqa: E402

from mxprof import cli  # noqa: E402
from mxprof.trace import engine, parquet  # noqa: E402

from ._sql_traces import steps, write  # noqa: E402
from .test_engine import rank_file  # noqa: E402

in_child, _run_isolated = isolated(__file__, "uses Dask, which leaves its threads behind")


def _tables(folder) -> dict:
    """Every table file of a Parquet form: its rows, in order."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".parquet"):
                path = os.path.join(root, name)
                out[os.path.relpath(path, folder)] = pq.read_table(path).to_pylist()
    return out


@pytest.fixture
def inputs(tmp_path):
    """Three ranks' files (one on one line: read whole) and a file of no rank."""
    ranks = [
        rank_file(tmp_path / f"rank{r}.json", r, seed=r, late=1, one_line=r == 2, world=4)
        for r in range(3)
    ]
    info = {"rank": 3, "world_size": 4, "role": "worker"}
    return [*ranks, str(write(tmp_path / "rank3.json", steps(pid=9), info=info))]


def test_one_input_a_task_on_spawned_processes(inputs, tmp_path):
    parquet.write_parquet(inputs, tmp_path / "one", jobs=1)
    expected = _tables(tmp_path / "one")
    slices = [r for name, rows in expected.items() if name.startswith("slice/") for r in rows]
    assert len(slices) == 3 * 72 + 5 and {r["utid"] for r in slices} == {0, 1, 2, 3}
    assert sorted(r["rank"] for r in expected["process.parquet"]) == [0, 1, 2, 3]
    assert max(r["depth"] for r in slices) == 2  # matmul in forward in step
    assert {r["step"] for r in slices} == set(range(12))
    assert sorted(expected) == [
        "counter/rank=3/data.parquet", "instant/rank=3/data.parquet", "process.parquet",
        *(f"slice/rank={r}/data.parquet" for r in range(4)), "thread.parquet",
    ]  # fmt: skip
    parquet.write_parquet(inputs, tmp_path / "two", jobs=2)
    assert _tables(tmp_path / "two") == expected


@in_child
def test_the_same_tables_on_every_engine(inputs, tmp_path, capsys):
    parquet.write_parquet(inputs, tmp_path / "one", jobs=1)
    expected = _tables(tmp_path / "one")
    assert len(expected) == 8
    cluster = engine.Dask(None, jobs=2)
    try:
        address = cluster.client.scheduler.address.replace("tcp://", "dask://")
        parquet.write_parquet(inputs, tmp_path / "dask", engine=address)
        assert _tables(tmp_path / "dask") == expected
        for how in (["--jobs", "1"], ["--jobs", "2"], ["--engine", address]):
            out = tmp_path / f"export{len(how[1])}"
            assert cli.main(["export", "--format", "parquet", *how, "-o", str(out), *inputs]) == 0
            assert _tables(out) == expected, how
        query = "select rank, name, count(*), sum(dur) from slice group by all order by all"
        outputs = []
        for how in (["--jobs", "1"], ["--jobs", "2"], ["--engine", address]):
            for folder in tmp_path.glob(".mxprof-sql-*"):
                parquet.shutil.rmtree(folder)
            assert cli.main(["sql", "--format", "csv", *how, query, *inputs]) == 0
            outputs.append(capsys.readouterr().out)
        assert outputs[0] == outputs[1] == outputs[2]
        assert "step" in outputs[0] and len(outputs[0].splitlines()) > 10
    finally:
        cluster.close()


def test_dask_in_a_process_of_its_own():
    _run_isolated("not slow")
