"""Helpers of the distributed tests: a job of real peer processes on loopback, bounded waits.

The tests' ``job`` fixtures are ``yield from job(tmp_path)``; the peers run
tests/_dist_child.py's ``serve`` (spawned, so each is a fresh interpreter).
"""

import multiprocessing
import socket
import threading
import time

import _dist_child

from mxprof import _testing, distributed
from mxprof._session import SESSION

SPAWN = multiprocessing.get_context("spawn")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.procs = []

    def start(self, role, rank, nw, ns, **kw):
        p = SPAWN.Process(
            target=_dist_child.serve,
            args=(str(self.tmp_path), role, rank, nw, ns, self.address),
            kwargs=kw,
            daemon=True,
        )
        p.start()
        self.procs.append(p)
        return p


def job(tmp_path):
    """Start peers with job.start(...); everything is stopped afterwards."""
    j = Job(tmp_path)
    yield j
    (tmp_path / "done").touch()
    distributed.shutdown()
    # This process's traces would go on naming it a member of the job that
    # ended (its distributedInfo outlives shutdown, for the file still open):
    # the tests after this one record traces of no job.
    SESSION.set_top_json("")
    for p in j.procs:
        p.join(10)
        if p.is_alive():
            p.kill()


def within(limit, call, *args, **kwargs):
    """call(*args, **kwargs), failing the test if it has not returned (or
    raised) after limit seconds: a generous bound that tells a hang from a
    slow machine, not a measurement."""
    outcome = []

    def run():
        try:
            outcome.append((True, call(*args, **kwargs)))
        except BaseException as e:  # handed to the test's thread
            outcome.append((False, e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert outcome, f"{call.__name__} still running after {limit} s: a hang"
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def ticks(path, name="tick"):
    trace = _testing.load_trace(path)
    return sorted(e["ts"] for e in _testing.events(trace, "X", name))


def wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while not pred() and time.monotonic() < end:
        time.sleep(0.01)
    return pred()
