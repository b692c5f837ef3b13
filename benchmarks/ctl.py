"""mxprof ctl: what the control endpoint costs, and how fast ``where`` answers.

    python benchmarks/ctl.py [--quick] [--repeats 7] [--number 200000] [--asks 20]

1. Per-event cost with the endpoint idle: the per-call cases of
   benchmarks/calls.py (recording), timed in one process with the endpoint
   open and closed, the two groups taking turns within every repeat; the
   table shows both medians and their difference.
2. ``where`` against a child whose main thread is blocked in ``time.sleep``,
   on a ``threading.Lock``, or running a Python loop (the GIL changes hands
   every switch interval): the round trip of one request (median and max over
   --asks), and of the whole ``mxprof ctl PID where`` command (a new
   interpreter each time).  The target: at most 1 s with the main thread
   blocked in C.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import calls  # noqa: E402

import mxprof  # noqa: E402
from mxprof import _ctlclient, _ctlserver  # noqa: E402

CASES = {
    k: calls.MXPROF_CASES[k] for k in ("with task", "task.start(); task.stop()", "counter += 1")
}


def idle_cost(number: int, repeats: int) -> dict[str, tuple[float, float]]:
    """case -> (median ns with the endpoint open, closed)."""
    tmp = tempfile.mkdtemp(prefix="mxprof-bench-ctl-")
    enter = calls._set_mode("recording", tmp)
    groups = {
        "open": calls.Group("endpoint open", CASES, calls._mxprof_names()),
        "closed": calls.Group("endpoint closed", CASES, calls._mxprof_names()),
    }
    toggles = {"open": _ctlserver.start, "closed": _ctlserver.close}
    for g in groups.values():
        g.samples = {c: [] for c in CASES}
    for r in range(-1, repeats):  # -1: warm-up
        order = ("open", "closed") if r % 2 else ("closed", "open")
        for key in order:
            enter()
            toggles[key]()
            g = groups[key]
            for case, stmt in CASES.items():
                ns = calls._time(stmt, g.names, number if r >= 0 else number // 10)
                if r >= 0:
                    g.samples[case].append(ns)
            calls._discard()
    mxprof.set_state("stop")
    _ctlserver.start()
    return {
        c: (
            statistics.median(groups["open"].samples[c]),
            statistics.median(groups["closed"].samples[c]),
        )
        for c in CASES
    }


def where_latency(block: str, asks: int, cli_asks: int) -> dict[str, float]:
    env = dict(os.environ)  # the children import the mxprof this script imports
    child = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "_ctl_child.py"), block, "run",
         os.path.join(tempfile.mkdtemp(prefix="mxprof-bench-ctl-"), "own.json")],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(0.2)
        times = []
        for _ in range(asks):
            t0 = time.perf_counter()
            w = _ctlclient.request(child.pid, "where", timeout=5.0)
            times.append(time.perf_counter() - t0)
            assert any(t["main"] and t["ranges"] for t in w["threads"])
        cli = []
        for _ in range(cli_asks):
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "mxprof", "ctl", str(child.pid), "where"],
                check=True, capture_output=True, env=env, timeout=60,
            )  # fmt: skip
            cli.append(time.perf_counter() - t0)
    finally:
        child.kill()
        child.wait(timeout=30)
    return {
        "median_ms": statistics.median(times) * 1e3,
        "max_ms": max(times) * 1e3,
        "cli_median_ms": statistics.median(cli) * 1e3,
        "cli_max_ms": max(cli) * 1e3,
    }


def import_ms(module: str, runs: int = 5) -> float:
    """Median ms of a fresh interpreter that imports module, minus one that imports nothing."""
    env = dict(os.environ)  # the children import the mxprof this script imports

    def once(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
        return time.perf_counter() - t0

    bare = statistics.median(once("pass") for _ in range(runs))
    return (statistics.median(once(f"import {module}") for _ in range(runs)) - bare) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--number", type=int, default=200_000)
    p.add_argument("--asks", type=int, default=20)
    a = p.parse_args()
    if a.quick:
        a.repeats, a.number, a.asks = 2, 2_000, 3
    print(f"1. per-event cost, recording, endpoint open vs closed (median of {a.repeats}, ns/call)")
    print(f"{'case':<30}{'open':>10}{'closed':>10}{'diff':>10}")
    for case, (on, off) in idle_cost(a.number, a.repeats).items():
        print(f"{case:<30}{on:>10.1f}{off:>10.1f}{on - off:>+10.1f}")
    print(f"\n2. `where` round trip, main thread in range train:step (ms; {a.asks} requests, "
          f"{max(1, a.asks // 4)} CLI runs)")  # fmt: skip
    print(f"{'main thread':<22}{'median':>9}{'max':>9}{'cli med':>9}{'cli max':>9}")
    worst = cli_worst = 0.0
    for block, label in (
        ("sleep", "in time.sleep"),
        ("lock", "on a Lock"),
        ("spin", "in a Python loop"),
    ):
        r = where_latency(block, a.asks, max(1, a.asks // 4))
        if block != "spin":
            worst, cli_worst = max(worst, r["max_ms"]), max(cli_worst, r["cli_max_ms"])
        print(
            f"{label:<22}{r['median_ms']:>9.2f}{r['max_ms']:>9.2f}"
            f"{r['cli_median_ms']:>9.1f}{r['cli_max_ms']:>9.1f}"
        )
    imports = {m: import_ms(m) for m in ("mxprof._ctlclient", "mxprof.cli")}
    print(
        "\nthe command's own start (median of 5 fresh interpreters, ms): "
        + ", ".join(f"import {m} {v:.0f}" for m, v in imports.items())
    )
    verdict = "met" if worst <= 1000 else "MISSED"
    print(
        f"target: `where` answers in <= 1 s with the main thread blocked in C: {verdict} "
        f"(worst round trip {worst:.1f} ms; the whole command, interpreter start and "
        f"imports included, worst {cli_worst:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
