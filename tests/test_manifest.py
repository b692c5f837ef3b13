"""collect(shared=True): a manifest of where every process's trace lies, merged later."""

import json
import os
import socket
import sys
import time

import pytest

import mxprof
from mxprof import _testing
from mxprof.cli import main
from mxprof.errors import TraceFormatError
from mxprof.trace import manifest
from mxprof.trace.merge import merge

zmq = pytest.importorskip("zmq", reason="the ZeroMQ transport needs pyzmq (mxprof[dist])")

from mxprof import distributed  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # spawned children import it
import _dist_job  # noqa: E402
from _dist_job import wait_for  # noqa: E402


@pytest.fixture
def job(tmp_path):
    yield from _dist_job.job(tmp_path)


def _ticks_by_role(merged):
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    out = {}
    # X events, or B/E pairs where an input was a .pftrace (begins and ends)
    for e in _testing.events(merged, "X", "tick") + _testing.events(merged, "B", "tick"):
        out.setdefault(names[e["pid"]].split(" (")[0], []).append(e)
    return out


def _start(job, tmp_path, server_file="trace.json"):
    distributed.init("worker", 0, 2, 1, address=job.address, timeout=20)
    job.start("server", 0, 2, 1)
    job.start("worker", 1, 2, 1, run_locally=True)
    mxprof.set_config(filename="trace.json", aggregate_stats=True)
    mxprof.set_config(filename=server_file, aggregate_stats=True, profile_process="server")
    mxprof.set_state("run", profile_process="server")
    mxprof.set_state("run")
    tick = mxprof.Domain("worker").new_task("tick")
    for _ in range(10):
        with tick:
            time.sleep(0.002)
    assert wait_for(lambda: (tmp_path / "worker1.ticked").exists(), 20)

    def server_ticked():
        stats = distributed.dumps(format="json")
        text = next(t for who, t in stats.items() if who.startswith("server"))
        return json.loads(text).get("Time", {}).get("server", {}).get("tick", {}).get("Count", 0)

    assert wait_for(server_ticked, 20)  # a loaded machine may not have run its loop yet


def test_a_shared_collect_names_each_file_and_a_later_merge_puts_the_job_on_one_clock(
    job, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    _start(job, tmp_path)
    summary = distributed.collect(str(tmp_path / "job.manifest.json"), shared=True)
    assert summary["missing"] == []
    doc = json.loads((tmp_path / "job.manifest.json").read_text())
    assert doc[manifest.KEY] == manifest.VERSION
    host = socket.gethostname()
    by = {(e["role"], e["rank"]): e for e in doc["inputs"]}
    assert sorted(by) == [("server", 0), ("worker", 0), ("worker", 1)]
    # Every file is this host's: named where it lies, nothing uploaded.
    assert {e["uploaded"] for e in doc["inputs"]} == {False}
    assert by[("worker", 0)]["path"] == str(tmp_path / "trace.json")
    assert by[("worker", 1)]["path"] == str(tmp_path / "worker1_trace.json")
    assert by[("server", 0)]["path"] == str(tmp_path / "rank0_trace.json")
    assert by[("worker", 0)]["pid"] == os.getpid() and by[("worker", 0)]["host"] == host
    assert not (tmp_path / "job.manifest.json.uploads").exists()
    for e in doc["inputs"]:  # the size each file had at the collect, flushed then
        assert 0 < e["size"] <= os.path.getsize(e["path"])
    # Later, anywhere: merge the manifest.
    assert main(["merge", str(tmp_path / "job.manifest.json"), "-o", str(tmp_path / "m.json")]) == 0
    merged = _testing.load_trace(tmp_path / "m.json")
    ticks = _ticks_by_role(merged)
    assert sorted(ticks) == ["server 0", "worker 0", "worker 1"]
    assert len(ticks["worker 0"]) == 10
    ranks = merged["distributedInfo"]["ranks"]
    assert len(ranks) == 3
    for rank in ranks:  # the clock estimate the collect's sync wrote into each peer's file
        if (rank["role"], rank["rank"]) != ("worker", 0):
            assert len(rank["clock"]["estimates"]) == 2, rank


def test_a_file_rank_0_cannot_read_as_its_own_is_uploaded_beside_the_manifest(
    job, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    # A .pftrace has no trailer naming whose it is: the server uploads it.
    _start(job, tmp_path, server_file="trace.pftrace")
    out = tmp_path / "out"
    out.mkdir()
    distributed.collect(str(out / "job.json"), shared=True)
    doc = json.loads((out / "job.json").read_text())
    by = {(e["role"], e["rank"]): e for e in doc["inputs"]}
    server = by[("server", 0)]
    assert server["uploaded"] is True
    assert server["path"] == os.path.join("job.json.uploads", "server0", "rank0_trace.pftrace")
    assert (out / server["path"]).stat().st_size == server["size"] > 0
    assert by[("worker", 1)]["uploaded"] is False
    # The manifest and its uploads move together: merged from another folder.
    moved = tmp_path / "elsewhere"
    os.rename(out, moved)
    summary = merge([str(moved / "job.json")], str(tmp_path / "m.json"))
    assert summary["missing"] == []
    ticks = _ticks_by_role(_testing.load_trace(tmp_path / "m.json"))
    # The .pftrace names no role: its process is named by its file.
    assert len(ticks) == 3 and {"worker 0", "worker 1"} < set(ticks)
    assert len(ticks["worker 0"]) == 10


# ---- offline: a manifest's files moved, cut, damaged ----


def _trace(path, name, pid):
    events = [{"name": name, "ph": "X", "ts": 1.0, "dur": 2.0, "pid": pid, "tid": 1}]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _manifest(path, files, missing=()):
    inputs = [
        {"path": str(f), "process": f"worker {k}", "role": "worker", "rank": k, "size": size}
        for k, (f, size) in enumerate(files)
    ]
    doc = {manifest.KEY: manifest.VERSION, "inputs": inputs, "missing": list(missing)}
    path.write_text(json.dumps(doc))
    return path


def test_a_moved_or_cut_file_is_named_missing_and_the_rest_merged(tmp_path, capsys):
    a = _trace(tmp_path / "a.json", "a", 1)
    b = _trace(tmp_path / "b.json", "b", 2)
    c = _trace(tmp_path / "c.json", "c", 3)
    m = _manifest(
        tmp_path / "job.json",
        [(a, a.stat().st_size), (b, b.stat().st_size), (c, c.stat().st_size + 10)],
        missing=[{"process": "server 0", "why": "its profiler never ran", "failed": False}],
    )
    os.rename(b, tmp_path / "b-moved.json")
    assert main(["merge", str(m), "-o", str(tmp_path / "m.json")]) == 0
    err = capsys.readouterr().err
    assert "missing worker 1: its trace" in err and "gone or moved" in err
    assert "missing worker 2: its trace" in err and "fewer than the" in err
    assert "missing server 0: its profiler never ran" in err
    merged = _testing.load_trace(tmp_path / "m.json")
    assert [e["name"] for e in _testing.events(merged, "X")] == ["a"]
    missing = merged["distributedInfo"]["missing"]
    assert [g["process"] for g in missing] == ["server 0", "worker 1", "worker 2"]


def test_a_manifest_whose_files_are_all_gone_is_refused_naming_each(tmp_path):
    m = _manifest(tmp_path / "job.json", [(tmp_path / "x.json", 10), (tmp_path / "y.json", 10)])
    none = r"none of the manifest's traces.*worker 0.*worker 1"
    with pytest.raises(TraceFormatError, match=none):
        merge([str(m)], str(tmp_path / "m.json"))
    assert not (tmp_path / "m.json").exists()
    assert main(["merge", str(m), "-o", str(tmp_path / "m.json")]) == 2


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"mxprofManifest": 2, "inputs": []}', "not a version-1"),
        ('{"mxprofManifest": 1, "inputs": {}}', "inputs are not a list"),
        ('{"mxprofManifest": 1, "inputs": [{"path": "a.json"}]}', "input 0 has no valid 'process'"),
        ('{"mxprofManifest": 1, "inputs": [', "not JSON"),
    ],
)
def test_a_damaged_manifest_is_refused_with_what_is_wrong(tmp_path, text, problem):
    m = tmp_path / "job.json"
    m.write_text(text)
    with pytest.raises(TraceFormatError, match=problem):
        merge([str(m)], str(tmp_path / "m.json"))
