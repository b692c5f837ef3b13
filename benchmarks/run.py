"""Measure mxprof's per-call overhead against in-run baselines.

Every case runs in this one process, interleaved (each repeat runs every case
once, in turn), after a warm-up; the table shows the median over repeats of
the ns per operation, and its ratio to the bare cffi call (the floor).

    python benchmarks/run.py [--quick] [--repeats N] [--number N]

(Run it as a script, not with -m from the repository root: there the source
tree's mxprof/, which has no compiled core, would shadow the installed one.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit

import mxprof
from mxprof import _testing
from mxprof._native import lib


class _Empty:
    def __enter__(self) -> _Empty:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


# Each case: the statement timed; names come from SETUP as locals of timeit's loop.
SETUP = "task, counter, marker, noop, empty = objs"
CASES = {
    "empty loop": "pass",
    "bare cffi call (floor)": "noop(1)",
    "empty with": "with empty: pass",
    "task.start(); task.stop()": "task.start(); task.stop()",
    "with task": "with task: pass",
    "counter += 1": "counter += 1",
    "counter.set_value(7)": "counter.set_value(7)",
    "marker.mark()": "marker.mark()",
}


def measure(number: int, repeats: int) -> dict[str, float]:
    d = mxprof.Domain("bench")
    objs = (d.new_task("t"), d.new_counter("c", 0), d.new_marker("m"), lib.mxp_noop, _Empty())
    g = {"objs": objs}
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for stmt in CASES.values():  # warm-up
        timeit.timeit(stmt, SETUP, globals=g, number=max(1, number // 10))
    for _ in range(repeats):
        for name, stmt in CASES.items():
            t = timeit.timeit(stmt, SETUP, globals=g, number=number)
            samples[name].append(t / number * 1e9)
            mxprof.dump(finished=False)  # keep the buffers small, outside the timing
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few iterations (a smoke test)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args(argv)
    number, repeats = (2_000, 3) if args.quick else (args.number, args.repeats)

    _testing.reset()
    mxprof.set_config(
        aggregate_stats=True, continuous_dump=False, filename=os.devnull, profile_api=False
    )
    mxprof.set_state("run")
    results = measure(number, repeats)
    mxprof.set_state("stop")
    _testing.reset()

    floor = results["bare cffi call (floor)"]
    print(f"recording on; median of {repeats} repeats x {number} calls")
    print(f"{'operation':<30}{'ns/op':>10}{'x floor':>10}")
    for name, ns in results.items():
        print(f"{name:<30}{ns:>10.1f}{ns / floor:>10.2f}")


if __name__ == "__main__":
    main()
