"""stats, ranks and report of many rank files on 1 process, 2 processes and a Dask
LocalCluster(2).

    python benchmarks/jobs.py [--quick] [--ranks 64] [--events 1000000] [--repeats 3]
                              [--commands stats,ranks,report]

One trace of ``--events`` events is recorded with the live core (the
training-like loop of benchmarks/report.py) and copied ``--ranks`` times
(benchmarks/merge.py's ``copies``). Then, per repeat and in turn, each
command runs as ``mxprof`` in a process of its own, as a user would run it:

- ``mxprof stats --format json FILES`` with ``--jobs 1``, ``--jobs 2`` and
  ``--engine dask --jobs 2`` (a LocalCluster of 2 workers, started and
  stopped inside the command: its start is in the time);
- the same for ``mxprof ranks``;
- ``mxprof report FILES -o PAGE`` with ``--jobs 1`` and ``--jobs 2`` (the
  processes its page is built with; ``--commands report``, not in the
  default: the page holds every event in one process, about 7 s a million
  events; use ``--ranks 8``; a Dask engine is refused by report).

Each command's output (for report: the page) must be the same on every
engine (checked: the run stops otherwise). Printed: the median wall time of each over the
repeats, the speed-up of ``--jobs 2`` over ``--jobs 1`` and the ratio of Dask
to ``--jobs 2``, the CPU time of each command with its workers and how many
cores it kept busy at once (CPU / wall), the machine's load average before
and after and whether the kernel shares CPU time by session first
(autogroup: then a session's extra processes get no more CPU on a busy
machine), and issue 26's
targets (``--jobs 2`` >= 1.7x ``--jobs 1``; Dask within 20 % of ``--jobs
2``). On a machine that other work shares, the speed-up is bounded by the
cores left free: read it with the load average.

``--quick`` is a small run of all three commands that checks the script works (the test suite
runs it), never how fast anything is. Files go to a temporary folder (about
90 MB per million events a copy).
"""

from __future__ import annotations

import argparse
import hashlib
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import merge  # noqa: E402  (benchmarks/merge.py: the copies)
import report  # noqa: E402  (benchmarks/report.py: the recording)

ENGINES = {
    "jobs 1": ["--jobs", "1"],
    "jobs 2": ["--jobs", "2"],
    "dask 2": ["--engine", "dask", "--jobs", "2"],
}


def engines_of(command: str) -> dict[str, list[str]]:
    """The engines a command is timed on: report takes no Dask engine."""
    return {k: v for k, v in ENGINES.items() if command != "report" or k != "dask 2"}


TARGET_SPEEDUP = 1.7
TARGET_DASK = 1.2


def cpu() -> float:
    """CPU seconds of the children waited for so far (with their own children)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(command: str, how: list[str], paths: list[str], folder: str) -> tuple[float, float, str]:
    """``mxprof COMMAND --format json HOW PATHS`` in a child (for report: ``mxprof
    report HOW PATHS -o PAGE``): (seconds, CPU seconds of it and its workers,
    digest of its output)."""
    page = os.path.join(folder, "page.html")
    if command == "report":
        argv = [sys.executable, "-m", "mxprof", command, *how, *paths, "-o", page]
    else:
        argv = [sys.executable, "-m", "mxprof", command, "--format", "json", *how, *paths]
    c0, t0 = cpu(), time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False)
    seconds, used = time.perf_counter() - t0, cpu() - c0
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(argv[:8])} ...: {done.stderr.decode()[-2000:]}")
    if command == "report":
        with open(page, "rb") as f:
            return seconds, used, hashlib.sha256(f.read()).hexdigest()
    return seconds, used, hashlib.sha256(done.stdout).hexdigest()


def autogroup() -> str:
    """Whether the kernel shares CPU time between sessions first (Linux autogroup):
    then, on a busy machine, more processes of one session get no more of it."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled", encoding="ascii") as f:
            return "on" if f.read().strip() == "1" else "off"
    except OSError:
        return "unknown"


def load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run: checks the script")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument(
        "--commands",
        default="stats,ranks",
        help="which commands to time, comma-separated (stats,ranks,report): ranks of "
        "64 M events takes about 4 min a pass on one core; report holds every event in "
        "one process (use --ranks 8)",
    )
    args = parser.parse_args()
    commands = [c for c in args.commands.split(",") if c]
    if not commands or any(c not in ("stats", "ranks", "report") for c in commands):
        parser.error(f"--commands {args.commands!r}: give some of stats,ranks,report")
    if args.quick:
        args.ranks, args.events, args.repeats = 3, 5_000, 1
        commands = ["stats", "ranks", "report"]
    folder = tempfile.mkdtemp(prefix="mxprof-bench-jobs-")
    times: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    load_before = load()
    try:
        one = os.path.join(folder, "one.json")
        report.record(one, args.events)
        paths = merge.copies(one, folder, args.ranks)
        os.unlink(one)
        for _ in range(args.repeats):
            for command in commands:
                digests = set()
                for name, how in engines_of(command).items():
                    seconds, used, digest = run(command, how, paths, folder)
                    times.setdefault(f"{command} {name}", []).append(seconds)
                    cpus.setdefault(f"{command} {name}", []).append(used)
                    digests.add(digest)
                if len(digests) != 1:
                    raise SystemExit(f"{command}: the engines' outputs differ")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    load_after = load()
    median = {k: statistics.median(v) for k, v in times.items()}
    median_cpu = {k: statistics.median(v) for k, v in cpus.items()}
    result: dict[str, object] = {
        "ranks": args.ranks,
        "events_per_rank": args.events,
        "repeats": args.repeats,
        "load_before": load_before,
        "load_after": load_after,
        "cores": os.cpu_count(),
        "autogroup": autogroup(),
        "median_s": median,
        "median_cpu_s": median_cpu,
        "all_s": times,
    }
    print(
        f"python {platform.python_version()}, {os.cpu_count()} cores, load average "
        f"{load_before:.2f} before, {load_after:.2f} after, scheduler autogroup {autogroup()}"
    )
    print(
        f"{args.ranks} files x {args.events:,} events, median of {args.repeats} "
        "(identical output on every engine: checked)"
    )
    rows = []
    for command in commands:
        if command == "report":  # no Dask: report reads its inputs in its own process
            j1, j2 = (median[f"report {e}"] for e in engines_of(command))
            c1, c2 = (median_cpu[f"report {e}"] for e in engines_of(command))
            result["report_speedup"] = j1 / j2
            print(
                f"  report --jobs 1 {j1:7.2f} s   --jobs 2 {j2:7.2f} s   speed-up {j1 / j2:.2f}x"
                f"   CPU s {c1:7.2f}   {c2:7.2f}"
            )
            continue
        j1, j2, dk = (median[f"{command} {e}"] for e in ENGINES)
        speedup, dask = j1 / j2, dk / j2
        result[f"{command}_speedup"] = speedup
        result[f"{command}_dask_ratio"] = dask
        print(
            f"  {command:6} --jobs 1 {j1:7.2f} s   --jobs 2 {j2:7.2f} s   "
            f"dask LocalCluster(2) {dk:7.2f} s   speed-up {speedup:.2f}x   dask/jobs2 {dask:.2f}"
        )
        c1, c2, cd = (median_cpu[f"{command} {e}"] for e in ENGINES)
        print(
            f"         CPU s (all processes): {c1:7.2f}   {c2:7.2f}   {cd:7.2f}   "
            f"cores used at once (CPU / wall): {c1 / j1:.2f}   {c2 / j2:.2f}   {cd / dk:.2f}"
        )
        rows.append((f"{command}: --jobs 2 speed-up", speedup, f">= {TARGET_SPEEDUP}"))
        rows.append((f"{command}: dask / --jobs 2", dask, f"<= {TARGET_DASK}"))
    print("targets (issue 26):")
    for what, value, target in rows:
        ok = value >= TARGET_SPEEDUP if target.startswith(">") else value <= TARGET_DASK
        print(f"  {what:28} {value:5.2f}  {target:7} {'met' if ok else 'NOT MET'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
