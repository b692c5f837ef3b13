"""Job-wide flight recorder snapshots: a trigger on one rank, one merged snapshot at rank 0.

The job runs on loopback: this process is worker 0, the others are spawned
(tests/_flight_child.py), each with a flight recorder of 5 s and a range
held open (``allreduce``, or ``forward`` on the rank made to look stuck).
Bounds: the merged file is awaited for the job's timeout (the windows'
answers) plus SLACK seconds for a loaded machine: a bound that tells a hang
from a slow machine, not a measurement.
"""

import glob
import os
import pathlib
import re
import signal
import sys

import pytest

import mxprof
import mxprof.report
from mxprof import _testing

pytest.importorskip("zmq", reason="the ZeroMQ transport needs pyzmq (mxprof[dist])")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # spawned children import it
import _dist_job  # noqa: E402
import _flight_child  # noqa: E402
from _dist_job import wait_for  # noqa: E402

from mxprof import distributed  # noqa: E402
from mxprof.distributed import _flight  # noqa: E402

SLACK = 30.0


@pytest.fixture
def job(tmp_path):
    yield from _dist_job.job(tmp_path)


def start(job, rank, n, inside="allreduce", die=False, block=False, watchdog=0.0):
    p = _dist_job.SPAWN.Process(
        target=_flight_child.serve,
        args=(str(job.tmp_path), rank, n, job.address),
        kwargs={"inside": inside, "die": die, "block": block, "watchdog": watchdog},
        daemon=True,
    )
    p.start()
    job.procs.append(p)
    return p


def running_job(job, tmp_path, n, timeout, stuck=None, die=None, block=None, watchdog=0.0):
    """This process as worker 0 of n workers, each recording a flight
    recorder with a range held open; returns the peers' processes."""
    distributed.init("worker", 0, n, 0, address=job.address, timeout=timeout)
    procs = [
        start(
            job,
            r,
            n,
            "forward" if r == stuck else "allreduce",
            die=r == die,
            block=r == block,
            watchdog=watchdog if r == block else 0.0,
        )
        for r in range(1, n)
    ]
    mxprof.set_config(filename="hub.json", flight_recorder=5, flight_recorder_interval=0)
    mxprof.set_state("run")
    held = mxprof.Domain("train").new_task("allreduce")
    held.start()
    ready = [tmp_path / f"worker{r}.ready" for r in range(1, n)]
    assert wait_for(lambda: all(p.exists() for p in ready), 90), os.listdir(tmp_path)
    assert wait_for(lambda: len(distributed.members()) == n - 1, 30)
    return procs


def order(tmp_path, rank, reason):
    """Tell worker rank to trigger with reason (the file appears whole: renamed into place)."""
    part = tmp_path / f"worker{rank}.trigger.part"
    part.write_text(reason)
    os.replace(part, tmp_path / f"worker{rank}.trigger")


def merged_snapshot(tmp_path, limit):
    pattern = str(tmp_path / "hub.flight*-job_*.json")  # not merge's .tmp file
    assert wait_for(lambda: glob.glob(pattern), limit), os.listdir(tmp_path)
    (path,) = glob.glob(pattern)
    return path, _testing.load_trace(path)


def labels(merged):
    """Process label (role and rank) -> tick count, in a merged file."""
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    counts = {}
    for e in _testing.events(merged, "X", "tick"):
        label = names[e["pid"]].split(" (")[0]
        counts[label] = counts.get(label, 0) + 1
    return names, counts


def test_a_trigger_on_a_nonzero_rank_is_one_merged_snapshot_at_rank_0(job, tmp_path):
    run_job = running_job(job, tmp_path, 3, timeout=10.0, stuck=2)
    assert len(run_job) == 2
    order(tmp_path, 1, "watchdog")
    path, merged = merged_snapshot(tmp_path, 10.0 + SLACK)
    assert os.path.basename(path) == "hub.flight2-job_watchdog.json"
    info = merged["otherData"]["flight_recorder"]
    assert info["reason"] == "watchdog" and info["job"] is True
    assert (info["triggered_by"]["role"], info["triggered_by"]["rank"]) == ("worker", 1)
    assert info["details"] == {"stuck_thread": "MainThread", "rank": 1}  # the trigger's own
    assert info["window_seconds"] == 5.0 and info["missing"] == []
    # Every rank's window, every rank's events.
    names, counts = labels(merged)
    assert sorted(counts) == ["worker 1", "worker 2"]  # worker 0 (here) records no ticks
    assert all(n >= 1 for n in counts.values())
    ranks = {r["rank"]: r for r in info["ranks"]}
    assert sorted(ranks) == [0, 1, 2]
    assert {r: ranks[r]["range"] for r in ranks} == {0: "allreduce", 1: "allreduce", 2: "forward"}
    assert all(ranks[r]["open_for_seconds"] > 0 for r in ranks)
    (stuck,) = info["stuck"]
    assert stuck["process"].startswith("worker 2 (") and stuck["range"] == "forward"
    assert stuck["others_in"] == "allreduce"
    # Each rank's held range is cut at the trigger, on the merged (rank 0's) clock.
    clocks = {r["rank"]: r["clock"] for r in merged["distributedInfo"]["ranks"]}
    trigger = info["trigger_us"]
    for e in _testing.events(merged, "X"):
        if e["name"] in ("allreduce", "forward"):
            rank = int(names[e["pid"]].split(" (")[0].split()[1])
            assert e["args"]["cut_short"] is True
            bound_us = (clocks[rank]["error_ns"] if clocks[rank] else 0) / 1e3 + 5000
            assert abs(e["ts"] + e["dur"] - trigger) <= bound_us, (rank, e, trigger)
    cut = {
        int(names[e["pid"]].split(" (")[0].split()[1])
        for e in _testing.events(merged, "X")
        if e.get("args", {}).get("cut_short")
    }
    assert cut == {0, 1, 2}
    # Each rank kept its own snapshot of the window too.
    assert (tmp_path / "worker1_t.flight1-watchdog.json").exists()  # its trigger's
    assert (tmp_path / "worker2_t.flight1-watchdog.json").exists()  # the job's window
    assert (tmp_path / "hub.flight1-watchdog.json").exists()
    w2 = _testing.load_trace(tmp_path / "worker2_t.flight1-watchdog.json")
    assert w2["otherData"]["flight_recorder"]["details"]["job_trigger"]["by"].startswith(
        "worker 1 ("
    )
    # The merged snapshot opens in the report like any trace, its trigger at the top.
    page = pathlib.Path(mxprof.report.report(path, tmp_path / "r.html")).read_text()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))
    assert "This is a job-wide flight recorder snapshot" in text
    assert "Trigger: watchdog on worker 1 (" in text
    assert "Every process of the job is in the snapshot" in text
    assert re.search(r"Stands out: worker 2 \([^)]*\) is in forward for [0-9.e-]+ s, while the "
                     r"others are in allreduce", text)  # fmt: skip


def warned(monkeypatch):
    """The relay's warnings (it warns on its own thread, after the merge)."""
    said = []
    monkeypatch.setattr(_flight, "_warn", said.append)
    return said


def test_a_frozen_rank_and_a_killed_rank_are_named_missing(job, tmp_path, monkeypatch):
    said = warned(monkeypatch)
    timeout = 2.0
    procs = running_job(job, tmp_path, 4, timeout=timeout)
    frozen, killed = procs[1], procs[2]  # workers 2 and 3
    os.kill(killed.pid, signal.SIGKILL)
    killed.join(10)  # reaped: its pid is gone
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        order(tmp_path, 1, "loss is NaN")
        path, merged = merged_snapshot(tmp_path, timeout + SLACK)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert os.path.basename(path) == "hub.flight2-job_loss_is_NaN.json"
    info = merged["otherData"]["flight_recorder"]
    assert info["reason"] == "loss is NaN" and info["triggered_by"]["rank"] == 1
    assert sorted(r["rank"] for r in info["ranks"]) == [0, 1]
    missing = {g["rank"]: g for g in info["missing"]}
    assert sorted(missing) == [2, 3]
    assert all(g["failed"] for g in missing.values())
    assert "no answer within" in missing[2]["why"]
    assert f"pid {frozen.pid}" in missing[2]["process"]
    assert f"(pid {killed.pid}) has exited" in missing[3]["why"]
    assert merged["distributedInfo"]["missing"] == info["missing"]
    _, counts = labels(merged)
    assert sorted(counts) == ["worker 1"]
    text = pathlib.Path(mxprof.report.report(path, tmp_path / "r.html")).read_text()
    assert "Missing processes" in text and f"(pid {killed.pid}) has exited" in text
    assert wait_for(lambda: said, 10)
    (message,) = said
    assert message.startswith(
        f"job-wide flight recorder snapshot {os.path.basename(path)} holds 2 of 4 processes"
    )
    assert "worker 2 (" in message and "worker 3 (" in message


def test_a_triggering_rank_that_dies_is_missing_but_its_own_snapshot_is_merged(
    job, tmp_path, monkeypatch
):
    said = warned(monkeypatch)
    timeout = 2.0
    procs = running_job(job, tmp_path, 3, timeout=timeout, die=1)
    order(tmp_path, 1, "exception")
    path, merged = merged_snapshot(tmp_path, timeout + SLACK)
    procs[0].join(10)
    assert procs[0].exitcode == 3  # it died right after its trigger
    info = merged["otherData"]["flight_recorder"]
    assert info["reason"] == "exception" and info["triggered_by"]["rank"] == 1
    (gap,) = info["missing"]
    assert gap["rank"] == 1 and gap["failed"] is True
    assert os.path.basename(gap["last_file"]) == "worker1_t.flight1-exception.json"
    assert info["details"] == {"stuck_thread": "MainThread", "rank": 1}  # from its own file
    assert sorted(r["rank"] for r in info["ranks"]) == [0, 1, 2]
    _, counts = labels(merged)
    assert sorted(counts) == ["worker 1", "worker 2"]
    assert wait_for(lambda: said, 10)
    assert "is merged instead" in said[0]


def test_a_hang_with_the_main_thread_blocked_in_c_names_the_stuck_rank(job, tmp_path):
    running_job(job, tmp_path, 3, timeout=10.0, block=2)
    order(tmp_path, 2, "watchdog")  # its own watchdog, on a thread
    path, merged = merged_snapshot(tmp_path, 10.0 + SLACK)
    info = merged["otherData"]["flight_recorder"]
    assert info["reason"] == "watchdog" and info["triggered_by"]["rank"] == 2
    assert info["missing"] == []
    ranks = {r["rank"]: r for r in info["ranks"]}
    assert ranks[2]["range"] == "stuck_in_c"
    assert [o["range"] for o in ranks[2]["open"]] == ["stuck_in_c"]  # its main thread's only
    assert ranks[0]["range"] == ranks[1]["range"] == "allreduce"
    (stuck,) = info["stuck"]
    assert stuck["process"].startswith("worker 2 (") and stuck["others_in"] == "allreduce"
    cut = [e for e in _testing.events(merged, "X", "stuck_in_c")]
    assert len(cut) == 1 and cut[0]["args"]["cut_short"] is True


def test_mxprofs_hang_watchdog_on_one_rank_makes_the_job_wide_snapshot(job, tmp_path):
    running_job(job, tmp_path, 3, timeout=10.0, block=2, watchdog=0.5)
    order(tmp_path, 2, "")  # it stops stepping and blocks; its watchdog fires 0.5 s later
    path, merged = merged_snapshot(tmp_path, 10.0 + SLACK)
    assert os.path.basename(path) == "hub.flight2-job_hang.json"
    info = merged["otherData"]["flight_recorder"]
    assert info["reason"] == "hang" and info["triggered_by"]["rank"] == 2
    details = info["details"]  # the watchdog's, from rank 2's own snapshot
    assert details["stuck_thread"] == "MainThread"
    (main,) = [t for t in details["threads"] if t["name"] == "MainThread"]
    assert main["innermost_range"] == "train:stuck_in_c"  # domain:name
    ranks = {r["rank"]: r for r in info["ranks"]}
    assert ranks[2]["range"] == "stuck_in_c" and ranks[2]["open_for_seconds"] >= 0.4
    (stuck,) = info["stuck"]
    assert stuck["process"].startswith("worker 2 (") and stuck["others_in"] == "allreduce"


# ---- the pieces, in this process ----


def test_on_trigger_sees_a_triggers_snapshot_but_not_dumps_nor_a_jobs_window(tmp_path):
    from mxprof import _native, flight

    seen = []
    flight.ON_TRIGGER.append(seen.append)
    try:
        mxprof.set_config(filename=str(tmp_path / "t.json"), flight_recorder=5,
                          flight_recorder_interval=0)  # fmt: skip
        mxprof.set_state("run")
        with mxprof.Domain("train").new_task("tick"):
            pass
        path = mxprof.trigger("mine")
        assert [s.reason for s in seen] == ["mine"] and seen[0].path == path
        window = flight.snapshot_at("theirs", _native.clock_wall_ns(), 5, 0)
        mxprof.dump()  # a flight recorder's dump() is a snapshot too
        assert [s.reason for s in seen] == ["mine"]
        assert os.path.basename(window) == "t.flight2-theirs.json"
    finally:
        flight.ON_TRIGGER.remove(seen.append)
        mxprof.set_state("stop")


def test_snapshot_at_holds_the_window_around_a_wall_clock_time(tmp_path):
    import time

    from mxprof import _native, flight

    mxprof.set_config(filename=str(tmp_path / "t.json"), flight_recorder=5,
                      flight_recorder_interval=3600, flight_recorder_max=1)  # fmt: skip
    mxprof.set_state("run")
    d = mxprof.Domain("train")
    with d.new_task("earlier"):
        pass
    time.sleep(0.02)
    begin = _native.clock_wall_ns()
    with d.new_task("before"):
        time.sleep(0.01)
    middle = _native.clock_wall_ns()
    time.sleep(0.02)
    with d.new_task("after"):
        time.sleep(0.01)
    window = (middle - begin) / 1e9  # from just before "before" to just after it
    assert mxprof.trigger("uses the one snapshot allowed") is not None
    # Neither the interval nor the most per profile hold a job's window back.
    path = flight.snapshot_at("job", middle, window, 0)
    mxprof.set_state("stop")
    trace = _testing.load_trace(path)
    assert [e["name"] for e in _testing.events(trace, "X")] == ["before"]
    info = trace["otherData"]["flight_recorder"]
    assert info["trigger_wall_ns"] == middle and info["window_seconds"] == window
    assert info["end_us"] - info["start_us"] == pytest.approx(window * 1e6, abs=1)
    assert flight.counts()["over_max"] == 0 and flight.counts()["suppressed"] == 0
    # A window longer than the ring is the ring's.
    mxprof.set_state("run")
    path = flight.snapshot_at("long", _native.clock_wall_ns(), 60, 0)
    mxprof.set_state("stop")
    assert _testing.load_trace(path)["otherData"]["flight_recorder"]["window_seconds"] == 5.0


def test_the_rank_0_worker_serves_one_job_trigger_per_interval(monkeypatch):
    from mxprof import flight
    from mxprof.distributed import _flight, _node

    served = []
    monkeypatch.setattr(_flight, "job_snapshot", lambda hub, relay, t, n: served.append((t, n)))
    hub = _node.Hub.__new__(_node.Hub)  # only its type is looked at
    relay = _flight.Relay(hub)
    try:
        mxprof.set_config(flight_recorder_interval=10)
        by = _node.Member("worker", 1, "h", 11)
        for k, at_s in enumerate((100, 105, 109.9, 110, 125)):
            relay._serve(_flight.Trigger(str(k), "watchdog", int(at_s * 1e9), 5.0, 0.0, by))
        assert [(t.id, n) for t, n in served] == [("0", 0), ("3", 2), ("4", 0)]
    finally:
        relay.close()
    assert relay._on_trigger not in flight.ON_TRIGGER


@pytest.mark.slow
def test_benchmark_quick_mode(tmp_path):
    import _bench

    stdout, doc = _bench.quick("flight_job.py", tmp_path)
    assert doc["ranks"] == 3 and len(doc["runs"]) == 2
    assert all(r["ranks"] == 3 and r["missing"] == 0 and r["events"] > 0 for r in doc["runs"])
    assert "from trigger to merged file" in stdout
