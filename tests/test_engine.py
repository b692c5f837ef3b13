"""Analyses of many files as map per file and reduce (mxprof.trace.engine): the same
results in this process, on spawned processes and on a Dask LocalCluster of 2 workers;
bad engines, bad inputs and inputs of two jobs refused with the reason."""

import concurrent.futures
import json
import os
import pickle
import random
import sys
from bisect import bisect_right

import _bench
import pytest
from _isolated import isolated

import mxprof
from mxprof import cli
from mxprof.averages import Partial, Tally, combine, nearest_rank, tally
from mxprof.errors import ConfigError, TraceFormatError, TraceReadError
from mxprof.report.hints import find_hints
from mxprof.report.ranks import analyze, rank_part, reduce
from mxprof.trace import engine
from mxprof.trace.merge import merge, parse_window

BASE = 1_795_000_000_000_000_000
COMM = "torch.distributed"
AR = "all_reduce(float32, 4096 B, group 0)"


def X(name, ts_us, dur_us, *, cat="app", pid=1, tid=1, args=None):
    event = {"name": name, "cat": cat, "ph": "X", "ts": ts_us, "dur": dur_us}
    return {**event, "pid": pid, "tid": tid, "args": args or {}}


def rank_file(path, rank, *, seed, steps=12, late=None, dist=True, world=3, one_line=False):
    """Steps of 30 ms: forward (random length, nested ops), an all_reduce every rank
    leaves at 20 ms (rank `late` arrives 10 ms late), optimizer; durations in
    fractional us so that the percentiles have many distinct values."""
    rnd = random.Random(seed)
    events = []
    for i in range(steps):
        t = 30_000 * i
        fwd = rnd.randint(2_000, 5_000) + rnd.randint(0, 999) / 1000
        events += [
            X("step", t, 30_000, cat="train,frame", args={"frame": i}),
            X("forward", t, fwd),
            X("matmul", t + 10, fwd / 3),
            X("relu", t + 20 + fwd / 3, fwd / 4),
        ]
        arrive = 5_000 + (10_000 if rank == late else 0)
        events.append(X(AR, t + arrive, 20_000 - arrive, cat=COMM))
        events.append(X("optimizer", t + 20_000, rnd.randint(1_000, 8_000) + 0.5))
    head = {"displayTimeUnit": "ms", "baseTimeNanoseconds": BASE + rank * 1_000_000}
    if dist:
        head["distributedInfo"] = {"rank": rank, "world_size": world, "role": "worker"}
    if one_line:
        path.write_text(json.dumps({**head, "traceEvents": events}))
    else:  # one event per line, as mxprof writes: merge --window reads it block by block
        lines = ",\n".join(json.dumps(e) for e in events)
        path.write_text(json.dumps(head)[:-1] + f', "traceEvents": [\n{lines}\n]}}\n')
    return str(path)


@pytest.fixture
def ranks3(tmp_path):
    """Three ranks' files: two in mxprof's one-event-per-line shape, one on one line."""
    return [
        rank_file(tmp_path / f"rank{r}.json", r, seed=r, late=1, one_line=r == 2) for r in range(3)
    ]


# Dask leaves threads of its own in the process that used it (its IO loop, its
# offload pool), which later tests of samplers would see.
in_child, _run_isolated = isolated(__file__, "uses Dask, which leaves its threads behind")


@pytest.fixture(scope="module")
def cluster():
    """One Dask LocalCluster of 2 worker processes for the module's tests."""
    ex = engine.Dask(None, jobs=2)
    yield ex
    ex.close()


def rows(averages):
    return [
        (r.name, r.category, r.count, r.total, r.self, r.min, r.max, r.p50, r.p90, r.p99)
        for r in averages
    ]


def test_nearest_rank_of_sorted_runs_is_that_of_their_merge():
    rnd = random.Random(7)
    for _ in range(200):
        runs = [sorted(rnd.randint(0, 50) for _ in range(rnd.randint(1, 9))) for _ in range(3)]
        merged = sorted(v for r in runs for v in r)
        for p in (1, 50, 90, 99, 100):
            rank = max(-(-p * len(merged) // 100), 1)
            assert nearest_rank(runs, p) == merged[rank - 1]
            assert bisect_right(merged, nearest_rank(runs, p)) >= rank


def test_a_tally_holds_the_same_durations_and_counts_at_most_as_bisection_does():
    rnd = random.Random(11)
    for distinct, n in ((5, 300), (40, 2000), (700, 2000)):  # the last: counted, not walked
        ordered = sorted(rnd.randint(0, distinct) for _ in range(n))
        t = tally(ordered)
        assert isinstance(t, Tally), (distinct, n)
        assert (len(t), t.total) == (n, sum(ordered))
        assert list(t.values) == sorted(set(ordered))
        for x in range(-1, distinct + 2):
            assert t.at_most(x) == bisect_right(ordered, x)
    distinct_values = list(range(0, 3000, 3))
    assert tally(distinct_values) is distinct_values  # nothing repeats: sent as it is
    assert tally([4] * 10) == [4] * 10  # too short to be worth it


def test_nearest_rank_and_combine_of_tallied_runs_are_those_of_the_listed_ones():
    rnd = random.Random(5)
    for _ in range(50):
        runs = [sorted(rnd.randint(0, 30) for _ in range(rnd.randint(64, 400))) for _ in range(3)]
        runs.append(sorted(rnd.randint(0, 10**6) for _ in range(rnd.randint(1, 50))))
        mixed = [tally(r) for r in runs]
        assert sum(isinstance(r, Tally) for r in mixed) == 3
        for p in (1, 50, 90, 99, 100):
            assert nearest_rank(mixed, p) == nearest_rank(runs, p)
        listed = combine([Partial({("f", "c"): (k, r)}) for k, r in enumerate(runs)])
        tallied = combine([Partial({("f", "c"): (k, r)}) for k, r in enumerate(mixed)])
        assert rows(tallied) == rows(listed)


def test_combine_adds_counts_totals_self_and_takes_the_ends():
    a = Partial({("f", "c"): (7, [1, 4, 10]), ("g", "c"): (2, [2])})
    b = Partial({("f", "c"): (5, [3, 20])})
    by_name = {r.name: r for r in combine([a, b])}
    f = by_name["f"]
    assert (f.count, f.total, f.self, f.min, f.max, f.p50, f.p90) == (5, 38, 12, 1, 20, 4, 20)
    assert (by_name["g"].count, by_name["g"].total) == (1, 2)


@in_child
def test_stats_of_several_files_are_those_of_their_merge_on_every_engine(ranks3, tmp_path, cluster):
    merge(ranks3, tmp_path / "merged.json")
    expected = rows(mxprof.load(tmp_path / "merged.json").key_averages())
    assert [r[0] for r in expected][:2] == ["step", AR] and expected[0][2] == 36
    for ex in (engine.Local(1), engine.Local(2), cluster):
        got, parts = engine.key_averages(ranks3, ex)
        assert rows(got) == expected, ex.name
        assert [p.path for p in parts] == ranks3
        assert [p.events for p in parts] == [72, 72, 72]


@in_child
def test_stats_sent_back_tallied_are_those_of_the_merge_on_every_engine(tmp_path, cluster):
    """80 steps of 30 ms and all_reduces of 15 ms: durations that repeat, which a
    part tallies when pickled (from a spawned process or a Dask worker)."""
    files = [rank_file(tmp_path / f"r{r}.json", r, seed=r, steps=80, late=1) for r in range(3)]
    merge(files, tmp_path / "merged.json")
    expected = rows(mxprof.load(tmp_path / "merged.json").key_averages())
    sent = pickle.loads(pickle.dumps(engine.stats_part(files[0])))
    assert isinstance(sent.partial.groups[("step", "train,frame")][1], Tally)
    assert not isinstance(sent.partial.groups[("optimizer", "app")][1], Tally)  # distinct
    for ex in (engine.Local(1), engine.Local(2), cluster):
        got, parts = engine.key_averages(files, ex)
        assert rows(got) == expected, ex.name
        assert [p.events for p in parts] == [480, 480, 480]


@in_child
def test_ranks_read_apart_are_what_analyze_gives_on_every_engine(ranks3, cluster):
    expected = analyze([mxprof.load(p) for p in ranks3])
    assert expected.straggler is not None and expected.straggler.label == "worker 1"
    assert expected.matched == 12
    for ex in (engine.Local(1), engine.Local(2), cluster):
        got = reduce(ex.map(rank_part, ranks3))
        assert got.to_json() == expected.to_json(), ex.name


@in_child
@pytest.mark.parametrize("window", ["0.1:0.2", "#3:#5"])
def test_a_merged_window_is_the_same_on_every_engine(ranks3, tmp_path, cluster, window):
    merge(ranks3, tmp_path / "here.json", window=parse_window(window))
    expected = (tmp_path / "here.json").read_bytes()
    kept = mxprof.load(tmp_path / "here.json")
    assert 0 < len(kept) < 3 * 72 and {e.pid for e in kept} == {1, 2, 3}
    for ex in (engine.Local(2), cluster):
        merge(ranks3, tmp_path / "apart.json", window=parse_window(window), executor=ex)
        assert (tmp_path / "apart.json").read_bytes() == expected, ex.name


@in_child
def test_the_command_line_gives_the_same_output_whatever_the_engine(ranks3, cluster, capsys):
    address = cluster.client.scheduler.address.replace("tcp://", "dask://")
    for command in ("stats", "ranks"):
        outputs = []
        for how in (["--jobs", "1"], ["--jobs", "2"], ["--engine", address]):
            assert cli.main([command, "--format", "json", *how, *ranks3]) == 0
            outputs.append(capsys.readouterr().out)
        assert outputs[0] == outputs[1] == outputs[2], command
    doc = json.loads(outputs[0])
    assert doc["straggler"]["label"] == "worker 1"
    assert cli.main(["stats", "--format", "json", "--jobs", "2", *ranks3]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["files"] == ranks3 and doc["truncated"] == []
    step = next(r for r in doc["rows"] if r["name"] == "step")
    assert (step["count"], step["total"]) == (36, 36 * 30_000_000)


@in_child
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_local_cluster_forks_its_workers_from_one_fork_server(cluster):
    """Not a spawned interpreter each (Dask imported once, not per worker)."""
    parents = set(cluster.client.run(os.getppid).values())
    assert len(parents) == 1 and os.getpid() not in parents
    with open(f"/proc/{parents.pop()}/stat", encoding="ascii") as f:
        server_parent = int(f.read().rsplit(")", 1)[1].split()[1])
    assert server_parent == os.getpid()  # the fork server is this process's child


@in_child
@pytest.mark.slow
def test_engine_dask_starts_a_local_cluster_of_jobs_workers(ranks3, capsys):
    assert cli.main(["stats", "--engine", "dask", "--jobs", "2", *ranks3]) == 0
    table = capsys.readouterr().out
    assert cli.main(["stats", "--jobs", "1", *ranks3]) == 0
    assert capsys.readouterr().out == table


def test_a_bad_input_on_a_worker_is_named_with_exit_2(ranks3, tmp_path, capsys):
    cut = tmp_path / "cut.json"
    cut.write_text('{"traceEvents": [')
    missing = str(tmp_path / "nope.json")
    assert cli.main(["stats", "--jobs", "2", ranks3[0], missing]) == 2
    assert f"{missing}: cannot read" in capsys.readouterr().err
    assert cli.main(["ranks", "--jobs", "2", ranks3[0], str(cut)]) == 2
    assert f"{cut}: the text ends inside the trace" in capsys.readouterr().err
    with pytest.raises(TraceReadError) as e:  # crossed from a worker as it was raised
        engine.Local(2).map(engine.stats_part, [ranks3[0], missing])
    assert e.value.filename == missing and e.value.errno == 2


def test_one_rank_in_two_inputs_or_two_jobs_are_refused(ranks3, tmp_path, capsys):
    again = rank_file(tmp_path / "again.json", 1, seed=9)
    assert cli.main(["ranks", "--jobs", "1", *ranks3, again]) == 2
    err = capsys.readouterr().err
    assert f"worker 1 is in two inputs, {ranks3[1]} and {again}: give each rank once" in err
    assert cli.main(["ranks", "--jobs", "1", ranks3[0], ranks3[0]]) == 2
    assert f"worker 0 is in two inputs, {ranks3[0]} and {ranks3[0]}" in capsys.readouterr().err
    other = rank_file(tmp_path / "other.json", 3, seed=3, world=8)
    with pytest.raises(TraceFormatError, match="inputs of different jobs: rank0.json says "
                       "world_size 3, other.json says 8"):  # fmt: skip
        reduce([rank_part(p) for p in [*ranks3, other]])
    # Files that say no rank are labelled by file, as before: never refused.
    plain = [rank_file(tmp_path / f"p{k}.json", 0, seed=k, dist=False) for k in range(2)]
    labels = reduce([rank_part(p) for p in plain]).ranks
    assert labels == ["pid 1 (p0.json)", "pid 1 (p1.json)"]


@in_child
def test_a_dask_address_that_does_not_answer_is_an_error_in_time(ranks3, monkeypatch, capsys):
    monkeypatch.setattr(engine, "CONNECT_TIMEOUT_S", 1.0)
    assert cli.main(["stats", "--engine", "dask://127.0.0.1:9", *ranks3]) == 2
    err = capsys.readouterr().err
    assert "no Dask scheduler answers at 127.0.0.1:9 (waited 1 s)" in err


@pytest.mark.parametrize(
    "how, said",
    [
        (["--engine", "spark"], "engine 'spark': give local, dask, or dask://HOST:PORT"),
        (["--engine", "dask://host"], "give local, dask, or dask://HOST:PORT"),
        (["--jobs", "0"], "must be >= 1"),
        (["--jobs", "two"], "not an integer"),
    ],
)
def test_bad_engines_and_jobs_are_usage_errors(ranks3, how, said, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["stats", *how, *ranks3])
    assert e.value.code == 2 and said in capsys.readouterr().err


def test_without_dask_one_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails
    with pytest.raises(ConfigError) as e:
        engine.Dask(None, jobs=1)
    assert str(e.value) == 'the dask engine needs Dask: pip install "mxprof[dask]"'


def test_the_default_reads_small_inputs_here_and_jobs_asked_for_spawn(ranks3, monkeypatch):
    """--jobs not given: inputs under SPAWN_MIN_BYTES in this process; given: this
    process and jobs - 1 spawned ones, the largest file first."""
    pools = []
    where = []  # the files handed to the child
    read = []

    class Pool:  # a stand-in that records how it was started and runs its tasks here
        def __init__(self, max_workers, mp_context):
            pools.append((max_workers, mp_context.get_start_method()))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, item):
            where.append(item)
            future = concurrent.futures.Future()
            future.set_result(fn(item))
            return future

    def size(path):
        read.append(path)
        return os.path.getsize(path)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    assert engine.Local().map(len, ranks3) == [len(p) for p in ranks3]
    assert pools == []
    assert engine.Local(2).map(len, ranks3) == [len(p) for p in ranks3]
    assert engine.Local(8).map(len, ranks3[:2]) == [len(p) for p in ranks3[:2]]
    assert pools == [(1, "spawn"), (1, "spawn")]  # this process is one; never more than files
    monkeypatch.setattr(engine, "SPAWN_MIN_BYTES", 1)
    engine.Local().map(len, ranks3)
    assert pools[-1] == (min(engine.default_jobs(), 3) - 1, "spawn")
    # Two jobs over 3 files: the child is handed two (the largest first), this
    # process reads the smallest; results still in the inputs' order.
    sizes = [os.path.getsize(p) for p in ranks3]
    by_size = sorted(ranks3, key=lambda p: -os.path.getsize(p))
    where.clear()
    assert engine.Local(2).map(size, ranks3) == sizes
    assert where == by_size[:2] and sorted(read) == sorted(ranks3)


@pytest.mark.slow
def test_benchmark_quick_mode(tmp_path):
    stdout, doc = _bench.quick("jobs.py", tmp_path)
    assert set(doc["median_s"]) == {
        f"{c} {e}" for c in ("stats", "ranks") for e in ("jobs 1", "jobs 2", "dask 2")
    } | {"report jobs 1", "report jobs 2"}  # report refuses a Dask engine
    assert doc["stats_speedup"] > 0 and doc["report_speedup"] > 0
    assert "identical output on every engine: checked" in stdout


def test_the_report_of_one_rank_twice_still_has_its_hints(ranks3):
    """The straggler hint reads the ranks analysis: inputs it refuses give no
    straggler (their waits do not match) but no error either."""
    traces = [mxprof.load(p) for p in (ranks3[1], ranks3[1])]
    with pytest.raises(TraceFormatError, match="worker 1 is in two inputs"):
        analyze(traces)
    assert not [h.title for h in find_hints(traces) if "ranks wait" in h.title]
    titles = [h.title for h in find_hints([mxprof.load(p) for p in ranks3])]
    assert (
        "Straggler: the other ranks wait 10.000ms per step for worker 1 (33 % of a step)" in titles
    )


@pytest.mark.parametrize(
    "marks", ["not slow", pytest.param("slow", marks=pytest.mark.slow)], ids=["fast", "slow"]
)
def test_dask_in_a_process_of_its_own(marks):
    _run_isolated(marks)
