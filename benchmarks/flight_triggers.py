"""What the flight recorder's step triggers cost per step, and that tasks pay nothing.

A Frame tells the triggers of its begin and end only while
``trigger_slow_step`` or ``watchdog`` is on (``ranges.set_steps``).  This
times ``with frame: pass`` and ``with task: pass`` in a flight recorder's
profile with the step triggers off, with the watchdog alone and with the
slow step trigger, each case once per repeat, in turn, in one process; the
table shows the min and the median over repeats in ns per statement.

    python benchmarks/flight_triggers.py [--number 50000] [--repeats 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import timeit

import mxprof
from mxprof import _testing

CASES = {
    "step triggers off": {"trigger_slow_step": 0, "watchdog": 0},
    "watchdog on": {"trigger_slow_step": 0, "watchdog": 3600},
    "slow step on": {"trigger_slow_step": 1e6, "watchdog": 0},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    d = mxprof.Domain("bench")
    names = {"frame": mxprof.Frame(d, "step"), "task": d.new_task("task")}
    rows: dict[tuple[str, str], list[float]] = {}
    _testing.reset()
    mxprof.set_config(
        filename=os.path.join(tempfile.mkdtemp(prefix="mxprof-bench-"), "ring.json"),
        profile_api=False,
        flight_recorder=30,
    )
    mxprof.set_state("run")
    try:
        for _ in range(args.repeats):
            for case, config in CASES.items():
                mxprof.set_config(**config)
                for stmt in ("with frame: pass", "with task: pass"):
                    ns = timeit.timeit(stmt, globals=names, number=args.number) / args.number
                    rows.setdefault((stmt, case), []).append(ns * 1e9)
    finally:
        _testing.reset()
    print("| statement | step triggers | min ns | median ns |")
    print("|---|---|---:|---:|")
    for (stmt, case), ns in rows.items():
        print(f"| `{stmt}` | {case} | {min(ns):.0f} | {statistics.median(ns):.0f} |")


if __name__ == "__main__":
    main()
