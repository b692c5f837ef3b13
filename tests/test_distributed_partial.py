"""collect() with processes dead, frozen or never there; failed joins; no second upload.

Bounds: collect's waiting ends ``timeout`` after the call, or SYNC_FLOOR
(``min(timeout, 2 s)``) later; then the merge of a few small files.  The
tests allow that plus 20 s for a loaded machine: a bound that tells a hang
(or a second timeout) from a slow machine.
"""

import gzip
import json
import os
import signal
import sys
import threading
import time
import warnings

import pytest

import mxprof
from mxprof import _testing

zmq = pytest.importorskip("zmq", reason="the ZeroMQ transport needs pyzmq (mxprof[dist])")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # spawned children import it
import _dist_job  # noqa: E402
from _dist_job import free_port, ticks, wait_for, within  # noqa: E402

from mxprof import distributed  # noqa: E402
from mxprof.distributed import _collect, _secret, _wire  # noqa: E402

SLACK = 20.0


@pytest.fixture
def job(tmp_path):
    yield from _dist_job.job(tmp_path)


def hub_node():
    return distributed._node_ref["node"]


def by_process(path):
    """Tick counts per process label (role and rank) in a merged file."""
    if str(path).endswith(".gz"):
        with gzip.open(path, "rt") as f:
            merged = json.load(f)
    else:
        merged = _testing.load_trace(path)
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    counts = {}
    for e in _testing.events(merged, "X", "tick"):
        label = names[e["pid"]].split(" (")[0]
        counts[label] = counts.get(label, 0) + 1
    return merged, counts


def profiled_servers(job, tmp_path, n, timeout):
    """This process as worker 0 with n servers that profiled some ticks and
    wrote them (rank<r>_t.json); this process's own profile is running."""
    distributed.init("worker", 0, 1, n, address=job.address, timeout=timeout)
    procs = [job.start("server", r, 1, n) for r in range(n)]
    assert wait_for(lambda: len(distributed.members()) == n, 60)
    mxprof.set_config(filename="t.json", profile_process="server")
    mxprof.set_state("run", profile_process="server")
    mxprof.set_config(filename="hub.json")
    mxprof.set_state("run")
    tick = mxprof.Domain("worker").new_task("tick")
    for _ in range(5):
        with tick:
            pass
    assert wait_for(lambda: all(_has_ticks(tmp_path / f"rank{r}_t.json") for r in range(n)), 30)
    mxprof.set_state("stop", profile_process="server")
    mxprof.dump(profile_process="server")  # every server's file is complete now
    return procs


def _has_ticks(path):
    try:
        return len(ticks(path)) > 5
    except Exception:
        return False


def test_a_killed_server_leaves_a_partial_file_naming_it(job, tmp_path):
    timeout = 3.0
    server0, victim = profiled_servers(job, tmp_path, 2, timeout)
    written = len(ticks(tmp_path / "rank1_t.json"))
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    out = tmp_path / "merged.json"
    with pytest.warns(RuntimeWarning, match="server 1 .*has exited") as caught:
        summary = within(timeout + _collect.SYNC_FLOOR + SLACK, distributed.collect, out)
    assert f"pid {victim.pid}" in str(caught[0].message)
    merged, counts = by_process(out)
    assert counts["worker 0"] == 5
    assert counts["server 0"] > 5
    assert counts["server 1"] == written  # its last flushed file, merged
    (gap,) = merged["distributedInfo"]["missing"]
    assert (gap["role"], gap["rank"], gap["failed"]) == ("server", 1, True)
    assert "has exited" in gap["why"]
    assert os.path.basename(gap["last_file"]) == "rank1_t.json"
    assert summary["missing"] == [gap]
    assert [i["process"].split(" (")[0] for i in summary["inputs"]] == [
        "worker 0",
        "server 0",
        "server 1",
    ]
    # The dead server is on the hub's clock like the others.
    ranks = {(r["role"], r["rank"]): r for r in merged["distributedInfo"]["ranks"]}
    assert ranks[("server", 1)]["clock"]["estimates"]


def test_a_frozen_server_ends_the_collect_within_its_timeout(job, tmp_path):
    timeout = 2.0
    _, frozen = profiled_servers(job, tmp_path, 2, timeout)
    written = len(ticks(tmp_path / "rank1_t.json"))
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        out = tmp_path / "merged.json.gz"
        with pytest.raises(distributed.DistributedTimeout, match="server 1 .*no answer") as e:
            within(timeout + _collect.SYNC_FLOOR + SLACK, distributed.collect, out, strict=True)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert isinstance(e.value, TimeoutError)
    assert "server 0" not in str(e.value)  # it answered
    assert "rank1_t.json is merged instead" in str(e.value)
    merged, counts = by_process(out)  # written before the error
    assert counts["server 0"] > 5 and counts["server 1"] == written
    (gap,) = merged["distributedInfo"]["missing"]
    assert gap["process"].startswith("server 1 (") and f"pid {frozen.pid}" in gap["process"]
    assert "no answer within" in gap["why"]
    assert e.value.summary["missing"] == [gap]


def test_a_process_that_never_came_is_named_and_the_rest_merged(job, tmp_path):
    distributed.init("worker", 0, 2, 1, address=job.address, timeout=0.5)
    worker = job.start("worker", 1, 2, 1, run_locally=True)
    assert wait_for(lambda: len(distributed.members()) == 1, 60)
    assert wait_for(lambda: (tmp_path / "worker1.ticked").exists(), 30)
    mxprof.set_config(filename="hub.json")
    mxprof.set_state("run")
    out = tmp_path / "merged.json"
    with pytest.warns(RuntimeWarning, match=r"server 0: not connected within 0.5 s"):
        summary = within(0.5 + _collect.SYNC_FLOOR + SLACK, distributed.collect, out)
    merged, counts = by_process(out)
    assert counts["worker 1"] >= 1
    (gap,) = merged["distributedInfo"]["missing"]
    assert gap == {
        "process": "server 0",
        "role": "server",
        "rank": 0,
        "why": "not connected within 0.5 s (not started, dead, or on another token or address)",
        "failed": True,
        "last_file": None,
    }
    assert summary["missing"] == [gap]
    assert worker.is_alive()


def test_a_process_whose_profiler_never_ran_is_listed_without_a_warning(job, tmp_path):
    distributed.init("worker", 0, 1, 1, address=job.address, timeout=5)
    job.start("server", 0, 1, 1)
    assert wait_for(lambda: len(distributed.members()) == 1, 60)
    mxprof.set_config(filename="hub.json")
    mxprof.set_state("run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = distributed.collect(tmp_path / "merged.json")
    (gap,) = summary["missing"]
    assert (gap["role"], gap["why"], gap["failed"]) == ("server", "its profiler never ran", False)


def test_no_second_upload_after_a_successful_collect(job, tmp_path):
    procs = profiled_servers(job, tmp_path, 2, 10.0)
    summary = distributed.collect(tmp_path / "merged.json")
    assert summary["missing"] == []
    received = distributed.tally()["received"]
    (tmp_path / "done").touch()  # the servers shut down, saying goodbye
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert wait_for(lambda: distributed.members() == [], 10)
    node = hub_node()
    assert node.reg.deposits == {}  # nothing uploaded again
    assert sorted(node.reg.departed) == [("server", 0), ("server", 1)]
    # Each said only goodbye: no clock round trips, no deposit pieces.
    assert distributed.tally()["received"] - received == 2


def test_a_process_that_records_after_the_collect_still_leaves_its_trace(job, tmp_path):
    procs = profiled_servers(job, tmp_path, 1, 10.0)
    distributed.collect(tmp_path / "first.json")
    mxprof.set_state("run", profile_process="server")  # a new profile after the collect
    time.sleep(0.3)  # ticks in it (one every 2 ms)
    (tmp_path / "done").touch()
    procs[0].join(30)
    assert list(hub_node().reg.deposits) == [("server", 0)]
    summary = distributed.collect(tmp_path / "second.json")
    assert summary["missing"] == []
    _, again = by_process(tmp_path / "second.json")
    assert again["server 0"] >= 1  # from what it left


class FakeHub:
    """A ROUTER that answers open and hello and nothing else, recording what
    arrives (it leaves a job secret for its address as the rank-0 worker does)."""

    def __init__(self, address):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.secret = _secret.generate()
        self.secret_path = _secret.publish(address, self.secret)
        self.channels = {}
        self.kinds = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            src, *frames = self.sock.recv_multipart()
            sid = _wire.channel_of(frames)
            if not sid:
                header, _ = _wire.decode(self.secret, frames)
                self.kinds.append(header["type"])
                nonce = bytes.fromhex(header["args"]["nonce"])
                sid = os.urandom(_wire.CHANNEL_ID)
                key = _wire.channel_key(self.secret, sid, nonce)
                self.channels[sid] = _wire.Channel(sid, key, src)
                answer = {"type": "ok", "re": header["id"], "args": {"channel": sid.hex()}}
                self.sock.send_multipart([src, *_wire.encode(self.secret, b"", answer)])
                continue
            channel = self.channels[sid]
            header, _ = channel.unseal(frames)
            self.kinds.append(header["type"])
            if header["type"] == "hello":
                answer = channel.seal({"type": "ok", "re": header["id"], "args": {}})
                self.sock.send_multipart([src, *answer])

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        self.ctx.term()
        _secret.withdraw(self.secret_path, self.secret)


def test_a_failed_init_returns_within_its_timeout_and_leaves_nothing(tmp_path):
    """The hub takes the hello, then never answers a clock ping."""
    address = f"tcp://127.0.0.1:{free_port()}"
    fake = FakeHub(address)
    timeout = 3.0
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(distributed.DistributedTimeout, match="measuring the clock"):
                # Before: one timeout for the pings, then up to 2 s more for a
                # deposit of a trace nobody asked for, and a warning about it.
                within(timeout + 2.5, distributed.init, "server", 0, 1, 1, address=address,
                       timeout=timeout)  # fmt: skip
        assert [str(w.message) for w in caught] == []
        assert wait_for(lambda: "bye" in fake.kinds, 5)
    finally:
        fake.close()
    assert "deposit" not in fake.kinds
    assert fake.kinds[:2] == ["open", "hello"] and set(fake.kinds[2:]) == {"ping", "bye"}
    assert not distributed.is_initialized()


def test_the_missing_list_is_json(tmp_path):
    gap = _collect.Gap("server 1 (h, pid 3)", "server", 1, "gone", True, last_file="/x/t.json")
    assert json.loads(json.dumps(gap.to_json()))["last_file"] == "/x/t.json"
    assert gap.sentence() == (
        "server 1 (h, pid 3): gone; its last flushed file t.json is merged instead"
    )


def test_a_dead_servers_damaged_last_file_is_left_out_not_the_collect(job, tmp_path):
    timeout = 3.0
    _, victim = profiled_servers(job, tmp_path, 2, timeout)
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    last = tmp_path / "rank1_t.json"
    info = json.dumps(_testing.load_trace(last)["distributedInfo"])
    # Its identity is readable at the end; its events are not JSON.
    last.write_text('{"traceEvents":[{"ph":"X",,,\n],"distributedInfo":' + info + "}")
    out = tmp_path / "merged.json"
    with pytest.warns(RuntimeWarning, match="could not be merged"):
        summary = within(timeout + _collect.SYNC_FLOOR + SLACK, distributed.collect, out)
    merged, counts = by_process(out)
    assert set(counts) == {"worker 0", "server 0"}
    (gap,) = merged["distributedInfo"]["missing"]
    assert gap["last_file"] is None and "could not be merged" in gap["why"]
    assert summary["missing"] == [gap]
