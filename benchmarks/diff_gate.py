"""The diff as a CI gate: how often it fails unchanged code, how often it catches a slowdown.

    python benchmarks/diff_gate.py [--quick] [--burners 2] [--steps 400] [--json out.json]

A small training-like loop (a loader thread feeding a queue; each step a
``forward``, a ``backward`` and an ``update`` range of sub-millisecond pure
Python, the loader's ``load_batch`` on its own thread) is recorded by mxprof
in fresh processes: ``BASE`` runs of the code as it is and ``SLOW`` runs with
``backward`` 20 % slower (more work, the same code path). Then, with
``mxprof.report.diff`` at its defaults (threshold 5 %, minimum change 1 us):

- false alarms: 15 pairs of distinct base runs (of 8), counted as failing
  the gate when ``--fail-on-regression`` would exit 1;
- detection: 20 (base, slow) pairs (of 8 x 6 runs), counted as caught when
  ``backward`` is a regression; the unchanged ranges beside it (forward,
  update, load_batch) flagged in a pair count as false alarms too;
- the same with several runs a side (``diff(BASE..., NEW...)``): 15 draws
  of two disjoint triples of base runs, and 20 draws of a triple of base
  runs against a triple of slow runs (seeded). Draws share runs, so they
  are not independent trials; the runs themselves are.

``--burners N`` runs N busy loops (``while True: pass``) alongside while
the runs are recorded, as on a loaded 2-core CI machine (2 by default).
The rates, the shifts the diff measured and the machine's load head the
output; the last line is the whole result as JSON. ``--quick`` (fewer runs
and steps) is what the slow test runs: it checks that the script works,
never the rates.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from typing import Any

import mxprof
from mxprof.report.diff import diff

# Where the children find mxprof: the copy this process imported.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mxprof.__file__)))

WORKLOAD = r"""
import queue, sys, threading
import mxprof

out, factor, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
mxprof.set_config(filename=out)
d = mxprof.Domain("bench")
load, fwd, bwd, upd = (d.new_task(n) for n in ("load_batch", "forward", "backward", "update"))


def spin(n):
    s = 0
    for i in range(n):
        s += i
    return s


q = queue.Queue(maxsize=4)


def loader():
    for i in range(steps):
        with load:
            spin(2000)
        q.put(i)


mxprof.set_state("run")
t = threading.Thread(target=loader)
t.start()
for _ in range(steps):
    q.get()
    with fwd:
        spin(6000)
    with bwd:
        spin(int(6000 * factor))
    with upd:
        spin(2500)
t.join()
mxprof.set_state("stop")
mxprof.dump()
"""

RANGES = ("load_batch", "forward", "backward", "update")
CHANGED = "backward"


def record(tmp: str, name: str, factor: float, steps: int) -> str:
    script = os.path.join(tmp, "workload.py")
    if not os.path.exists(script):
        with open(script, "w", encoding="utf-8") as f:
            f.write(WORKLOAD)
    out = os.path.join(tmp, f"{name}.json")
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run(
        [sys.executable, script, out, str(factor), str(steps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return out


def judge(base: Any, new: Any) -> dict[str, Any]:
    d = diff(base, new)
    rows = {r.name: r for r in d.rows}
    return {
        "gate_fails": bool(d.regressions),
        "flagged": sorted(r.name for r in d.rows if r.flagged),
        "shift": {n: round(rows[n].shift.pct or 0.0, 2) for n in RANGES if n in rows},
    }


def summary(results: list[dict[str, Any]], caught: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"pairs": len(results)}
    if caught:
        out["caught"] = sum(CHANGED in r["flagged"] for r in results)
        out["unchanged_flagged"] = sum(
            any(n in r["flagged"] for n in RANGES if n != CHANGED) for r in results
        )
    else:
        out["gate_fails"] = sum(r["gate_fails"] for r in results)
        out["rows_flagged"] = sum(len(r["flagged"]) for r in results)
    for name in RANGES:
        shifts = [r["shift"][name] for r in results if name in r["shift"]]
        if shifts:
            out[f"{name}_shift_median"] = round(statistics.median(shifts), 2)
            out[f"{name}_shift_range"] = [min(shifts), max(shifts)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few runs and steps")
    parser.add_argument("--burners", type=int, default=2, help="busy loops alongside (2)")
    parser.add_argument("--steps", type=int, help="steps per run (400; quick 60)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    steps = args.steps or (60 if args.quick else 400)
    n_base, n_slow = (6, 3) if args.quick else (8, 6)
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)
    ]
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            base = [record(tmp, f"base{i}", 1.0, steps) for i in range(n_base)]
            slow = [record(tmp, f"slow{i}", 1.2, steps) for i in range(n_slow)]
            loaded = mxprof.load  # one load per file, reused by every pair
            traces = {p: loaded(p) for p in base + slow}
            pairs = list(itertools.combinations(base, 2))[:15]
            same = [judge(traces[a], traces[b]) for a, b in pairs]
            regress = [judge(traces[a], traces[b]) for a, b in zip(base * 4, slow * 4)][:20]
            # Several runs a side: three against three, disjoint, drawn with a fixed seed.
            rng = random.Random(1)
            splits = []
            for _ in range(15):
                picked = rng.sample(base, 6)
                splits.append((picked[:3], picked[3:]))
            same_runs = [judge([traces[p] for p in a], [traces[p] for p in b]) for a, b in splits]
            regress_runs = [
                judge(
                    [traces[p] for p in rng.sample(base, 3)],
                    [traces[p] for p in rng.sample(slow, 3)],
                )
                for _ in range(20)
            ]
    finally:
        for b in burners:
            b.kill()
            b.wait()
    doc = {
        "machine": {
            "cores": os.cpu_count(),
            "python": sys.version.split()[0],
            "burners": args.burners,
            "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "steps": steps,
            "runs": {"base": n_base, "slow": n_slow},
        },
        "one_run_a_side": {
            "same_code": summary(same, caught=False),
            "backward_20pct_slower": summary(regress, caught=True),
        },
        "several_runs_a_side": {
            "same_code": summary(same_runs, caught=False),
            "backward_20pct_slower": summary(regress_runs, caught=True),
        },
    }
    print(f"{os.cpu_count()} cores, {args.burners} burner(s), load {doc['machine']['load_before']}")
    print(f"{n_base} base runs and {n_slow} with backward 20 % slower, {steps} steps each")
    print("| comparison | pairs | gate fails (same code) / backward caught | unchanged flagged |")
    print("|---|---|---|---|")
    for mode, label in (("one_run_a_side", "1 v 1"), ("several_runs_a_side", "3 v 3")):
        same_s = doc[mode]["same_code"]
        reg_s = doc[mode]["backward_20pct_slower"]
        print(
            f"| {label}, same code | {same_s['pairs']} | {same_s['gate_fails']} fail | "
            f"{same_s['rows_flagged']} rows |"
        )
        print(
            f"| {label}, backward +20 % | {reg_s['pairs']} | {reg_s['caught']} caught | "
            f"{reg_s['unchanged_flagged']} pairs |"
        )
    print(json.dumps(doc))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f)


if __name__ == "__main__":
    main()
