"""Many big rank files merged, cut by a window, and one big file's key_averages.

    python benchmarks/merge.py [--quick] [--ranks 64] [--events 1000000] [--load-events 10000000]

One trace of ``--events`` events is recorded with the live core (the
training-like loop of benchmarks/report.py: steps as frames, 98 ranges, a
counter and memory samples per step), then copied ``--ranks`` times with each
copy's ``baseTimeNanoseconds`` 1 ms later (one pid for all: merge renumbers
them). Each measurement runs ``mxprof`` in a process of its own, so its peak
RSS is that process's own:

- ``mxprof merge`` of every copy to Perfetto protobuf (issue 13: 64 x 1 M
  events in at most 5 min, peak RSS at most 1 GB);
- the same with ``--window`` chosen to keep about 100 k events (at most 60 s);
- ``mxprof.load(...).key_averages()`` of a ``--load-events`` trace (at most
  30 s and 2 GB for 10 M events).

``--quick`` is a small run that checks the script works (the test suite runs
it), never how fast anything is. Files go to a temporary folder (about
90 MB per million events).

``--pftrace NxM`` measures only ``merge`` of N copies of an M-event trace to
``.pftrace`` (issue 26: within 1 GB whatever the input sizes), once with
each tree of ``--trees`` (default: this one; give the tree before a change
and the one after to compare them in one run), ``--repeats`` times each,
alternating, each in a process of its own that reports its own peak RSS:
the median wall time and peak RSS per tree, and the output's size::

    python benchmarks/merge.py --pftrace 2x10000000 --trees /work/main . --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import report  # noqa: E402  (benchmarks/report.py: the recording)

LIMITS = {"merge_s": 300.0, "merge_rss": 1e9, "window_s": 60.0, "load_s": 30.0, "load_rss": 2e9}


def copies(source: str, folder: str, ranks: int) -> list[str]:
    """ranks copies of source, each 1 ms later by its baseTimeNanoseconds."""
    with open(source, "rb") as f:
        head, rest = f.readline(), f.read()
    start = head.index(b'"baseTimeNanoseconds":') + len(b'"baseTimeNanoseconds":')
    end = head.index(b",", start)
    base = int(head[start:end])
    paths = []
    for k in range(ranks):
        path = os.path.join(folder, f"rank{k}.json")
        with open(path, "wb") as f:
            f.write(head[:start] + str(base + k * 1_000_000).encode() + head[end:] + rest)
        paths.append(path)
    return paths


def timed(code: str, *args: str) -> tuple[float, int, str]:
    """Run python -c code args in a child: (seconds, peak RSS bytes, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"failed: {done.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # ru_maxrss of children is the largest child so far: each child here grows past the last.
    return seconds, max(peak, before) * 1024, done.stdout


MERGE = """
import sys
from mxprof.trace.merge import merge, parse_window
window = parse_window(sys.argv[2]) if sys.argv[2] else None
out = merge(sys.argv[3:], sys.argv[1], window=window)
print(out["events"])
"""

LOAD = """
import sys, mxprof
rows = mxprof.load(sys.argv[1]).key_averages()
print(sum(r.count for r in rows))
"""


# The child's own peak: VmHWM of its address space. (ru_maxrss would not do:
# Linux carries the high-water mark of the image a process was exec'd from,
# here this script's, over into it.)
OWN_PEAK = """
import sys
from mxprof.trace.merge import merge
out = merge(sys.argv[2:], sys.argv[1])
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
print(out["events"], peak)
"""
RECORD = """
import sys
sys.path.insert(0, sys.argv[3])
import report
report.record(sys.argv[1], int(sys.argv[2]))
"""


def pftrace(inputs: int, events: int, trees: list[str], repeats: int) -> dict[str, object]:
    """merge of inputs copies of an events-event trace to .pftrace with each tree:
    by tree, the median seconds and peak RSS bytes, and the output's bytes."""
    folder = tempfile.mkdtemp(prefix="mxprof-bench-pfmerge-")
    runs: dict[str, list[tuple[float, int]]] = {tree: [] for tree in trees}
    sizes: dict[str, int] = {}
    merged = {}
    try:
        one = os.path.join(folder, "one.json")
        # Recorded in a child, so that this process stays small.
        # (In the temporary folder: the core writes its memory profile there.)
        record = [sys.executable, "-c", RECORD, one, str(events), HERE]
        subprocess.run(record, cwd=folder, check=True)
        paths = copies(one, folder, inputs)
        os.unlink(one)
        out = os.path.join(folder, "merged.pftrace")
        for _ in range(repeats):
            for tree in trees:  # alternating, so that a change of load hits both
                env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
                t0 = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-c", OWN_PEAK, out, *paths],
                    capture_output=True, text=True, check=False, env=env, cwd=folder,
                )  # fmt: skip
                seconds = time.perf_counter() - t0
                if done.returncode:
                    raise SystemExit(f"failed with {tree}: {done.stderr}")
                count, peak = done.stdout.split()
                runs[tree].append((seconds, int(peak)))
                merged[tree] = int(count)
                sizes[tree] = os.path.getsize(out)
                os.unlink(out)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result: dict[str, object] = {"inputs": inputs, "events_per_input": events}
    for tree in trees:
        result[tree] = {
            "merge_s": statistics.median(s for s, _ in runs[tree]),
            "peak_rss": statistics.median(r for _, r in runs[tree]),
            "runs": runs[tree],
            "events": merged[tree],
            "bytes": sizes[tree],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run: checks the script")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--load-events", type=int, default=10_000_000)
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument("--pftrace", metavar="NxM", help="only merge N x M events to .pftrace")
    parser.add_argument("--trees", nargs="+", default=[os.path.dirname(HERE)])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if args.pftrace:
        n, m = (int(x) for x in args.pftrace.lower().split("x"))
        found = pftrace(n, m, args.trees, args.repeats)
        print(f"python {platform.python_version()}, {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
        print(f"merge {n} x {m:,} events -> .pftrace (median of {args.repeats}):")
        for tree in args.trees:
            row: Any = found[tree]
            print(f"  {tree}: {row['merge_s']:.1f} s, peak RSS {row['peak_rss'] / 1e6:.0f} MB, "
                  f"{row['bytes'] / 1e6:.0f} MB written, {row['events']:,} events")  # fmt: skip
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(found, f, indent=2)
        return
    if args.quick:
        args.ranks, args.events, args.load_events = 2, 20_000, 20_000
    folder = tempfile.mkdtemp(prefix="mxprof-bench-merge-")
    result: dict[str, object] = {"ranks": args.ranks, "events_per_rank": args.events}
    try:
        one = os.path.join(folder, "one.json")
        report.record(one, args.events)
        paths = copies(one, folder, args.ranks)
        out = os.path.join(folder, "merged.pftrace")
        s, rss, events = timed(MERGE, out, "", *paths)
        result.update(merge_s=s, merge_rss=rss, merged_events=int(events))
        # About 100 k events: the share of the run's length that many events span.
        length_s = (args.events / report.RANGES_PER_STEP) * 12e-6  # ~12 µs per recorded step
        share = min(1.0, 100_000 / (args.ranks * args.events))
        window = f"{length_s * 0.5:.6f}:{length_s * (0.5 + share):.6f}"
        s, _, events = timed(MERGE, os.path.join(folder, "window.json"), window, *paths)
        result.update(window=window, window_s=s, window_events=int(events))
        os.unlink(out)
        big = os.path.join(folder, "big.json")
        report.record(big, args.load_events)
        s, rss, counted = timed(LOAD, big)
        result.update(load_events=args.load_events, load_s=s, load_rss=rss, ranges=int(counted))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"python {platform.python_version()}, {os.cpu_count()} cores")
    print(f"merge {args.ranks} x {args.events:,} events -> .pftrace: {result['merge_s']:.1f} s, "
          f"peak RSS {result['merge_rss'] / 1e6:.0f} MB")  # fmt: skip
    print(f"  --window {result['window']}: {result['window_events']:,} events in "
          f"{result['window_s']:.1f} s")  # fmt: skip
    print(f"load {args.load_events:,} events -> key_averages: {result['load_s']:.1f} s, "
          f"peak RSS {result['load_rss'] / 1e6:.0f} MB")  # fmt: skip
    # The targets are for 64 x 1 M merged and 10 M loaded; a smaller run is
    # projected linearly in events (memory is not: it should not grow).
    merge_scale = (args.ranks * args.events) / 64e6
    load_scale = args.load_events / 10e6
    rows = [
        ("merge, s", float(result["merge_s"]) / merge_scale, LIMITS["merge_s"]),  # type: ignore[arg-type]
        ("merge, peak RSS GB", float(result["merge_rss"]) / 1e9, LIMITS["merge_rss"] / 1e9),  # type: ignore[arg-type]
        ("--window, s", float(result["window_s"]) / merge_scale, LIMITS["window_s"]),  # type: ignore[arg-type]
        ("load + key_averages, s", float(result["load_s"]) / load_scale, LIMITS["load_s"]),  # type: ignore[arg-type]
        ("load, peak RSS GB", float(result["load_rss"]) / 1e9, LIMITS["load_rss"] / 1e9),  # type: ignore[arg-type]
    ]
    projected = "" if merge_scale >= 1 and load_scale >= 1 else " (times projected)"
    print(f"\n{'target' + projected:40}{'measured':>10}{'limit':>10}")
    for what, value, limit in rows:
        print(f"{what:40}{value:10.2f}{limit:10.2f} {'met' if value <= limit else 'NOT MET'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
