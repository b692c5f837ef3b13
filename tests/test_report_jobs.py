"""mxprof report with --jobs and --engine: --jobs 1 builds the page in one
process, more puts the hints in a forked child, the page the same byte for byte;
the inputs are read in the command's process (reading them in workers was
measured slower: docs/scaling.md), so a Dask engine is refused with the reason;
a job's manifest stands for its files; bad options refused.  A trace sent between
processes drops its id-keyed walk and gives the same model and statistics."""

import os
import pickle

import pytest
from test_engine import AR, rank_file
from test_manifest_inputs import job  # noqa: F401 - the fixture

import mxprof.report
from mxprof import cli
from mxprof.errors import ConfigError, TraceFormatError
from mxprof.report._parallel import forking_is_safe
from mxprof.trace.model import read_events
from mxprof.trace.processes import processes


@pytest.fixture
def ranks(tmp_path):
    """Three ranks' files (40 steps each, rank 1 late to its all_reduce) and a baseline."""
    paths = [rank_file(tmp_path / f"rank{r}.json", r, seed=r, steps=40, late=1) for r in range(3)]
    base = rank_file(tmp_path / "base.json", 0, seed=9, steps=40, dist=False)
    return paths, base


def page(tmp_path, name, paths, **how):
    out = mxprof.report.report(paths, tmp_path / f"{name}.html", **how)
    with open(out, "rb") as f:
        return f.read()


def test_jobs_sets_the_processes_and_the_page_is_the_same(ranks, tmp_path, monkeypatch):
    paths, base = ranks
    forks = []
    real_fork = os.fork

    def fork():
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    serial = page(tmp_path, "serial", paths, baseline=base, jobs=1)
    assert forks == []  # --jobs 1: the hints found here, after the sections
    assert page(tmp_path, "two", paths, baseline=base, jobs=2) == serial
    if forking_is_safe():
        assert forks == [1]  # the hints in a forked child beside the sections
    text = serial.decode()
    assert AR in text and "worker 1" in text and "base.json" in text
    assert page(tmp_path, "one", paths[:1], jobs=2) == page(tmp_path, "one1", paths[:1], jobs=1)


def test_a_dask_engine_is_refused_with_the_reason(ranks, tmp_path, capsys):
    paths, _ = ranks
    for how in ("dask", "dask://127.0.0.1:8786"):
        with pytest.raises(ConfigError, match="the page is built from every event"):
            mxprof.report.report(paths, tmp_path / "x.html", engine=how)
    assert cli.main(["report", *paths, "--engine", "dask", "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "mxprof report: engine 'dask': the page is built from every event" in err
    assert "stats, ranks, merge --window, export and sql run on a Dask engine" in err
    assert not os.path.exists(tmp_path / "x.html")


def test_a_pickled_trace_gives_the_same_model_and_statistics(ranks):
    """Its per-thread walk, keyed by the threads' id(), does not travel: in the
    process that unpickles it those ids name other objects."""
    trace = read_events(ranks[0][1])
    procs = processes(trace)
    rows = trace.key_averages()
    assert trace.per_thread()
    copy = pickle.loads(pickle.dumps(trace))
    assert copy._per_thread is None
    assert copy.key_averages() == rows
    got = processes(copy)
    assert [p.label for p in got] == [p.label for p in procs]
    assert got[0].durations() == procs[0].durations() and got[0].totals() == procs[0].totals()
    assert got[0].steps.durations == procs[0].steps.durations
    assert len(got[0].steps.durations) == 40


def test_an_input_that_fails_in_a_worker_fails_as_it_would_here(ranks, tmp_path):
    paths, _ = ranks
    empty = tmp_path / "empty.json"
    empty.write_text('{"traceEvents": []}')
    for jobs in (1, 2):
        with pytest.raises(TraceFormatError, match="empty.json: the trace holds no events"):
            mxprof.report.report([paths[0], str(empty)], tmp_path / "x.html", jobs=jobs)
    assert not os.path.exists(tmp_path / "x.html")


def test_bad_jobs_and_engines_are_refused(ranks, tmp_path, capsys):
    paths, _ = ranks
    with pytest.raises(ConfigError, match="jobs must be an integer >= 1, got 0"):
        mxprof.report.report(paths, tmp_path / "x.html", jobs=0)
    with pytest.raises(ConfigError, match="engine 'spark'"):
        mxprof.report.report(paths, tmp_path / "x.html", engine="spark")
    for bad in (["--jobs", "0"], ["--engine", "dask://nowhere"]):
        with pytest.raises(SystemExit) as e:
            cli.main(["report", *paths, *bad])
        assert e.value.code == 2
    assert "must be >= 1: '0'" in capsys.readouterr().err


def test_a_manifest_gives_the_page_its_files_give(job, tmp_path, capsys):  # noqa: F811
    path, paths = job
    assert cli.main(["report", *paths, "-o", str(tmp_path / "files.html")]) == 0
    assert cli.main(["report", path, "--jobs", "2", "-o", str(tmp_path / "manifest.html")]) == 0
    err = capsys.readouterr().err
    assert "mxprof report: missing worker 3 (h, pid 13): it died before the collect" in err
    with open(tmp_path / "files.html", "rb") as a, open(tmp_path / "manifest.html", "rb") as b:
        assert a.read() == b.read()
    # By default the page goes beside the manifest, named after it.
    assert cli.main(["report", path]) == 0
    assert os.path.exists(os.path.join(os.path.dirname(path), "job.manifest.report.html"))
