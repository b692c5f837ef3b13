"""mxprof.distributed: remote control, collection, clock alignment, security.

The job's other processes are real processes on loopback, started with
multiprocessing's spawn method (tests/_dist_child.py); this test process is
the rank-0 worker.
"""

import json
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time

import pytest

import mxprof
from mxprof import _testing
from mxprof.distributed import _wire
from mxprof.trace import clock as _clock
from mxprof.trace.merge import merge

zmq = pytest.importorskip("zmq", reason="the ZeroMQ transport needs pyzmq (mxprof[dist])")

from mxprof import distributed  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # spawned children import it
import _dist_child  # noqa: E402
import _dist_job  # noqa: E402
from _dist_job import free_port, ticks, wait_for, within  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def job(tmp_path):
    """Start peers with job.start(...); everything is stopped afterwards."""
    yield from _dist_job.job(tmp_path)


# ---- units: messages, clocks, merging ----


def test_messages_round_trip_and_bad_ones_are_rejected_with_a_reason():
    key, sid = b"secret", b"c" * _wire.CHANNEL_ID
    header = {"type": "dump", "id": 7, "args": {"finished": False}}
    frames = _wire.encode(key, sid, header, b"\x00\xff")
    assert _wire.decode(key, frames) == (header, b"\x00\xff")

    def reason(frames, key=key):
        with pytest.raises(_wire.Rejected) as e:
            _wire.decode(key, frames)
        return e.value.reason

    assert reason(frames, b"other") == "bad_mac"
    assert reason([*frames[:4], b"tampered"]) == "bad_mac"
    assert reason([frames[0], b"d" * _wire.CHANNEL_ID, *frames[2:]]) == "bad_mac"  # sid is signed
    assert reason(frames[:4]) == "malformed"
    assert reason([b"XXXX", *frames[1:]]) == "malformed"
    assert reason([frames[0], b"short", *frames[2:]]) == "malformed"
    assert reason([*frames[:4], b"x" * (_wire.MAX_BODY + 1)]) == "oversized"
    for bad in (b"not json", b"[1]", b'{"type": "rm -rf", "id": 1}', b'{"type": "dump"}'):
        mac = _wire._mac(key, b"", bad, b"")
        assert reason([_wire.MAGIC, b"", mac, bad, b""]) == "malformed"
    with pytest.raises(ValueError):
        _wire.encode(key, b"", {"type": "upload", "id": 1}, b"x" * (_wire.MAX_BODY + 1))


def test_a_channel_admits_each_sequence_number_once():
    key, sid = b"k" * 32, b"s" * _wire.CHANNEL_ID
    sender, receiver = _wire.Channel(sid, key), _wire.Channel(sid, key)
    first, second = (sender.seal({"type": "ping", "id": i}) for i in (1, 2))
    assert receiver.unseal(second)[0]["seq"] == 2  # overtaken: still admitted
    assert receiver.unseal(first)[0]["seq"] == 1
    for again in (first, second):
        with pytest.raises(_wire.Rejected) as e:
            receiver.unseal(again)
        assert e.value.reason == "replayed"
    window = _wire.Window()
    assert window.admit(_wire.Window.SPAN + 5)
    assert not window.admit(5)  # too old to tell: refused
    assert [window.admit(s) for s in (0, -1, True, "7")] == [False] * 4


def test_clock_exchange_and_the_least_delay_sample():
    # Peer clock = hub clock - 1000; 100 ns each way, 50 ns at the hub.
    assert _clock.exchange(0, 1100, 1150, 250) == (1000, 200)
    samples = [(0, 1100, 1150, 250), (1000, 2500, 2510, 1210), (5000, 6020, 6030, 5050)]
    est = _clock.best(samples)
    assert (est.offset_ns, est.error_ns, est.samples) == (1000, 20, 3)
    assert est.at_ns == 5025
    with pytest.raises(ValueError):
        _clock.best([])


def test_clock_model_interpolates_between_estimates_and_holds_outside():
    a = _clock.Estimate(at_ns=1_000, offset_ns=100, error_ns=5, samples=16)
    b = _clock.Estimate(at_ns=3_000, offset_ns=300, error_ns=9, samples=16)
    model = _clock.ClockModel((a, b))
    assert model.drift == pytest.approx(0.1)
    assert model.error_ns == 9
    assert model.offset_at(2_000) == pytest.approx(200)
    assert model.offset_at(0) == pytest.approx(100)  # before the first: held
    assert model.offset_at(10_000) == pytest.approx(300)  # after the last: held
    again = _clock.ClockModel.from_json(json.loads(json.dumps(model.to_json())))
    assert again == model
    with pytest.raises(ValueError):
        _clock.ClockModel.from_json({"estimates": [{"at_ns": "1"}]})
    assert _clock.IDENTITY.offset_at(123) == 0


def write_trace(path, base_ns, events, info=None):
    doc = {"traceEvents": events, "baseTimeNanoseconds": base_ns}
    if info is not None:
        doc["distributedInfo"] = info
    path.write_text(json.dumps(doc))


def test_merge_moves_each_process_onto_the_reference_clock(tmp_path):
    """Synthetic per-rank files: the server's clock is 5 s ahead and drifts 1 µs per ms,
    measured well enough (±0.5 µs per ms) to be applied; tests/test_merge.py has the rest."""
    base = 1_700_000_000_000_000_000
    hub_info = {"role": "worker", "rank": 0, "host": "h0", "pid": 10, "world_size": 2,
                "num_workers": 1, "num_servers": 1, "backend": "zmq",
                "clock": {"estimates": []}}  # fmt: skip
    est = [
        {"at_ns": base + 5_000_000_000, "offset_ns": -5_000_000_000, "error_ns": 2_000},
        {"at_ns": base + 5_010_000_000, "offset_ns": -5_000_010_000, "error_ns": 3_000},
    ]
    for e in est:
        e["samples"] = 16
    server_info = {**hub_info, "role": "server", "rank": 0, "host": "h1", "pid": 10,
                   "clock": {"estimates": est}}  # fmt: skip
    x = {"ph": "X", "name": "e", "tid": 1, "dur": 1.0}
    write_trace(tmp_path / "hub.json", base, [{**x, "pid": 10, "ts": 1000.0}], hub_info)
    # The server's event happened at true time base + 1 ms + 5 ms (its clock reads +5 s).
    write_trace(
        tmp_path / "server.json",
        base + 5_000_000_000,
        [{**x, "pid": 10, "ts": 6000.0}, {**x, "pid": 10, "ts": 11_000.0}],
        server_info,
    )
    out = tmp_path / "merged.json"
    merge([tmp_path / "hub.json", tmp_path / "server.json"], out)
    merged = _testing.load_trace(out)
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    assert sorted(names.values()) == ["server 0 (h1, pid 10)", "worker 0 (h0, pid 10)"]
    by_proc = {}
    for e in _testing.events(merged, "X"):
        by_proc.setdefault(names[e["pid"]], []).append(e["ts"])
    assert by_proc["worker 0 (h0, pid 10)"] == [1000.0]
    # At server time base+5.006 s the offset is -5 s - 6 µs (interpolated), at +5.011 s
    # it is past the last estimate: held at -5 s - 10 µs.
    assert by_proc["server 0 (h1, pid 10)"] == [pytest.approx(5994.0), pytest.approx(10_990.0)]
    info = merged["distributedInfo"]
    assert [(r["role"], r["rank"]) for r in info["ranks"]] == [("worker", 0), ("server", 0)]
    assert info["ranks"][1]["clock"]["estimates"] == est
    # The command line merges the same way.
    from mxprof import cli

    assert cli.main(["merge", str(tmp_path / "hub.json"), str(tmp_path / "server.json"),
                     "-o", str(tmp_path / "cli.json")]) == 0  # fmt: skip
    cli_ts = sorted(
        e["ts"] for e in _testing.events(_testing.load_trace(tmp_path / "cli.json"), "X")
    )
    assert cli_ts == [1000.0, pytest.approx(5994.0), pytest.approx(10_990.0)]


def test_a_bad_clock_in_an_input_is_a_trace_format_error(tmp_path):
    write_trace(tmp_path / "a.json", 1, [], {"role": "server", "clock": {"estimates": [{}]}})
    with pytest.raises(mxprof.TraceFormatError, match="distributedInfo.clock"):
        merge([tmp_path / "a.json"], tmp_path / "out.json")


# ---- init's arguments ----


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"role": "chief", "rank": 0, "num_workers": 1}, "role must be"),
        ({"role": "worker", "rank": 2, "num_workers": 2}, "out of range"),
        ({"role": "server", "rank": 0, "num_workers": 1}, "out of range"),
        ({"role": "worker", "num_workers": 1}, "rank is required"),
        ({"role": "worker", "rank": 0}, "num_workers is required"),
        ({"role": "worker", "rank": 0, "num_workers": 0}, "num_workers must be"),
        ({"role": "worker", "rank": "x", "num_workers": 1}, "rank must be an int"),
        ({"role": "worker", "rank": 0, "num_workers": 1, "backend": "mpi"}, "backend must be"),
        ({"role": "worker", "rank": 0, "num_workers": 1, "timeout": 0}, "timeout must be"),
        (
            {"role": "worker", "rank": 0, "num_workers": 1, "address": "tcp://10.1.2.3:9000"},
            "a token is required",
        ),
    ],
)
def test_bad_init_arguments_are_config_errors(kwargs, match):
    with pytest.raises(mxprof.ConfigError, match=match):
        distributed.init(**kwargs)
    assert not distributed.is_initialized()


def test_loopback_detection():
    assert distributed.is_loopback("tcp://127.0.0.1:1")
    assert distributed.is_loopback("tcp://localhost:1")
    assert distributed.is_loopback("tcp://[::1]:1")
    assert distributed.is_loopback("ipc:///tmp/x")
    assert not distributed.is_loopback("tcp://0.0.0.0:1")
    assert not distributed.is_loopback("tcp://*:1")
    assert not distributed.is_loopback("tcp://example.com:1")


def test_a_process_that_never_inits_is_untouched(tmp_path):
    assert not distributed.is_initialized()
    names = {t.name for t in threading.enumerate()}
    assert not any(n.startswith("mxprof-dist") for n in names)
    with pytest.raises(mxprof.StateError, match="distributed.init"):
        mxprof.set_state("run", profile_process="server")
    with pytest.raises(mxprof.StateError, match="not initialised"):
        distributed.collect(tmp_path / "x.json")


def test_init_reads_the_environment(job, monkeypatch, tmp_path):
    monkeypatch.setenv("MXPROF_ROLE", "worker")
    monkeypatch.setenv("MXPROF_RANK", "0")
    monkeypatch.setenv("MXPROF_NUM_WORKERS", "1")
    monkeypatch.setenv("MXPROF_NUM_SERVERS", "1")
    monkeypatch.setenv("MXPROF_ADDRESS", job.address)
    monkeypatch.setenv("MXPROF_TOKEN", "t0ken")
    info = distributed.init()
    assert (info["role"], info["rank"], info["world_size"]) == ("worker", 0, 2)
    job.start("server", 0, 1, 1, token="t0ken")
    mxprof.set_state("run", profile_process="server")  # waits for the server to join
    assert [(m.role, m.rank) for m in distributed.members()] == [("server", 0)]
    with pytest.raises(mxprof.StateError, match="already initialised"):
        distributed.init()


# ---- real jobs on loopback ----


def test_remote_calls_reach_every_server(job, tmp_path):
    distributed.init("worker", 0, 1, 2, address=job.address, timeout=20)
    for r in range(2):
        job.start("server", r, 1, 2)
    mxprof.set_config(filename="job.json", profile_process="server")
    assert not os.path.exists("job.json")  # the local profiler is not configured
    mxprof.set_state("run", profile_process="server")
    time.sleep(0.3)
    mxprof.pause(profile_process="server")
    time.sleep(0.4)
    mxprof.resume(profile_process="server")
    time.sleep(0.3)
    mxprof.set_state("stop", profile_process="server")
    mxprof.dump(profile_process="server")
    assert sorted(m.rank for m in distributed.members()) == [0, 1]
    for r in range(2):
        path = tmp_path / f"rank{r}_job.json"  # MXNet's name for a server's file
        ts = ticks(path)
        assert len(ts) > 20
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        assert max(gaps) > 300_000  # µs: nothing recorded while paused (0.4 s)
        assert sum(g > 300_000 for g in gaps) == 1
        trace = _testing.load_trace(path)
        assert trace["distributedInfo"]["role"] == "server"
        assert trace["distributedInfo"]["rank"] == r
    # Stopped and dumped: nothing more is recorded, and a second dump is a no-op.
    counts = [len(ticks(tmp_path / f"rank{r}_job.json")) for r in range(2)]
    time.sleep(0.2)
    mxprof.dump(profile_process="server")
    assert [len(ticks(tmp_path / f"rank{r}_job.json")) for r in range(2)] == counts


def test_a_servers_error_comes_back_naming_the_server(job, tmp_path):
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    job.start("server", 0, 1, 1)
    mxprof.set_config(filename=str(tmp_path / "missing" / "t.json"), profile_process="server")
    mxprof.set_state("run", profile_process="server")
    with pytest.raises(distributed.DistributedError, match=r"server 0 \(.*pid \d+\): OutputError"):
        mxprof.dump(profile_process="server")
    # Values travel as structured data: a comma or a colon is just a character.
    mxprof.set_config(filename="a,b:c.json", profile_process="server")
    mxprof.dump(profile_process="server")
    assert (tmp_path / "rank0_a,b:c.json").exists()


def test_collect_puts_every_process_on_one_timeline(job, tmp_path):
    distributed.init("worker", 0, 2, 2, address=job.address, timeout=20)
    for r in range(2):
        job.start("server", r, 2, 2)
    job.start("worker", 1, 2, 2, run_locally=True)
    mxprof.set_config(filename="trace.json", aggregate_stats=True)
    mxprof.set_config(filename="trace.json", aggregate_stats=True, profile_process="server")
    mxprof.set_state("run", profile_process="server")
    mxprof.set_state("run")
    step = mxprof.Domain("worker").new_task("tick")
    for _ in range(20):
        with step:
            time.sleep(0.002)

    def server_ticks(stats):
        return [
            json.loads(text).get("Time", {}).get("server", {}).get("tick", {}).get("Count", 0)
            for who, text in stats.items()
            if who.startswith("server")
        ]

    # A loaded machine may not have run the others' loops yet: wait until
    # each has a tick in its profile.
    assert wait_for(lambda: (tmp_path / "worker1.ticked").exists(), 20)
    assert wait_for(lambda: all(server_ticks(distributed.dumps(format="json"))), 20)
    # Per-process statistics, gathered here.
    with pytest.raises(mxprof.ConfigError, match="format"):
        distributed.dumps(format="xml")
    stats = distributed.dumps(format="json")
    assert [who.split(" (")[0] for who in stats][0] == "worker 0"
    by_role = {who.split(" (")[0]: text for who, text in stats.items()}
    assert sorted(by_role) == ["server 0", "server 1", "worker 0", "worker 1"]
    assert json.loads(by_role["worker 0"])["Time"]["worker"]["tick"]["Count"] == 20
    for server in ("server 0", "server 1"):
        assert json.loads(by_role[server])["Time"][server.split()[0]]["tick"]["Count"] > 0
    assert by_role["worker 1"] == ""  # its own aggregate_stats is off
    summary = distributed.collect(tmp_path / "merged.json")
    assert summary["missing"] == []
    merged = _testing.load_trace(tmp_path / "merged.json")
    # merged_from names each process and its own file, not the temporary
    # copies collect merged (deleted by now).
    assert merged["otherData"]["merged_from"] == [
        f"{item['process']}: {item['path']}" for item in summary["inputs"]
    ]
    assert sorted(item["path"] for item in summary["inputs"]) == [
        "rank0_trace.json", "rank1_trace.json", "trace.json", "worker1_trace.json"
    ]  # fmt: skip
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    host, me = socket.gethostname(), os.getpid()
    labels = sorted(names.values())
    assert labels[-1] == f"worker 1 ({host}, pid {job.procs[2].pid})"
    assert f"worker 0 ({host}, pid {me})" in labels
    assert {lab.split(" (")[0] for lab in labels} == {
        "server 0",
        "server 1",
        "worker 0",
        "worker 1",
    }
    ticks_by = {}
    for e in _testing.events(merged, "X", "tick"):
        ticks_by.setdefault(names[e["pid"]].split(" (")[0], []).append(e)
    assert sorted(ticks_by) == ["server 0", "server 1", "worker 0", "worker 1"]
    assert len(ticks_by["worker 0"]) == 20
    info = merged["distributedInfo"]
    assert (info["world_size"], info["num_workers"], info["num_servers"]) == (4, 2, 2)
    assert len(info["ranks"]) == 4
    for rank in info["ranks"]:
        est = rank["clock"]["estimates"]
        if (rank["role"], rank["rank"]) == ("worker", 0):
            assert est == []
        else:
            assert len(est) == 2, rank  # at init and at collect
            assert rank["clock"]["error_ns"] < 50_000_000
    # Each process's own file says who wrote it, with its clock.
    for name in ("rank0_trace.json", "rank1_trace.json", "worker1_trace.json", "trace.json"):
        assert "distributedInfo" in _testing.load_trace(tmp_path / name)


def test_a_collect_during_a_peers_first_clock_estimate_keeps_both(job, tmp_path):
    # The hub knows a peer from its hello; its first clock estimate comes
    # after.  A collect in between must not lose that estimate.
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    job.start("server", 0, 1, 1, slow_first_clock=1.0)
    assert wait_for(lambda: (tmp_path / "measuring").exists(), 20)
    assert [m.label.split(" (")[0] for m in distributed.members()] == ["server 0"]
    mxprof.set_config(filename="trace.json", profile_process="server")
    mxprof.set_state("run", profile_process="server")
    mxprof.set_config(filename="trace.json")
    mxprof.set_state("run")
    summary = distributed.collect(tmp_path / "merged.json")
    assert summary["missing"] == []
    ranks = _testing.load_trace(tmp_path / "merged.json")["distributedInfo"]["ranks"]
    (server,) = [r for r in ranks if r["role"] == "server"]
    est = server["clock"]["estimates"]
    assert len(est) == 2, est  # join's, then collect's
    assert est[0]["at_ns"] < est[1]["at_ns"]


def test_a_skewed_clock_is_corrected_within_the_reported_error(job, tmp_path):
    skew = 3_000_000_000  # the server's wall clock is 3 s fast
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    job.start("server", 0, 1, 1, skew_ns=skew)
    mxprof.set_config(filename="trace.json")
    mxprof.set_config(filename="trace.json", profile_process="server")
    mxprof.set_state("run", profile_process="server")
    mxprof.set_state("run")
    marker = mxprof.Domain("hub").new_marker("before")
    after = mxprof.Domain("hub").new_marker("after")
    marker.mark()
    mxprof.dump(finished=False, profile_process="server")  # the server's 'flush' task
    after.mark()
    distributed.collect(tmp_path / "merged.json")
    server_file = _testing.load_trace(tmp_path / "rank0_trace.json")
    hub_file = _testing.load_trace(tmp_path / "trace.json")
    raw_gap = server_file["baseTimeNanoseconds"] - hub_file["baseTimeNanoseconds"]
    assert abs(raw_gap - skew) < 1_000_000_000  # uncorrected, the server is ~3 s off
    merged = _testing.load_trace(tmp_path / "merged.json")
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    (a,) = [e["ts"] for e in _testing.events(merged, "i", "before")]
    (c,) = [e["ts"] for e in _testing.events(merged, "i", "after")]
    flushes = [
        e["ts"]
        for e in _testing.events(merged, "X", "flush")
        if names[e["pid"]].startswith("server 0")
    ]
    err_us = merged["distributedInfo"]["ranks"][1]["clock"]["error_ns"] / 1000
    assert err_us < 20_000
    # The server's flush happened while the hub waited between its two markers.
    assert any(a - err_us <= f <= c + err_us for f in flushes), (a, c, err_us, flushes)


def test_a_killed_server_is_a_timeout_not_a_hang(job, tmp_path):
    distributed.init("worker", 0, 1, 2, address=job.address, timeout=2)
    job.start("server", 0, 1, 2)
    victim = job.start("server", 1, 1, 2)
    # A slow machine may take longer than the job's 2 s to start them.
    assert wait_for(lambda: len(distributed.members()) == 2, 60)
    mxprof.set_state("run", profile_process="server")
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    with pytest.raises(distributed.DistributedTimeout, match="server 1") as e:
        within(120, mxprof.set_state, "stop", profile_process="server")
    assert isinstance(e.value, TimeoutError)
    assert "server 0" not in str(e.value)  # the live server answered


def test_a_server_that_never_comes_is_a_timeout(job):
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=0.5)
    with pytest.raises(
        distributed.DistributedTimeout, match="not connected within 0.5 s: server 0"
    ):
        within(120, mxprof.dump, profile_process="server")


def test_a_second_process_with_the_same_role_and_rank_is_refused(job, tmp_path):
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    first = job.start("server", 0, 1, 1)
    assert wait_for(lambda: len(distributed.members()) == 1, 60)
    second = job.start("server", 0, 1, 1)
    second.join(60)
    assert second.exitcode == 0  # its init failed (and said why); it did not hang
    error = (tmp_path / "server0.error").read_text()
    assert error.startswith("DistributedError: the rank-0 worker refused server 0 ")
    assert f"pid {second.pid}): DistributedError: server 0 is taken: server 0 (" in error
    assert f"pid {first.pid}) joined the job as server 0 already" in error
    # The first keeps its place and obeys.
    assert [(m.role, m.rank, m.pid) for m in distributed.members()] == [("server", 0, first.pid)]
    mxprof.set_config(filename="t.json", profile_process="server")
    mxprof.set_state("run", profile_process="server")
    time.sleep(0.1)
    mxprof.set_state("stop", profile_process="server")
    mxprof.dump(profile_process="server")
    trace = _testing.load_trace(tmp_path / "rank0_t.json")
    assert trace["distributedInfo"]["pid"] == first.pid
    assert _testing.events(trace, "X", "tick")


def test_a_restarted_process_takes_the_place_of_a_dead_one(job, tmp_path):
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=20)
    dead = job.start("server", 0, 1, 1)
    assert wait_for(lambda: len(distributed.members()) == 1, 60)
    os.kill(dead.pid, signal.SIGKILL)  # no goodbye: the hub still lists it
    dead.join(10)
    assert [m.pid for m in distributed.members()] == [dead.pid]
    again = job.start("server", 0, 1, 1)
    assert wait_for(lambda: [m.pid for m in distributed.members()] == [again.pid], 60)
    assert not (tmp_path / "server0.error").exists()


def test_a_wrong_token_is_rejected(job, tmp_path):
    distributed.init("worker", 0, 1, 1, address=job.address, token="right", timeout=1)
    p = job.start("server", 0, 1, 1, token="wrong", timeout=1.5)
    p.join(30)
    error = (tmp_path / "server0.error").read_text()
    assert error.startswith("DistributedTimeout") and "token" in error
    assert distributed.tally()["bad_mac"] >= 1
    assert distributed.members() == []


def raw_dealer(address):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    return s


def test_malformed_oversized_and_unknown_messages_are_dropped_and_counted(job):
    distributed.init("worker", 0, 1, 1, address=job.address, token="k", timeout=2)
    s = raw_dealer(job.address)
    try:
        s.send_multipart([b"hello"])  # not ours
        s.send_multipart([_wire.MAGIC, b"", b"\x00" * 32, b"{}", b""])  # no valid MAC
        big = _wire.encode(b"k", b"", {"type": "upload", "id": 1}, b"")
        s.send_multipart([*big[:4], b"x" * (_wire.MAX_BODY + 1)])  # oversized
        # Correctly signed, but with no channel: not obeyed.
        s.send_multipart(_wire.encode(b"k", b"", {"type": "set_state", "id": 2, "args": {}}))
        expected = {"malformed": 1, "bad_mac": 1, "oversized": 1, "unknown_peer": 1}
        assert wait_for(lambda: all(distributed.tally()[k] >= v for k, v in expected.items())), (
            distributed.tally()
        )
        assert s.poll(200) == 0  # none of them was answered
    finally:
        s.close()
    assert distributed.members() == []


def test_torch_distributed_backend_with_gloo(tmp_path):
    pytest.importorskip("torch.distributed", reason="backend='torch' needs PyTorch")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    port = free_port()
    result = tmp_path / "result.json"
    procs = [
        SPAWN.Process(target=_dist_child.torch_job, args=(str(tmp_path), r, port, str(result)))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    data = json.loads(result.read_text())
    assert data["summary"]["missing"] == []
    assert data["tally"]["bad_mac"] == data["tally"]["malformed"] == 0
    merged = _testing.load_trace(tmp_path / "merged.json")
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    roles = {names[e["pid"]].split(" (")[0] for e in _testing.events(merged, "X", "tick")}
    assert roles == {"worker 0", "server 0"}
    assert merged["distributedInfo"]["backend"] == "torch"
    assert (tmp_path / "rank0_trace.json").exists()


def test_a_process_that_left_early_still_makes_the_timeline(job, tmp_path):
    """Worker 1 finishes, hands its trace to the hub as it leaves, and exits before collect."""
    distributed.init("worker", 0, 2, 0, address=job.address, timeout=10)
    early = job.start("worker", 1, 2, 0, run_locally=True, life=1.0)
    early.join(30)
    assert early.exitcode == 0
    assert distributed.members() == []  # it said goodbye
    mxprof.set_config(filename="trace.json")
    mxprof.set_state("run")
    summary = distributed.collect(tmp_path / "merged.json")
    assert [i["process"].split(" (")[0] for i in summary["inputs"]] == ["worker 0", "worker 1"]
    merged = _testing.load_trace(tmp_path / "merged.json")
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    left = [
        e for e in _testing.events(merged, "X", "tick") if names[e["pid"]].startswith("worker 1")
    ]
    assert len(left) == len(ticks(tmp_path / "worker1_trace.json")) > 10
    # Its trace came as a deposit in a temporary folder, gone now: the
    # merged file names the process and its own file.
    assert merged["otherData"]["merged_from"] == [
        f"{summary['inputs'][0]['process']}: trace.json",
        f"{summary['inputs'][1]['process']}: worker1_trace.json",
    ]
    (rank,) = [r for r in merged["distributedInfo"]["ranks"] if r["rank"] == 1]
    assert len(rank["clock"]["estimates"]) == 2  # measured again as it left


def test_a_server_stopped_by_sigterm_leaves_its_trace(job, tmp_path):
    """Its profile began by a remote call (on the channel's thread); init put
    the signal handlers in place on the main thread."""
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=10)
    server = job.start("server", 0, 1, 1)
    mxprof.set_config(filename="t.json", continuous_dump=False, profile_process="server")
    mxprof.set_state("run", profile_process="server")
    time.sleep(0.3)
    os.kill(server.pid, signal.SIGTERM)
    server.join(10)
    assert server.exitcode == -signal.SIGTERM  # the default action still ran
    assert len(ticks(tmp_path / "rank0_t.json")) > 10  # complete JSON, never dumped before


def test_a_forked_child_is_not_a_member(job, tmp_path):
    distributed.init("worker", 0, 1, 0, address=job.address)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no channel, its own profiler untouched
        ok = not distributed.is_initialized()
        try:
            mxprof.set_state("run", profile_process="server")
            ok = False
        except mxprof.StateError:
            pass
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    assert distributed.is_initialized()  # the parent keeps its own
