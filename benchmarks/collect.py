"""collect() of a whole job: its time and the rank-0 worker's memory.

    python benchmarks/collect.py [--workers 8] [--servers 4] [--events 50000]
                                 [--output merged.json]

This process is the rank-0 worker; the other workers and the servers are
local processes (spawn).  Every process records ``--events`` ranges, then
the profiles stop and this process calls ``distributed.collect``.  Printed:
the time of the collect, the merged file's size, and this process's RSS
(``VmRSS``) before the collect and after it, and its peak (``VmHWM``) before
and after, from /proc/self/status; then the time of the merge alone of
the same files (``mxprof.trace.merge.merge``), which tells the transfer's
share of the collect.
"""

from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import socket
import sys
import tempfile
import time

import mxprof
from mxprof import distributed
from mxprof.trace.merge import merge


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def memory() -> dict[str, float]:
    """This process's current and peak resident memory, in MB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def peer(role: str, rank: int, nw: int, ns: int, address: str, workdir: str, n: int) -> None:
    os.chdir(workdir)
    distributed.init(role, rank, nw, ns, address=address, timeout=120)
    mxprof.set_config(filename="t.json")
    mxprof.set_state("run")
    task = mxprof.Domain(role).new_task("work")
    for _ in range(n):
        task.start()
        task.stop()
    mxprof.set_state("stop")
    open(f"recorded-{role}{rank}", "w").close()
    while not os.path.exists("done"):
        time.sleep(0.05)
    distributed.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--output", default="merged.json")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="mxprof-bench-collect-")
    os.chdir(workdir)
    address = free_address()
    nw, ns = args.workers, args.servers
    distributed.init("worker", 0, nw, ns, address=address, timeout=120)
    ctx = multiprocessing.get_context("spawn")
    slots = [("server", r) for r in range(ns)] + [("worker", r) for r in range(1, nw)]
    procs = [
        ctx.Process(target=peer, args=(role, r, nw, ns, address, workdir, args.events))
        for role, r in slots
    ]
    for p in procs:
        p.start()
    mxprof.set_config(filename="t.json")
    mxprof.set_state("run")
    task = mxprof.Domain("worker").new_task("work")
    for _ in range(args.events):
        task.start()
        task.stop()
    mxprof.set_state("stop")
    while not all(os.path.exists(f"recorded-{role}{r}") for role, r in slots):
        time.sleep(0.05)
    before = memory()
    t0 = time.perf_counter()
    summary = distributed.collect(args.output)
    took = time.perf_counter() - t0
    after = memory()
    size = os.path.getsize(args.output) / 1e6
    open("done", "w").close()
    for p in procs:
        p.join()
    distributed.shutdown()
    print(f"{nw} workers + {ns} servers on {socket.gethostname()}, Python {sys.version.split()[0]}")
    print(
        f"collect: {summary['events']} events from {len(summary['inputs'])} processes in "
        f"{took:.2f} s ({size:.0f} MB {os.path.basename(args.output)}), "
        f"missing {len(summary['missing'])}"
    )
    print(
        f"rank-0 RSS: {before['VmRSS']:.0f} MB before, {after['VmRSS']:.0f} MB after; "
        f"peak {before['VmHWM']:.0f} MB before, {after['VmHWM']:.0f} MB after "
        f"(+{after['VmHWM'] - before['VmRSS']:.0f} MB for the collect)"
    )
    inputs = sorted(glob.glob("t.json") + glob.glob("*_t.json"))
    t0 = time.perf_counter()
    merge(inputs, "again.json")
    print(f"the merge alone of the same {len(inputs)} files: {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
