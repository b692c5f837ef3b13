"""``mxprof.load(path, window=...)`` of one file: with its index, without, and the whole load.

    python benchmarks/load_window.py [--quick] [--events 1000000] [--blocks 100] [--share 0.01]
                                     [--repeats 3]

One trace of ``--events`` events is recorded with the live core (the loop of
benchmarks/report.py) in ``--blocks`` flushes (each a block of the index), and
copied with the index taken out of its trailer (benchmarks/window.py's
``without_index``).  In this process, in turn and ``--repeats`` times: the
whole ``load``; ``load(window=...)`` of ``--share`` of the run's length from
the middle block's start, on the indexed file and on the copy; the events kept must be
those ``load().filter(start, end)`` keeps.  Printed: the median wall and CPU
seconds of each, and the load average.  ``--quick`` checks the script works,
never how fast anything is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report  # noqa: E402  (benchmarks/report.py: the recording)
import window as window_bench  # noqa: E402  (benchmarks/window.py: without_index)

import mxprof  # noqa: E402
from mxprof.trace import _scan  # noqa: E402


def timed(fn: object) -> tuple[float, float, object]:
    t, c = time.perf_counter(), time.process_time()
    out = fn()  # type: ignore[operator]
    return time.perf_counter() - t, time.process_time() - c, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run: checks the script")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=100)
    parser.add_argument("--share", type=float, default=0.01, help="the window's share of the run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    if args.quick:
        args.events, args.blocks, args.repeats = 20_000, 10, 1
    folder = tempfile.mkdtemp(prefix="mxprof-bench-load-window-")
    try:
        one = os.path.join(folder, "one.json")
        steps = max(args.events // (report.RANGES_PER_STEP + 6), 1)
        report.record(one, args.events, flush_every=max(steps // args.blocks, 1))
        (scanned,) = window_bench.without_index([one], folder)
        with open(one, "rb") as f:
            blocks = _scan.index(_scan.metadata(f), os.path.getsize(one))
        assert blocks is not None, "the recording has no index"
        # From the start of the middle block (not into a pause between flushes).
        first, last = blocks[0].first_ns, blocks[-1].last_ns
        start = blocks[len(blocks) // 2].first_ns
        end = start + (last - first) * args.share
        runs: dict[str, list[tuple[float, float]]] = {}
        kept: dict[str, int] = {}
        expected = None
        for _ in range(args.repeats):
            for name, fn in (
                ("whole load", lambda: mxprof.load(one)),
                ("window, indexed", lambda: mxprof.load(one, window=(start, end))),
                ("window, no index", lambda: mxprof.load(scanned, window=(start, end))),
            ):
                seconds, cpu, trace = timed(fn)
                runs.setdefault(name, []).append((seconds, cpu))
                kept[name] = len(trace)  # type: ignore[arg-type]
                if name == "whole load":
                    cut = trace.filter(start=start, end=end)  # type: ignore[attr-defined]
                    expected = [(e.name, e.ts, e.dur, e.tid) for e in cut]
                else:
                    got = [(e.name, e.ts, e.dur, e.tid) for e in trace]  # type: ignore[attr-defined]
                    if got != expected:
                        raise SystemExit(f"{name}: not the events filter() keeps")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"{kept['whole load']:,} events in {len(blocks)} blocks, window {args.share:.1%} of the "
        f"run ({kept['window, indexed']:,} events); median of {args.repeats}; load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    whole = statistics.median(s for s, _ in runs["whole load"])
    result: dict[str, object] = {"blocks": len(blocks), "kept": kept, "median_s": {}, "cpu_s": {}}
    for name, values in runs.items():
        seconds = statistics.median(s for s, _ in values)
        cpu = statistics.median(c for _, c in values)
        result["median_s"][name] = seconds  # type: ignore[index]
        result["cpu_s"][name] = cpu  # type: ignore[index]
        print(f"  {name:18} {seconds:7.3f} s   CPU {cpu:7.3f} s   {whole / seconds:6.1f}x faster")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
