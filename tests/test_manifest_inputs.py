"""A job's manifest (distributed.collect(..., shared=True)) stands for its traces in
every command that reads traces: stats, ranks, export, sql; a file that moved or
was cut since the collect is named with exit 2, never silently left out."""

import json
import os

import pytest

from mxprof import cli
from mxprof.errors import TraceFormatError
from mxprof.trace import manifest

BASE = 1_795_000_000_000_000_000
COMM = "torch.distributed"


def rank_file(path, rank, steps=6):
    """mxprof's one-event-per-line shape: steps with a forward and an all_reduce."""
    events = []
    for i in range(steps):
        t = 30_000 * i
        events += [
            {"name": "step", "cat": "train,frame", "ph": "X", "ts": t, "dur": 30_000,
             "pid": 1, "tid": 1, "args": {"frame": i}},
            {"name": "forward", "cat": "app", "ph": "X", "ts": t + 10, "dur": 3_000 + 100 * rank,
             "pid": 1, "tid": 1},
            {"name": "all_reduce(float32, 4096 B, group 0)", "cat": COMM, "ph": "X",
             "ts": t + 5_000, "dur": 15_000 - 1_000 * rank, "pid": 1, "tid": 1},
        ]  # fmt: skip
    head = {
        "baseTimeNanoseconds": BASE + rank * 1_000_000,
        "distributedInfo": {"rank": rank, "world_size": 3, "role": "worker"},
    }
    lines = ",\n".join(json.dumps(e) for e in events)
    path.write_text(json.dumps(head)[:-1] + f', "traceEvents": [\n{lines}\n]}}\n')
    return str(path)


@pytest.fixture
def job(tmp_path):
    """Three ranks' files and the manifest naming them (relative paths), with a
    fourth process missing from the job."""
    paths = [rank_file(tmp_path / f"rank{r}.json", r) for r in range(3)]
    doc = {
        manifest.KEY: manifest.VERSION,
        "created_ns": BASE,
        "inputs": [
            {
                "path": os.path.basename(p),
                "process": f"worker {r} (h, pid {r + 10})",
                "role": "worker",
                "rank": r,
                "host": "h",
                "pid": r + 10,
                "size": os.path.getsize(p),
                "uploaded": False,
            }
            for r, p in enumerate(paths)
        ],  # fmt: skip
        "missing": [
            {
                "process": "worker 3 (h, pid 13)",
                "role": "worker",
                "rank": 3,
                "why": "it died before the collect",
            }
        ],  # fmt: skip
    }
    path = tmp_path / "job.manifest.json"
    path.write_text(json.dumps(doc))
    return str(path), paths


@pytest.mark.parametrize("command", ["stats", "ranks"])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_manifest_gives_what_its_files_give(job, command, jobs, capsys):
    path, paths = job
    assert cli.main([command, "--format", "json", "--jobs", jobs, *paths]) == 0
    expected = capsys.readouterr().out
    assert cli.main([command, "--format", "json", "--jobs", jobs, path]) == 0
    out, err = capsys.readouterr()
    assert out == expected
    assert f"mxprof {command}: missing worker 3 (h, pid 13): it died before the collect" in err
    doc = json.loads(out)
    if command == "stats":
        assert doc["files"] == paths
        step = next(r for r in doc["rows"] if r["name"] == "step")
        assert step["count"] == 18
    else:
        assert len(doc["ranks"]) == 3


def test_sql_reads_a_manifest_as_its_files(job, capsys):
    pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    path, paths = job
    query = "select name, count(*) as n from slice group by name order by name"
    assert cli.main(["sql", "--format", "json", query, path]) == 0
    got = json.loads(capsys.readouterr().out)
    assert cli.main(["sql", "--format", "json", query, *paths]) == 0
    assert got == json.loads(capsys.readouterr().out)
    assert {r["name"]: r["n"] for r in got}["step"] == 18


@pytest.mark.parametrize("command", ["stats", "ranks", "export", "sql"])
@pytest.mark.parametrize("how", ["moved", "cut"])
def test_a_file_moved_or_cut_since_the_collect_is_named_with_exit_2(job, command, how, capsys):
    path, paths = job
    if how == "moved":
        os.rename(paths[1], paths[1] + ".old")
        said = f"its trace {paths[1]} is gone or moved since the collect"
    else:
        with open(paths[1], "r+b") as f:
            f.truncate(100)
        said = f"its trace {paths[1]} holds 100 bytes, fewer than the"
    argv = {
        "stats": ["stats", path],
        "ranks": ["ranks", path],
        "export": ["export", path, "--format", "parquet", "-o", str(os.path.dirname(path) + "/pq")],
        "sql": ["sql", "select count(*) from slice", path],
    }[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{path}: 1 of the manifest's 3 traces cannot be read: worker 1 (h, pid 11): " in err
    assert said in err


def test_expand_keeps_what_it_can_for_merge_and_refuses_for_the_analyses(job):
    path, paths = job
    os.unlink(paths[2])
    listed = manifest.expand([path], None)  # merge: the rest, the gone one named missing
    assert listed.paths == paths[:2]
    assert [m["process"] for m in listed.missing] == [
        "worker 3 (h, pid 13)",
        "worker 2 (h, pid 12)",
    ]
    with pytest.raises(TraceFormatError, match="worker 2 \\(h, pid 12\\): its trace"):
        manifest.expand([path], None, every=True)
