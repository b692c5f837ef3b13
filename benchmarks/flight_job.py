"""A job-wide flight recorder snapshot: from a trigger on one rank to the merged file at rank 0.

    python benchmarks/flight_job.py [--quick] [--ranks 8] [--runs 5] [--window 10]
                                    [--rate 2000] [--json out.json]

This process is worker 0 of ``--ranks`` workers on loopback (the others are
spawned); every rank records with a flight recorder of ``--window`` seconds,
a range ``tick`` about ``--rate`` times a second on its main thread (and one
range held open, as a rank waiting in a collective).  Once the windows are
full, worker 3 (or the last) triggers ``--runs`` times, a few seconds apart;
each time this process waits for the merged snapshot to appear and measures
the time from the trigger (its ``otherData.flight_recorder.trigger_wall_ns``,
on this process's clock) to the moment the file is there (polled every
5 ms).  Printed: each run's time, the median, the merged file's size and
events, and how many ranks it holds (issue 23: 8 ranks merged within 5 s of
the trigger).

``--quick`` is a small run that checks the script works (the test suite runs
it), never how fast anything is.
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import tempfile
import time

import mxprof
from mxprof import _native, distributed


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def rank(workdir: str, r: int, n: int, address: str, window: float, rate: float) -> None:
    """A worker: records ticks, triggers when told (``trigger<k>`` files, on the trigger rank)."""
    os.chdir(workdir)
    distributed.init("worker", r, n, 0, address=address, timeout=60)
    mxprof.set_config(filename="t.json", flight_recorder=window, flight_recorder_interval=0)
    mxprof.set_state("run")
    domain = mxprof.Domain("train")
    tick = domain.new_task("tick")
    domain.new_task("allreduce").start()
    pause = 1.0 / rate
    open(f"ready{r}", "w").close()
    k = 0
    while not os.path.exists("done"):
        with tick:
            time.sleep(pause)
        if os.path.exists(f"trigger{k}.{r}"):
            mxprof.trigger(f"bench{k}")
            k += 1
    distributed.shutdown()


def wait(pred: object, limit: float) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run (the tests' check)")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--window", type=float, default=10.0, help="flight_recorder seconds")
    parser.add_argument("--rate", type=float, default=2000.0, help="ticks a second per rank")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.runs, args.window, args.rate = 3, 2, 1.0, 500.0
    n = args.ranks
    trigger_rank = min(3, n - 1)
    workdir = tempfile.mkdtemp(prefix="mxprof-bench-flight-job-")
    os.chdir(workdir)
    address = free_address()
    distributed.init("worker", 0, n, 0, address=address, timeout=60)
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=rank, args=(workdir, r, n, address, args.window, args.rate))
        for r in range(1, n)
    ]
    for p in procs:
        p.start()
    results: list[dict[str, float]] = []
    try:
        mxprof.set_config(filename="hub.json", flight_recorder=args.window)
        mxprof.set_config(flight_recorder_interval=0)
        mxprof.set_state("run")
        mxprof.Domain("train").new_task("allreduce").start()
        if not wait(lambda: all(os.path.exists(f"ready{r}") for r in range(1, n)), 300):
            sys.exit("the ranks did not start within 300 s")
        if not wait(lambda: len(distributed.members()) == n - 1, 60):
            sys.exit("the ranks did not join within 60 s")
        time.sleep(args.window)  # full windows
        for k in range(args.runs):
            pattern = f"hub.flight*-job_bench{k}.json"
            open(f"trigger{k}.{trigger_rank}", "w").close()
            if not wait(lambda p=pattern: glob.glob(p), 120):
                sys.exit(f"no merged snapshot {pattern} within 120 s")
            seen = _native.clock_wall_ns()
            (path,) = glob.glob(pattern)
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            info = doc["otherData"]["flight_recorder"]
            took = (seen - info["trigger_wall_ns"]) / 1e9
            events = sum(1 for e in doc["traceEvents"] if e.get("ph") != "M")
            results.append(
                {
                    "seconds": took,
                    "ranks": len(info["ranks"]),
                    "missing": len(info["missing"]),
                    "events": events,
                    "mb": os.path.getsize(path) / 1e6,
                }
            )
            print(
                f"run {k}: merged {len(info['ranks'])} of {n} ranks ({events} events, "
                f"{os.path.getsize(path) / 1e6:.1f} MB) {took:.2f} s after the trigger"
            )
            time.sleep(1.0)
    finally:
        open("done", "w").close()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        distributed.shutdown()
    median = statistics.median(r["seconds"] for r in results)
    print(
        f"job-wide snapshot of {n} ranks, {args.window:g} s windows at {args.rate:g} ticks/s a "
        f"rank: median {median:.2f} s from trigger to merged file "
        f"(min {min(r['seconds'] for r in results):.2f}, "
        f"max {max(r['seconds'] for r in results):.2f}; {platform.node()}, "
        f"{os.cpu_count()} CPUs)"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"ranks": n, "window": args.window, "rate": args.rate,
                       "median_seconds": median, "runs": results}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
