"""A window of a big job read through the index in each file's trailer, against a scan.

    python benchmarks/window.py [--quick] [--ranks 64] [--events 1000000] [--blocks 100]

One trace of ``--events`` events is recorded with the live core (the loop of
benchmarks/report.py), written in ``--blocks`` flushes as a long run's
background writes would be (each flush a block of the index), then copied
``--ranks`` times, each copy 1 ms later; a second set of copies has the index
taken out of its trailer.  ``mxprof merge --window`` keeps about 100 k
events of the job, in a process of its own, on each set (the same window):
the time of each and the events kept, which must be the same.  Target
(issue 26): 100 k events out of 64 M within 3 s with the index.  ``--quick``
checks that the script works, never how fast anything is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import merge as merge_bench  # noqa: E402  (benchmarks/merge.py: copies, timed, MERGE)
import report  # noqa: E402  (benchmarks/report.py: the recording)

from mxprof.trace import _scan  # noqa: E402

LIMIT_S = 3.0  # 100 k events out of 64 M
_INDEX = re.compile(rb'"mxprofIndex":\[(?:\s*\[[-0-9,]*\],?)*\],')


def without_index(paths: list[str], folder: str) -> list[str]:
    """Copies of paths with the index taken out of their trailers."""
    out = []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        tail = data.rfind(b'"mxprofIndex":[')
        stripped = data[:tail] + _INDEX.sub(b"", data[tail:], count=1)
        if stripped == data:
            raise SystemExit(f"{path}: no index in its trailer")
        copy = os.path.join(folder, "scan-" + os.path.basename(path))
        with open(copy, "wb") as f:
            f.write(stripped)
        out.append(copy)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run: checks the script")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=100)
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.events, args.blocks = 2, 20_000, 10
    folder = tempfile.mkdtemp(prefix="mxprof-bench-window-")
    try:
        one = os.path.join(folder, "one.json")
        steps = max(args.events // (report.RANGES_PER_STEP + 6), 1)
        report.record(one, args.events, flush_every=max(steps // args.blocks, 1))
        indexed = merge_bench.copies(one, folder, args.ranks)
        scanned = without_index(indexed, folder)
        # About 100 k events of the job from its middle: the run's length from one file's index.
        with open(one, "rb") as f:
            blocks = _scan.index(_scan.metadata(f), os.path.getsize(one))
        assert blocks is not None, "the recording has no index"
        length_s = (blocks[-1].last_ns - blocks[0].first_ns) / 1e9
        share = min(1.0, 100_000 / (args.ranks * args.events))
        window = f"{length_s * 0.5:.6f}:{length_s * (0.5 + share):.6f}"
        rows = []
        for k, (name, paths) in enumerate(
            (("index", indexed), ("scan", scanned), ("index", indexed))
        ):
            out = os.path.join(folder, f"window{k}.json")
            s, rss, _ = merge_bench.timed(merge_bench.MERGE, out, window, *paths)
            with open(out, "rb") as f:  # the events kept, not the names (a scan meets more copies)
                kept = sum(1 for e in json.load(f)["traceEvents"] if e.get("ph") != "M")
            rows.append((name, s, rss, kept))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"python {platform.python_version()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{args.ranks} files x {args.events:,} events, {args.blocks} blocks each; --window {window}"
    )
    for name, s, rss, events in rows:
        print(
            f"  {name:6} {s:7.2f} s  peak {rss / 1e6:5.0f} MB  {events:,} events kept, names aside"
        )
    if len({events for *_, events in rows}) != 1:
        raise SystemExit("the index and the scan kept different events")
    best = min(s for name, s, _, _ in rows if name == "index")
    scale = args.ranks * args.events / 64e6
    verdict = "met" if best <= LIMIT_S * max(scale, 1e-9) else "NOT met"
    if not args.quick:
        print(f"target: {best:.2f} s with the index, limit {LIMIT_S * scale:.2f} s: {verdict}")


if __name__ == "__main__":
    main()
