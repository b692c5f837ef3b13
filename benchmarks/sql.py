"""``mxprof sql`` over a big trace: the first query (the Parquet form made), the
next ones (read from it), the size of that form, against ``load().key_averages()``.

    python benchmarks/sql.py [--quick] [--ranges 10000000] [--trace PATH] [--repeat 3] [--keep]
                             [--against TREE]

Records a trace of ``--ranges`` ranges with the live core (``stats.record``:
steps as frames, each with two nested ranges; or reads ``--trace``), then
runs, each in a process of its own, ``mxprof sql "select name, count(*),
sum(dur) from slice group by name" TRACE`` with no cache (the first time:
conversion included), the same query again ``--repeat`` times (the cached
Parquet form), and ``mxprof.load(TRACE).key_averages()`` (the same numbers by
mxprof's reader, for scale), printing the wall time, CPU time and peak RSS
of each (medians over the repeats; ``mxprof.sql()``: the call alone, after
the imports, in an interpreter that made them) and the sizes of the JSON and of its
Parquet form.  Targets (issue 26): first ≤ 10 s, next ≤ 1 s, peak ≤ 1 GB,
Parquet ≤ 1/3 of the JSON.  ``--quick`` checks the script works, never how
fast anything is.  ``--against TREE`` also times the first query with that
tree's mxprof (``PYTHONPATH=TREE``, e.g. /work/main) in the same run, just
before this tree's: a before and after under one load.  A training-like
trace (counters, memory scopes: ``benchmarks/report.py``'s) is measured with
``--trace`` once recorded::

    python -c "import sys; sys.path.insert(0, 'benchmarks'); import report; \\
        report.record('/tmp/t10m.json', 10_000_000)"

Run it from the repository root with ``PYTHONPATH`` naming the tree to
measure (a tree with a built core to record; ``--trace`` otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap

QUERY = "select name, count(*), sum(dur) from slice group by name"

MEASURE = textwrap.dedent(
    """
    import json, os, resource, sys, time
    what, path, query = sys.argv[1], sys.argv[2], sys.argv[3]
    start = time.perf_counter()
    if what == "call":  # the query alone, in a process that has imported everything
        import mxprof, mxprof.report.sql, duckdb, pyarrow
        start = time.perf_counter()
        assert mxprof.sql(query, path)
    elif what == "sql":
        from mxprof.cli import main
        sys.stdout = open(os.devnull, "w")
        assert main(["sql", query, path]) == 0
        sys.stdout.close()
        sys.stdout = sys.__stdout__
    else:
        import mxprof
        assert len(mxprof.load(path).key_averages())
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime  # the interpreter's start included
    print(json.dumps({"s": seconds, "cpu_s": cpu, "peak_mb": usage.ru_maxrss / 1024}))
    """
)


def measure(what: str, path: str, tree: str | None = None) -> dict[str, float]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.path.abspath(tree)
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, what, path, QUERY],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),  # not here: -c imports from its working directory first
        env=env,
    )
    result: dict[str, float] = json.loads(proc.stdout.splitlines()[-1])
    return result


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def folder_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranges", type=int, default=10_000_000)
    parser.add_argument("--trace", help="measure this file instead of recording one")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each cached measure")
    parser.add_argument("--keep", action="store_true", help="keep the recorded trace")
    parser.add_argument("--quick", action="store_true", help="a small run: does it work")
    parser.add_argument("--against", help="also time the first query with this tree's mxprof")
    args = parser.parse_args()
    ranges = 3_000 if args.quick else args.ranges
    folder = tempfile.mkdtemp(prefix="mxprof-sql-bench-")
    path = args.trace or os.path.join(folder, "big.json")
    if args.trace is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from stats import record

        record(path, ranges)
    import mxprof
    from mxprof.report.sql import cache_folder

    cache = cache_folder([path])
    shutil.rmtree(cache, ignore_errors=True)
    size = os.path.getsize(path)
    print(f"mxprof {mxprof.__version__}, {os.cpu_count()} cores, load {os.getloadavg()}")
    results = {}
    if args.against:
        results[f"first, {args.against}"] = measure("sql", path, args.against)
        shutil.rmtree(cache, ignore_errors=True)
    results["sql, first (converts)"] = measure("sql", path)
    parquet_size = folder_size(cache)
    results["sql, cached"] = median([measure("sql", path) for _ in range(args.repeat)])
    results["mxprof.sql(), cached"] = median([measure("call", path) for _ in range(args.repeat)])
    results["load().key_averages()"] = median(
        [measure("load", path) for _ in range(max(1, args.repeat // 2))]
    )
    print(f"trace {size / 1e6:.0f} MB JSON; Parquet form {parquet_size / 1e6:.1f} MB "
          f"({parquet_size / size:.3f} of the JSON)")  # fmt: skip
    width = max(24, *(len(w) + 2 for w in results))
    print(f"{'':{width}}{'wall s':>10}{'CPU s':>10}{'peak RSS MB':>14}")
    for what, got in results.items():
        print(f"{what:{width}}{got['s']:>10.2f}{got['cpu_s']:>10.2f}{got['peak_mb']:>14.0f}")
    print(f"load after: {os.getloadavg()}")
    shutil.rmtree(cache, ignore_errors=True)
    if args.trace is None and not args.keep:
        os.unlink(path)
        os.rmdir(folder)
    elif args.trace is None:
        print(f"trace kept: {path}")
    else:
        os.rmdir(folder)  # (made for a recording, not used)


if __name__ == "__main__":
    main()
