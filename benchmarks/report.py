"""The HTML report of a big trace: how long ``mxprof report`` takes and how large the page is.

    python benchmarks/report.py [--quick] [--events 10000000] [--repeats 3] [--json out.json]
                                [--against TREE]

A trace of ``--events`` events is recorded with the live core (training-like:
steps as frames, each with data loading, forward and backward ranges, a few
nested ranges, a loss counter and memory allocations by scope), written as
Chrome JSON, then ``mxprof report`` builds the page from it ``--repeats``
times, each in a process of its own as a user runs it.  Printed: the median
wall time of a whole report (start, load, sections and hints, page), the time
of reading the events alone (once), the page's size
and how much of it is plotly.js, the peak resident memory of the building
process and of the child it forks for the hints, and the targets (issue 12:
a 10 M-event trace gives a page of at most 10 MB, built within 30 s; issue
22: with at most 1 GB resident in either process).  ``--quick`` is a
small run that checks the script works (the test suite runs it), never how
fast anything is.

Run it as a script from the repository root with the installed mxprof (or
``PYTHONPATH`` pointing at a tree with a built core).  A 10 M-event trace
takes about 0.9 GB on disk; the report holds its events in memory.
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

import plotly.offline

import mxprof
from mxprof import _testing, memory
from mxprof._native import lib
from mxprof.trace.model import read_events

SIZE_LIMIT = 10_000_000  # bytes, for 10 M events
TIME_LIMIT_S = 30.0  # for 10 M events
MEMORY_LIMIT = 1_000_000_000  # bytes of peak resident memory, for 10 M events (issue 22)
RANGES_PER_STEP = 98  # plus the step itself and its counter and memory samples


def record(path: str, events: int, flush_every: int = 0) -> int:
    """Record about ``events`` events into path; return how many the file holds.

    flush_every: write the buffered events every that many steps (0: once,
    at the end), as a long run's background writes do: each write is a
    block of the file's index.
    """
    _testing.reset()
    mxprof.set_config(
        filename=path,
        aggregate_stats=False,
        continuous_dump=False,
        profile_api=False,
        profile_memory=True,
        max_events=0,
    )
    train = mxprof.Domain("train")
    step = train.new_frame("step")
    loss = train.new_counter("loss", 0)
    data, forward, backward, optimizer = (
        train.new_task(n) for n in ("data", "forward", "backward", "optimizer")
    )
    layers = [train.new_task(f"layer{k}") for k in range(16)]
    ids = [t._id for t in layers]  # the hot call, as benchmarks/bulk.py does
    begin, end = lib.mxp_range_begin, lib.mxp_range_end
    per_step = RANGES_PER_STEP + 1 + 1 + 4  # ranges, the step, loss, two memory samples x 2
    mxprof.set_state("run")
    for i in range(max(events // per_step, 1)):
        with step:
            with data:
                pass
            with mxprof.scope("forward:"), forward:
                buf = memory.record_alloc((1 + i % 7) << 20, "gpu:0", tag="act")
                for k in range(45):
                    begin(ids[k & 15])
                    end(ids[k & 15])
            with backward:
                for k in range(48):
                    begin(ids[k & 15])
                    end(ids[k & 15])
                memory.record_free(buf)
            with optimizer:
                pass
            loss.set_value(1000 - i % 1000)
        if flush_every and (i + 1) % flush_every == 0:
            mxprof.dump(finished=False)
    mxprof.set_state("stop")
    mxprof.dump()
    counted = sum(1 for _ in mxprof.load(path)) if events <= 200_000 else 0
    _testing.reset()
    return counted or (events // per_step) * per_step


# `mxprof report TRACE -o PAGE`, then the peak resident memory of this process
# (load, sections, page) and of the child it forked for the hints (its
# children's largest: beside() waits for it), in bytes, and the CPU time of
# each (less sensitive than wall time to other work on a shared machine).
_REPORT = """
import json, resource, sys
from mxprof.cli import main
code = main(["report", sys.argv[1], "-o", sys.argv[2]])
me = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "code": code, "self": me.ru_maxrss * 1024, "child": kids.ru_maxrss * 1024,
    "cpu_s": me.ru_utime + me.ru_stime, "child_cpu_s": kids.ru_utime + kids.ru_stime,
}))
sys.exit(code)
"""


def build(trace: str, page: str, tree: str | None) -> tuple[float, dict[str, float]]:
    """One report in a process of its own, with this mxprof or tree's: (wall s, _REPORT's)."""
    env = dict(os.environ)
    # The tree's mxprof, or the one this script imported; run from the trace's
    # folder, since `python -c` puts the working directory first on the path
    # (from a checkout's root, that checkout's mxprof would shadow the tree's).
    here = os.path.dirname(os.path.dirname(os.path.abspath(mxprof.__file__)))
    env["PYTHONPATH"] = os.path.abspath(tree) if tree is not None else here
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _REPORT, trace, page],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.abspath(trace)),
    )
    return time.perf_counter() - t0, json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run: checks the script")
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument(
        "--against",
        metavar="TREE",
        help="also build each report with the mxprof of this source tree (a checkout with a "
        "built core), alternated with this one's, so that other work on the machine falls "
        "on both alike",
    )
    args = parser.parse_args()
    if args.quick:
        args.events, args.repeats = 20_000, 1
    folder = tempfile.mkdtemp(prefix="mxprof-bench-report-")
    try:
        trace = os.path.join(folder, "trace.json")
        page = os.path.join(folder, "report.html")
        t0 = time.perf_counter()
        events = record(trace, args.events)
        record_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded = len(read_events(trace))
        load_s = time.perf_counter() - t0
        times, peaks = [], []
        other: list[tuple[float, dict[str, float]]] = []
        for _ in range(args.repeats):
            # As a user runs it: `mxprof report` in a process of its own (this one
            # has the live profiler loaded, in which the report does not fork).
            took, peak = build(trace, page, None)
            times.append(took)
            peaks.append(peak)
            if args.against:
                other.append(build(trace, page, args.against))
        size = os.path.getsize(page)
        trace_bytes = os.path.getsize(trace)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    plotly_js = len(plotly.offline.get_plotlyjs().encode())
    build_s = statistics.median(times)
    scale = args.events / 10_000_000
    result = {
        "events": loaded or events,
        "trace_bytes": trace_bytes,
        "record_and_write_s": record_s,
        "load_s": load_s,
        "report_s": times,
        "report_median_s": build_s,
        "html_bytes": size,
        "plotly_js_bytes": plotly_js,
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        # Peak resident memory of each report: the building process, its forked child.
        "report_peak_rss_bytes": [p["self"] for p in peaks],
        "report_child_peak_rss_bytes": [p["child"] for p in peaks],
        "report_peak_rss_median_bytes": statistics.median(p["self"] for p in peaks),
        "report_child_peak_rss_median_bytes": statistics.median(p["child"] for p in peaks),
        "report_cpu_s": [p["cpu_s"] for p in peaks],
        "report_child_cpu_s": [p["child_cpu_s"] for p in peaks],
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    print(
        f"mxprof {mxprof.__version__}, python {platform.python_version()}, "
        f"{os.cpu_count()} cores; {result['events']:,} events, trace {trace_bytes / 1e6:.0f} MB"
    )
    print(f"reading the events alone      {load_s:8.2f} s")
    print(
        f"build (whole report), median  {build_s:8.2f} s of {args.repeats}: "
        + ", ".join(f"{t:.2f}" for t in times)
    )
    print(
        f"size                          {size / 1e6:8.2f} MB "
        f"(plotly.js {plotly_js / 1e6:.2f} MB, the rest {(size - plotly_js) / 1e6:.2f} MB)"
    )
    print(
        "CPU time, median              "
        f"{statistics.median(result['report_cpu_s']):8.2f} s building, "
        f"{statistics.median(result['report_child_cpu_s']):.2f} s its forked child"
    )
    print(
        f"peak memory, median           {result['report_peak_rss_median_bytes'] / 1e9:8.2f} GB "
        f"building, {result['report_child_peak_rss_median_bytes'] / 1e9:.2f} GB its forked "
        "child (the hints)"
    )
    if other:
        walls = [t for t, _ in other]
        print(
            f"\n{args.against}, alternated with the above:\n"
            f"build (whole report), median  {statistics.median(walls):8.2f} s: "
            + ", ".join(f"{t:.2f}" for t in walls)
            + f"\nCPU time, median              "
            f"{statistics.median(p['cpu_s'] for _, p in other):8.2f} s building, "
            f"{statistics.median(p['child_cpu_s'] for _, p in other):.2f} s its forked child\n"
            f"peak memory, median           "
            f"{statistics.median(p['self'] for _, p in other) / 1e9:8.2f} GB building, "
            f"{statistics.median(p['child'] for _, p in other) / 1e9:.2f} GB its forked child"
        )
        result["against"] = {
            "tree": args.against,
            "report_s": walls,
            "reports": [p for _, p in other],
        }
    # The targets are for 10 M events. A smaller run is projected linearly
    # (the page's size does not grow with the events; the build time does).
    projected = "" if scale >= 1 else f" (projected from {args.events:,} events)"
    print(f"\n{'target, 10 M events' + projected:58}{'measured':>10}{'limit':>10}")
    targets = [
        ("size", size / 1e6, SIZE_LIMIT / 1e6, "MB"),
        ("build", build_s / scale, TIME_LIMIT_S, "s"),
    ]
    if scale >= 1:  # memory has a floor (the interpreter, plotly): never projected
        peak = max(
            result["report_peak_rss_median_bytes"], result["report_child_peak_rss_median_bytes"]
        )
        targets.append(("peak memory of either process", peak / 1e9, MEMORY_LIMIT / 1e9, "GB"))
    for what, value, limit, unit in targets:
        verdict = "met" if value <= limit else "NOT MET"
        print(f"{what:58}{value:9.2f}{unit:>2}{limit:8.2f}{unit:>2} {verdict}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
