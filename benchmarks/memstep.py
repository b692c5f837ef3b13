"""What memory_steps costs per step, what its period's read costs, and tracemalloc's cost.

Three measurements, in one process, each case once per repeat in turn
(medians over repeats; the machine's load changes the absolute numbers, the
ratios within a repeat are what to compare):

- per step: ``with frame: pass`` in a profile with ``memory_steps`` off and
  on (``memory_period=0``: the step end's statm read, counter and leak rule
  only), ns per step;
- the period's read: one read and parse of ``/proc/self/smaps_rollup`` (on
  the ``mxprof-triggers`` thread, not the program's), in us; ``--torch``
  imports torch first, whose mappings make the kernel's walk longer;
- tracemalloc, which runs only for ``leak_sites_steps`` steps after a leak:
  a step of Python allocation work (a list of 2,000 small dicts) without and
  with ``tracemalloc.start(1)``, and one pair of snapshots compared by line
  (what the sampler takes at the start and end of its steps).

    python benchmarks/memstep.py [--number 20000] [--repeats 7] [--torch]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import timeit
import tracemalloc

import mxprof
from mxprof import _memstep, _testing


def work() -> int:
    """A step's worth of Python allocations."""
    return len([{"k": i, "v": str(i)} for i in range(2000)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--torch", action="store_true", help="import torch first")
    args = parser.parse_args()
    if args.torch:
        import torch  # noqa: F401  (its mappings are what is measured)
    frame = mxprof.Frame(mxprof.Domain("bench"), "step")
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for case, on in (("step, memory_steps off", False), ("step, memory_steps on", True)):
                _testing.reset()
                mxprof.set_config(
                    filename=os.path.join(tmp, "bench.json"),
                    memory_steps=on,
                    memory_period=0,
                    profile_api=False,
                    continuous_dump=True,
                )
                mxprof.set_state("run")

                def step() -> None:
                    with frame:
                        pass

                t = timeit.timeit(step, number=args.number)
                rows.setdefault(case, []).append(t / args.number * 1e9)
                mxprof.set_state("stop")
            sampler = _memstep.SAMPLER
            fd = os.open("/proc/self/smaps_rollup", os.O_RDONLY)
            t0 = time.perf_counter()
            for _ in range(20):
                _memstep._rollup(os.pread(fd, 4096, 0))
            rows.setdefault("smaps_rollup read (us)", []).append(
                (time.perf_counter() - t0) / 20 * 1e6
            )
            os.close(fd)
            del sampler
            n = max(args.number // 200, 20)
            rows.setdefault("work step, tracemalloc off (us)", []).append(
                timeit.timeit(work, number=n) / n * 1e6
            )
            tracemalloc.start(1)
            rows.setdefault("work step, tracemalloc on (us)", []).append(
                timeit.timeit(work, number=n) / n * 1e6
            )
            t0 = time.perf_counter()
            first = tracemalloc.take_snapshot()
            keep = [work() for _ in range(5)]
            last = tracemalloc.take_snapshot()
            last.compare_to(first, "lineno")
            rows.setdefault("two snapshots + compare (ms)", []).append(
                (time.perf_counter() - t0) * 1e3
            )
            del keep
            tracemalloc.stop()
    _testing.reset()
    print(f"repeats {args.repeats}, torch {'imported' if args.torch else 'not imported'}")
    print(f"{'case':<36} {'min':>10} {'median':>10}")
    for case, values in rows.items():
        unit = "" if "(" in case else " (ns)"
        print(f"{case + unit:<36} {min(values):>10.1f} {statistics.median(values):>10.1f}")
    off = statistics.median(rows["step, memory_steps off"])
    on = statistics.median(rows["step, memory_steps on"])
    print(f"memory_steps adds {on - off:.0f} ns per step (median)")
    w_off = statistics.median(rows["work step, tracemalloc off (us)"])
    w_on = statistics.median(rows["work step, tracemalloc on (us)"])
    print(f"tracemalloc: the work step takes {w_on / w_off:.2f} x as long (median)")


if __name__ == "__main__":
    main()
