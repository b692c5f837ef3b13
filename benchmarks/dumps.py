"""Many distinct names: what creating them and rendering dumps() over them costs.

    python benchmarks/dumps.py [--quick] [--names 100000] [--repeats 5] [--json out.json]

Creating: each repeat makes ``--names`` new tasks, half with
``Domain.new_task`` and half with ``Task(domain, name)``, none recorded.
Rendering: one more set of ``--names`` tasks records one range each (each
range name recorded costs the core a histogram, about 11 kB: 100,000 names
take about 1.1 GB), then ``dumps()`` is timed the first time after they were
made (once), and per repeat as a table sorted by total, by average, and as
JSON.  Printed: medians over repeats of the wall time and of the process's
CPU time (on a busy, shared machine the CPU time is the steadier of the
two), the cost per name, and the targets, on wall time (100,000 names:
made within 0.5 s, ``dumps()`` within 1 s; other ``--names`` scale the
limits in proportion).  ``--quick`` runs few, small
repeats; the test suite uses it to check that the script works, never how
fast anything is.

Run it as a script from the repository root with the installed mxprof (or
``PYTHONPATH`` pointing at a tree with a built core).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import mxprof
from mxprof import _testing

CREATE_LIMIT_S = 0.5  # per 100,000 names
DUMPS_LIMIT_S = 1.0  # per 100,000 names
T = TypeVar("T")


Seconds = tuple[float, float]  # wall, CPU


def timed(fn: Callable[[], T]) -> tuple[T, Seconds]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, (time.perf_counter() - wall, time.process_time() - cpu)


def create(domain: mxprof.Domain, names: int, prefix: str) -> list[mxprof.Task]:
    """names new tasks, half each way."""
    half = names // 2
    tasks = [domain.new_task(f"{prefix}layer{i}.forward") for i in range(half)]
    tasks += [mxprof.Task(domain, f"{prefix}layer{i}.backward") for i in range(half, names)]
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few, small repeats")
    parser.add_argument("--names", type=int, default=100_000, help="distinct names")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    if args.quick:
        args.names, args.repeats = 2_000, 2
    _testing.reset()
    mxprof.set_config(aggregate_stats=True, write_trace=False, profile_api=False)
    domain = mxprof.Domain("bench")

    times: dict[str, list[Seconds]] = {k: [] for k in ("create", "table", "table avg", "json")}
    for r in range(args.repeats):
        times["create"].append(timed(functools.partial(create, domain, args.names, f"c{r}_"))[1])

    tasks = create(domain, args.names, "rec_")
    mxprof.set_state("run")
    for task in tasks:
        task.start()
        task.stop()
    mxprof.set_state("stop")
    table, first = timed(mxprof.dumps)
    rows = sum(1 for line in table.splitlines() if line.startswith("rec_"))
    if rows != args.names:
        raise SystemExit(f"dumps() showed {rows} of {args.names} names")
    for _ in range(args.repeats):
        times["table"].append(timed(mxprof.dumps)[1])
        times["table avg"].append(timed(lambda: mxprof.dumps(sort_by="avg"))[1])
        text, seconds = timed(lambda: mxprof.dumps(format="json"))
        times["json"].append(seconds)
    if len(json.loads(text)["Time"][domain.name]) != args.names:
        raise SystemExit("dumps(format='json') lost names")
    _testing.reset()

    med = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    med["table, first"], cpu["table, first"] = first
    print(
        f"mxprof {mxprof.__version__}: {args.names:,} distinct names, "
        f"median of {args.repeats} repeats (the first table: once)"
    )
    print(f"{'case':<28}{'wall s':>10}{'per name':>14}{'CPU s':>10}")
    for case in ("create", "table, first", "table", "table avg", "json"):
        per = med[case] / args.names * 1e6
        print(f"{case:<28}{med[case]:>10.3f}{per:>11.2f} us{cpu[case]:>10.3f}")
    scale = args.names / 100_000
    print(f"\n{'target':<28}{'measured':>10}{'limit':>10}")
    for case in ("create", "table, first", "table", "table avg", "json"):
        limit = (CREATE_LIMIT_S if case == "create" else DUMPS_LIMIT_S) * scale
        verdict = "met" if med[case] <= limit else "NOT MET"
        print(f"{case:<28}{med[case]:>8.3f} s{limit:>8.3f} s {verdict}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            doc = {"names": args.names, "repeats": args.repeats, "seconds": med, "cpu_seconds": cpu}
            json.dump(doc, f)


if __name__ == "__main__":
    main()
