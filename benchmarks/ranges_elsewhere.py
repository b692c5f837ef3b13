"""What ranges cost where they do not simply nest on one thread's stack.

    python benchmarks/ranges_elsewhere.py [--number 100000] [--repeats 7]

prints medians over repeats (ns per operation), each case measured in turn
in every repeat:

- ``with task`` on a thread that runs no event loop (the floor of the checked
  calls that look out for asyncio), and the same inside an asyncio task,
  whose ranges go to the task's own track;
- a stop on another thread than the start (the range is closed where it
  began: a process-wide memory barrier), with one range open at a time, as
  a producer/consumer hand-off has;
- ``set_state('stop')`` with ranges open on several threads (each closed
  there, cut short).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time

import mxprof


def per_op(fn, n: int) -> float:
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n, handoffs = args.number, max(10, args.number // 50)
    out = tempfile.mkdtemp()
    mxprof.set_config(filename=f"{out}/bench.json", aggregate_stats=True, profile_api=False)
    mxprof.set_state("run")
    task = mxprof.Domain("bench").new_task("r")

    def plain(k: int) -> None:
        for _ in range(k):
            with task:
                pass

    def in_task(k: int) -> None:
        async def body() -> None:
            for _ in range(k):
                with task:
                    pass

        asyncio.run(body())

    def handoff(k: int, there: bool) -> None:
        """Start here, hand over to a thread; stop there (or back here)."""
        ready, done = threading.Semaphore(0), threading.Semaphore(0)

        def consumer() -> None:
            for _ in range(k):
                ready.acquire()
                if there:
                    task.stop()
                done.release()

        c = threading.Thread(target=consumer)
        c.start()
        for _ in range(k):
            task.start()
            ready.release()
            done.acquire()
            if not there:
                task.stop()
        c.join()

    def cut(k: int) -> None:
        for _ in range(k):
            started, release = threading.Barrier(5), threading.Event()

            def worker(started: threading.Barrier, release: threading.Event) -> None:
                with task:
                    started.wait()
                    release.wait()

            ws = [threading.Thread(target=worker, args=(started, release)) for _ in range(4)]
            for w in ws:
                w.start()
            started.wait()
            t0 = time.perf_counter_ns()
            mxprof.set_state("stop")
            elapsed = time.perf_counter_ns() - t0
            release.set()
            for w in ws:
                w.join()
            mxprof.set_state("run")
            results["set_state('stop'), 4 threads in a range"].append(elapsed)

    results: dict[str, list[float]] = {}
    cases = {
        "with task, no event loop": (plain, n),
        "with task, inside an asyncio task": (in_task, n),
        "hand-off, stopped on the starting thread": (lambda k: handoff(k, False), handoffs),
        "hand-off, stopped on the other thread": (lambda k: handoff(k, True), handoffs),
    }
    for _ in range(args.repeats):
        for name, (fn, k) in cases.items():
            results.setdefault(name, []).append(per_op(fn, k))
            mxprof.dump(finished=False)
        results.setdefault("set_state('stop'), 4 threads in a range", [])
        cut(3)
    print(f"median of {args.repeats} repeats, ns per operation")
    for name, values in results.items():
        print(f"  {name:<48} {statistics.median(values):>12,.0f}")


if __name__ == "__main__":
    main()
