"""The distributed control channel: round trips, clock error, collection.

    python benchmarks/distributed.py [--servers 2] [--calls 200] [--events 100000]

This process is the rank-0 worker; it starts the servers as local
processes (spawn), then measures:

- the round trip of a remote call acknowledged by every server
  (``pause``/``resume`` with ``profile_process='server'``), median and p90;
- each server's clock offset estimate and its error bound (half the
  fastest of 16 round trips), at init and at collect;
- ``collect()`` of traces holding ``--events`` ranges per process.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import time

import mxprof
from mxprof import distributed


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def server(rank: int, servers: int, address: str, workdir: str, events: int) -> None:
    os.chdir(workdir)
    distributed.init("server", rank, 1, servers, address=address)
    task = mxprof.Domain("server").new_task("work")
    while not os.path.exists("record"):
        time.sleep(0.01)
    for _ in range(events):
        task.start()
        task.stop()
    open(f"recorded{rank}", "w").close()
    while not os.path.exists("done"):
        time.sleep(0.01)
    distributed.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="mxprof-bench-dist-")
    os.chdir(workdir)
    address = free_address()
    ctx = multiprocessing.get_context("spawn")
    distributed.init("worker", 0, 1, args.servers, address=address)
    procs = [
        ctx.Process(target=server, args=(r, args.servers, address, workdir, args.events))
        for r in range(args.servers)
    ]
    for p in procs:
        p.start()
    mxprof.set_config(filename="t.json", profile_process="server")
    mxprof.set_state("run", profile_process="server")  # waits for every server
    rtt = []
    for i in range(args.calls):
        t0 = time.perf_counter_ns()
        (mxprof.pause if i % 2 == 0 else mxprof.resume)(profile_process="server")
        rtt.append(time.perf_counter_ns() - t0)
    mxprof.resume(profile_process="server")
    rtt.sort()
    print(f"{args.servers} servers on {socket.gethostname()}, Python {sys.version.split()[0]}")
    print(
        f"remote call acknowledged by all: median {statistics.median(rtt) / 1e3:.0f} us,"
        f" p90 {rtt[len(rtt) * 9 // 10] / 1e3:.0f} us ({args.calls} calls)"
    )
    open("record", "w").close()
    mxprof.set_config(filename="t.json")
    mxprof.set_state("run")
    task = mxprof.Domain("worker").new_task("work")
    for _ in range(args.events):
        task.start()
        task.stop()
    while not all(os.path.exists(f"recorded{r}") for r in range(args.servers)):
        time.sleep(0.01)
    mxprof.set_state("stop", profile_process="server")
    mxprof.set_state("stop")
    t0 = time.perf_counter()
    summary = distributed.collect("merged.json")
    took = time.perf_counter() - t0
    size = os.path.getsize("merged.json") / 1e6
    print(
        f"collect: {summary['events']} events from {len(summary['inputs'])} processes in"
        f" {took:.2f} s ({size:.0f} MB merged)"
    )
    for item in summary["inputs"][1:]:
        est = item["clock"]["estimates"]
        print(
            f"  {item['process']}: offset {est[0]['offset_ns'] / 1e3:+.1f} us"
            f" +- {est[0]['error_ns'] / 1e3:.1f} us at init, {est[-1]['offset_ns'] / 1e3:+.1f} us"
            f" +- {est[-1]['error_ns'] / 1e3:.1f} us at collect"
        )
    open("done", "w").close()
    for p in procs:
        p.join()
    distributed.shutdown()


if __name__ == "__main__":
    main()
