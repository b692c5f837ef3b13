"""The cross-rank analysis (mxprof.report.ranks), ``mxprof ranks`` and the straggler hint,
on traces written here with known times."""

import json

import pytest

import mxprof
from mxprof import cli
from mxprof.report.hints import find_hints
from mxprof.report.ranks import analyze, parse

COMM = "torch.distributed"
ASYNC = "torch.distributed.async"
AR = "all_reduce(float32, 4096 B, group 0)"
BASE = 1_795_000_000_000_000_000


def X(name, ts_ms, dur_ms, *, cat="train", tid=1, pid=1, args=None):
    event = {"name": name, "cat": cat, "ph": "X", "ts": ts_ms * 1000, "dur": dur_ms * 1000}
    return {**event, "pid": pid, "tid": tid, "args": args or {}}


def frame(index, ts_ms, dur_ms, **kw):
    return X("step", ts_ms, dur_ms, cat="train,frame", args={"frame": index}, **kw)


def write(path, events, dist=None, names=None):
    doc = {"traceEvents": events + (names or []), "displayTimeUnit": "ms"}
    doc["baseTimeNanoseconds"] = BASE
    if dist is not None:
        doc["distributedInfo"] = dist
    path.write_text(json.dumps(doc))
    return path


def rank_events(rank, step_ms=30, steps=5, late=None, late_ms=10, pid=1, cat=COMM, name=AR):
    """Per step: 'forward' 0-5 ms; the slow rank then idles late_ms; an
    all_reduce that every rank leaves at 20 ms; 'optimizer' 20-28 ms."""
    events = []
    for i in range(steps):
        t = step_ms * i
        arrive = 5 + (late_ms if rank == late else 0)
        events += [
            frame(i, t, step_ms, pid=pid),
            X("forward", t, 5, pid=pid),
            X(name, t + arrive, 20 - arrive, cat=cat, pid=pid),
            X("optimizer", t + 20, 8, pid=pid),
        ]
    return events


def rank_files(tmp_path, n=4, late=2, **kw):
    paths = []
    for r in range(n):
        dist = {"rank": r, "world_size": n, "role": "worker"}
        paths.append(write(tmp_path / f"rank{r}.json", rank_events(r, late=late, **kw), dist))
    return paths


def test_names_of_the_adapter_and_of_torch_profiler_parse():
    c = parse("send(float16, 10 B, group 3, peer 1)", COMM)
    assert (c.op, c.dtype, c.bytes, c.group, c.peer, c.is_async, c.p2p) == (
        "send", "float16", 10, "3", "1", False, True,
    )  # fmt: skip
    c = parse("all_reduce(float32, ? B, group 0) ddp bucket 2", ASYNC)
    assert (c.bytes, c.is_async, c.label) == (None, True, "ddp bucket 2")
    c = parse("gloo:all_reduce", "cpu_op", {"Process Group Name": "1", "dtype": "Float"})
    assert (c.op, c.group, c.dtype) == ("all_reduce", "1", "Float")
    assert parse("all_reduce(float32, 4 B, group 0)", "train") is None
    assert parse("allreduce", "torch.distributed") is None


def test_each_rank_step_is_cut_into_compute_communication_waiting_idle(tmp_path):
    """Worker 2 arrives 10 ms late at each all_reduce: the others wait 10 ms
    in it, it idles 10 ms before it; 5 ms of transfer everywhere."""
    result = analyze([mxprof.load(p) for p in rank_files(tmp_path)])
    assert result.ranks == ["worker 0", "worker 1", "worker 2", "worker 3"]
    assert result.step_name == "step" and len(result.steps) == 20
    ms = 1_000_000
    for s in result.steps:
        slow = s.rank == "worker 2"
        assert (s.total, s.compute, s.communication) == (30 * ms, 13 * ms, 5 * ms)
        assert (s.waiting, s.idle) == ((0, 12 * ms) if slow else (10 * ms, 2 * ms))
    assert [(s.step, s.rank) for s in result.steps[3:6]] == [
        (0, "worker 3"), (1, "worker 0"), (1, "worker 1"),
    ]  # fmt: skip
    assert result.matched == 5
    assert result.collectives["worker 1"][AR] == {
        "op": "all_reduce", "dtype": "float32", "bytes": 4096, "group": "0", "peer": None,
        "async": False, "count": 5, "total_ns": 5 * 15 * ms,
    }  # fmt: skip


def test_the_rank_the_others_wait_for_is_the_straggler_with_its_evidence(tmp_path):
    result = analyze([mxprof.load(p) for p in rank_files(tmp_path)])
    s = result.straggler
    assert s is not None and s.label == "worker 2"
    assert (s.late, s.collectives, s.waited_for, s.own_wait) == (5, 5, 10e6, 0)
    assert s.evidence == (
        "worker 2 arrived last at 5 of 5 collectives that had a late rank (the next rank: 0)",
        "the other ranks waited 10.000ms per step for it (100 % of all the waiting blamed "
        "on a late rank)",
        "worker 2 waited 0ns per step inside collectives; the median of the others 10.000ms",
        "idle on worker 2: 12.000ms per step against a median of 2.000ms on the others (+10.000ms)",
    )


def test_the_spread_per_range_names_the_ranks_at_its_ends(tmp_path):
    result = analyze([mxprof.load(p) for p in rank_files(tmp_path)])
    top = result.spread[0]
    assert (top.name, top.min, top.median, top.max) == (AR, 5e6, 15e6, 15e6)
    assert (top.min_rank, top.max_rank) == ("worker 2", "worker 0")
    forward = next(s for s in result.spread if s.name == "forward")
    assert forward.min == forward.max == 5e6


def test_balanced_ranks_and_jitter_name_no_straggler(tmp_path):
    """Every rank on time; then arrivals 10 us apart (below LATE_NOISE_NS)."""
    assert analyze([mxprof.load(p) for p in rank_files(tmp_path, late=None)]).straggler is None
    traces = [
        mxprof.load(write(tmp_path / f"j{r}.json", rank_events(r, late=r, late_ms=0.01 * r)))
        for r in range(3)
    ]
    result = analyze(traces)
    assert result.straggler is None and result.matched == 5


def test_a_late_rank_now_and_then_is_not_a_straggler(tmp_path):
    """Each of three ranks is late in one step of three: no rank carries the
    blame (STRAGGLER_MIN_SHARE)."""
    traces = []
    for r in range(3):
        events = []
        for i in range(3):
            t = 30 * i
            arrive = 15 if i == r else 5
            events += [frame(i, t, 30), X(AR, t + arrive, 20 - arrive, cat=COMM)]
        traces.append(mxprof.load(write(tmp_path / f"r{r}.json", events)))
    assert analyze(traces).straggler is None


def test_one_merged_trace_labels_processes_by_role_and_rank(tmp_path):
    events, names = [], []
    for r in range(3):
        events += rank_events(r, late=1, pid=100 + r)
        names.append(
            {"name": "process_name", "ph": "M", "pid": 100 + r, "tid": 0,
             "args": {"name": f"worker {r} (vm, pid {100 + r})"}}
        )  # fmt: skip
    # Identity is the merged file's structured rank list (merged_pid: the pid
    # in this file), never the display names: these alone name no rank.
    unnamed = analyze(mxprof.load(write(tmp_path / "names.json", events, names=names)))
    assert unnamed.ranks == ["pid 100", "pid 101", "pid 102"]
    ranks = [{"role": "worker", "rank": r, "host": "vm", "pid": 9, "merged_pid": 100 + r}
             for r in range(3)]  # fmt: skip
    dist = {"world_size": 3, "ranks": ranks}
    result = analyze(mxprof.load(write(tmp_path / "all.json", events, dist=dist, names=names)))
    assert result.ranks == ["worker 0", "worker 1", "worker 2"]
    assert result.straggler.label == "worker 1"


def test_files_without_distributed_info_are_labelled_by_pid_and_file(tmp_path):
    traces = [
        mxprof.load(write(tmp_path / f"p{r}.json", rank_events(r, late=0, pid=7))) for r in range(2)
    ]
    result = analyze(traces)
    assert result.ranks == ["pid 7 (p0.json)", "pid 7 (p1.json)"]
    assert result.straggler.label == "pid 7 (p0.json)"


def test_blocking_waits_beat_compute_and_async_handles_count_only_where_nothing_ran(tmp_path):
    """Rank 0: a range 'train' around a blocking all_reduce 2-8 ms (rank 1
    arrives at 5): waiting 3, communication 3, compute 4.  Then an async
    handle 12-18 (rank 1 issues at 15) under compute 10-16: its wait is
    hidden by compute, its transfer exposed 16-18."""
    events = []
    for r in range(2):
        arrive, issue = (2, 12) if r == 0 else (5, 15)
        events.append(
            [
                frame(0, 0, 20),
                X("train", 0, 10),
                X(AR, arrive, 8 - arrive, cat=COMM),
                X("backward", 10, 6),
                X(AR, issue, 18 - issue, cat=ASYNC, tid=9),
            ]
        )
    traces = [mxprof.load(write(tmp_path / f"a{r}.json", e)) for r, e in enumerate(events)]
    rank0 = analyze(traces).steps[0]
    ms = 1_000_000
    assert (rank0.waiting, rank0.communication, rank0.compute, rank0.idle) == (
        3 * ms, 3 * ms + 2 * ms, 4 * ms + 6 * ms, 2 * ms,
    )  # fmt: skip


def test_point_to_point_calls_are_communication_without_waits(tmp_path):
    send = "send(float32, 12 B, group 0, peer 1)"
    recv = "recv(float32, 12 B, group 0, peer 0)"
    a = write(tmp_path / "s.json", [frame(0, 0, 10), X(send, 0, 1, cat=COMM)])
    b = write(tmp_path / "r.json", [frame(0, 0, 10), X(recv, 0, 6, cat=COMM)])
    result = analyze([mxprof.load(a), mxprof.load(b)])
    assert [(s.communication, s.waiting) for s in result.steps] == [(1e6, 0), (6e6, 0)]
    assert result.straggler is None and result.matched == 0


def test_without_steps_each_rank_is_one_window(tmp_path):
    traces = []
    for r in range(2):
        arrive = 5 if r == 0 else 15
        events = [X("work", 0, arrive), X(AR, arrive, 20 - arrive, cat=COMM)]
        traces.append(mxprof.load(write(tmp_path / f"n{r}.json", events)))
    result = analyze(traces)
    assert result.step_name is None
    assert [(s.step, s.total, s.waiting) for s in result.steps] == [
        (None, 20e6, 10e6), (None, 20e6, 0),
    ]  # fmt: skip
    assert result.straggler.label == "pid 1 (n1.json)"


def test_torch_profiler_collectives_name_the_straggler_too(tmp_path):
    traces = [
        mxprof.load(
            write(
                tmp_path / f"k{r}.json",
                rank_events(r, late=3, cat="cpu_op", name="gloo:all_reduce"),
            )
        )
        for r in range(4)
    ]
    assert analyze(traces).straggler.label == "pid 1 (k3.json)"


def test_analyze_takes_loaded_traces_only():
    with pytest.raises(TypeError, match="loaded Traces"):
        analyze(["rank0.json"])


# ---- the command and the hint ----


def test_ranks_command_prints_the_table_and_json(tmp_path, capsys):
    paths = [str(p) for p in rank_files(tmp_path)]
    assert cli.main(["ranks", *paths]) == 0
    out = capsys.readouterr().out
    assert "Ranks: 4 (steps of 'step')" in out and "Straggler: worker 2" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("worker 0"))
    assert row == ["worker", "0", "30.000ms", "13.000ms", "5.000ms", "10.000ms", "2.000ms"]
    assert cli.main(["ranks", "--format", "json", *paths]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["straggler"]["label"] == "worker 2" and doc["unit"] == "ns"
    assert doc["per_rank"]["worker 2"]["idle"] == 12e6
    assert cli.main(["ranks", "--steps", "1", "--top", "1", *paths]) == 0
    out = capsys.readouterr().out.splitlines()
    steps = out[
        out.index("Per step and rank") + 2 : out.index("Spread across ranks (time per step)") - 1
    ]
    assert [line.split()[:3] for line in steps] == [["4", "worker", str(r)] for r in range(4)]
    assert out[out.index("Spread across ranks (time per step)") + 2].startswith(AR)
    assert out[out.index("Spread across ranks (time per step)") + 3] == ""
    assert cli.main(["ranks", str(tmp_path / "missing.json")]) == 2
    assert "mxprof ranks:" in capsys.readouterr().err


def test_the_straggler_hint_comes_from_the_analysis(tmp_path):
    """Busy time would not see worker 2 (it is busy as long as the others):
    the hint names it by whom the others wait for."""
    hint = next(
        h
        for h in find_hints([mxprof.load(p) for p in rank_files(tmp_path)])
        if h.rule == "straggler"
    )
    assert (hint.severity, hint.title) == (
        "high",
        "Straggler: the other ranks wait 10.000ms per step for worker 2 (33 % of a step)",
    )
    assert hint.evidence[0].startswith("worker 2 arrived last at 5 of 5")
    assert hint.subjects == ("worker 2",)
    balanced = [mxprof.load(p) for p in rank_files(tmp_path, late=None)]
    assert "straggler" not in [h.rule for h in find_hints(balanced)]


def test_collectives_timed_on_cuda_streams_replace_their_host_launches(tmp_path):
    """A CUDA call returns at its launch (host ranges of 0.1 ms here); the
    stream's spans (category torch.distributed,gpu) tell the waiting."""
    traces = []
    for r in range(2):
        arrive = 15 if r == 1 else 5
        events = [
            frame(0, 0, 30),
            X(AR, 4, 0.1, cat=COMM),
            X(AR, arrive, 20 - arrive, cat="torch.distributed,gpu", tid=5),
        ]
        traces.append(mxprof.load(write(tmp_path / f"g{r}.json", events)))
    result = analyze(traces)
    assert [s.waiting for s in result.steps] == [10e6, 0]
    assert result.straggler.label == "pid 1 (g1.json)"
    assert result.collectives["pid 1 (g0.json)"][AR]["count"] == 1


def test_dumps_ranks_must_be_a_bool():
    from mxprof import distributed

    with pytest.raises(mxprof.ConfigError, match="ranks must be a bool"):
        distributed.dumps(ranks="yes")


# ---- communication beyond torch, and a parameter server's servers ----


def test_kvstore_operations_and_marked_domains_are_communication():
    push = parse("KVStoreDistDefaultPush", "operator")
    assert (push.op, push.group, push.p2p) == ("push", "kvstore", True)
    assert parse("KVStoreDistRowSparsePull", "operator").op == "pull"
    for category in ("kvstore", "comm", "comm.grads", "kvstore.dense"):
        marked = parse("exchange", category)
        assert (marked.op, marked.group, marked.p2p) == ("exchange", category, True)
    for name, category in (("push", "worker"), ("step", "kvstore,frame"), ("x", "community")):
        assert parse(name, category) is None


def ps_job(tmp_path, steps=4):
    """A merged parameter-server job: per step each worker computes 6 ms, pushes
    2 ms and pulls 3 ms ("kvstore" domain), then idles 1 ms; each server
    applies each push in 1 ms and serves each pull in 0.5 ms."""
    events, names = [], []
    for w in range(2):
        pid = 100 + w
        names.append(
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": f"worker {w} (vm, pid {pid})"}}
        )  # fmt: skip
        for i in range(steps):
            t = 12 * i
            events += [
                frame(i, t, 12, pid=pid),
                X("compute", t, 6, cat="worker", pid=pid),
                X("push", t + 6, 2, cat="kvstore", pid=pid),
                X("pull", t + 8, 3, cat="kvstore", pid=pid),
            ]
    for s in range(2):
        pid = 200 + s
        names.append(
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": f"server {s} (vm, pid {pid})"}}
        )  # fmt: skip
        for i in range(steps):
            t = 12 * i
            events += [
                X("apply_push", t + 7, 1, cat="server", pid=pid),
                X("serve_pull", t + 9, 0.5, cat="server", pid=pid),
            ]
    # Roles and ranks as mxprof merge writes them: structured, joined by merged_pid.
    ranks = [{"role": role, "rank": r, "host": "vm", "pid": base + r, "merged_pid": base + r}
             for role, base in (("worker", 100), ("server", 200)) for r in range(2)]  # fmt: skip
    return write(tmp_path / "ps.json", events, dist={"ranks": ranks}, names=names)


def test_a_parameter_server_job_has_communication_and_lists_its_servers(tmp_path, capsys):
    result = analyze(mxprof.load(ps_job(tmp_path)))
    assert result.ranks == ["worker 0", "worker 1", "server 0", "server 1"]
    assert result.servers == ["server 0", "server 1"]
    mean = result.per_rank()
    for worker in ("worker 0", "worker 1"):
        assert mean[worker] == {
            "total": 12e6, "compute": 6e6, "communication": 5e6, "waiting": 0, "idle": 1e6,
        }  # fmt: skip
    for server in ("server 0", "server 1"):
        # No steps: the trace whole, from the first push applied to the last pull served.
        assert mean[server]["compute"] == 4 * 1.5e6 and mean[server]["communication"] == 0
        assert [s.step for s in result.steps if s.rank == server] == [None]
    # The servers' work is not a range of the ranks: no spread, no straggler from it.
    assert {s.name for s in result.spread} <= {"compute", "push", "pull"}
    assert result.straggler is None and result.matched == 0
    assert cli.main(["ranks", str(tmp_path / "ps.json")]) == 0
    out = capsys.readouterr().out
    assert "Servers: server 0, server 1 (no steps: each trace whole as one window)" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("worker 0"))
    assert row[2:5] == ["12.000ms", "6.000ms", "5.000ms"]
