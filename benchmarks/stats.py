"""``mxprof stats`` of a big trace against ``mxprof.load(...).key_averages()``.

    python benchmarks/stats.py [--quick] [--ranges 3000000] [--trace PATH] [--keep]

Records a trace of ``--ranges`` ranges with the live core (steps as frames,
each with two nested ranges; or reads ``--trace``), then runs, each in a
process of its own, ``mxprof stats TRACE`` (its table to /dev/null) and
``mxprof.load(TRACE).key_averages()``, and prints the wall time, the CPU
time (steadier on a shared machine) and the peak RSS of each.  The target
(issue 22): ``stats`` takes no more time or memory than
``load().key_averages()``, which it needs and nothing more.  ``--quick`` is
a small run that checks the script works, never how fast anything is.

Run it from the repository root with ``PYTHONPATH`` naming the tree to
measure (a tree with a built core to record; ``--trace`` to measure a tree
without one, or another version on the same file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

# Each measured thing in a fresh interpreter: its wall time and its peak RSS.
MEASURE = textwrap.dedent(
    """
    import json, os, resource, sys, time
    what, path = sys.argv[1], sys.argv[2]
    start = time.perf_counter()
    if what == "stats":
        from mxprof.cli import main
        sys.stdout = open(os.devnull, "w")
        assert main(["stats", path]) == 0
        sys.stdout.close()
        sys.stdout = sys.__stdout__
    else:
        import mxprof
        rows = mxprof.load(path).key_averages()
        assert len(rows)
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime  # the interpreter's start included
    print(json.dumps({"s": seconds, "cpu_s": cpu, "peak_mb": usage.ru_maxrss / 1024}))
    """
)


def record(path: str, ranges: int) -> None:
    """About ``ranges`` ranges into path: per step a frame and two nested tasks."""
    import mxprof

    mxprof.set_config(
        filename=path,
        aggregate_stats=False,
        continuous_dump=False,
        profile_api=False,
        max_events=0,
    )
    train = mxprof.Domain("train")
    step, forward, backward = (
        train.new_frame("step"),
        train.new_task("forward"),
        train.new_task("backward"),
    )
    mxprof.set_state("run")
    for _ in range(ranges // 3):
        with step:
            with forward:
                pass
            with backward:
                pass
    mxprof.set_state("stop")
    mxprof.dump()


def measure(what: str, path: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, what, path],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),  # not here: -c imports from its working directory first
    )
    result: dict[str, float] = json.loads(proc.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranges", type=int, default=3_000_000)
    parser.add_argument("--trace", help="measure this file instead of recording one")
    parser.add_argument("--keep", action="store_true", help="keep the recorded trace")
    parser.add_argument("--quick", action="store_true", help="a small run: does it work")
    args = parser.parse_args()
    ranges = 3_000 if args.quick else args.ranges
    folder = tempfile.mkdtemp(prefix="mxprof-stats-bench-")
    path = args.trace or os.path.join(folder, "big.json")
    if args.trace is None:
        record(path, ranges)
    import mxprof

    size = os.path.getsize(path)
    print(f"mxprof {mxprof.__version__}, {os.cpu_count()} cores; trace {size / 1e6:.0f} MB")
    results = {what: measure(what, path) for what in ("load().key_averages()", "stats")}
    print(f"{'':24}{'wall s':>10}{'CPU s':>10}{'peak RSS MB':>14}")
    for what, got in results.items():
        print(f"{what:24}{got['s']:>10.2f}{got['cpu_s']:>10.2f}{got['peak_mb']:>14.0f}")
    if args.trace is None and not args.keep:
        os.unlink(path)
        os.rmdir(folder)
    elif args.trace is None:
        print(f"trace kept: {path}")


if __name__ == "__main__":
    main()
