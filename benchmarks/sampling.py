"""Stack sampling against ground truth: mxprof's shares and py-spy's, and what each costs.

    python benchmarks/sampling.py [--quick] [--repeat 5] [--seconds 2] [--json out.json]
                                  [--no-pyspy] [--no-oracle]

Accuracy: every workload of tests/sampling/truth.py (which clocks its own
functions; its docstring defines shares, true shares and errors) at 100 Hz
and 1 kHz, ``mixed`` with 0.5 and 3 ms bursts, run under mxprof
(``--profiler mxprof``) and under py-spy (``py-spy record -r HZ --idle -f raw
-- python truth.py ... --profiler none``), in turn, REPEAT times, each run a
fresh process. A 1 kHz run lasts ``--seconds``, a 100 Hz run four times as
long, so that both get some thousands of samples. The table shows, per
thread, the medians over repeats of each function's true share and
measured share, and of the run's error (its largest distance from its own
run's truth, in points), for each profiler; the true shares are those of
the profiler's own runs, since a profiler changes what it measures (py-spy
stops the process for every sample). The last column is the error of the
ideal sampler (``truth.py --profiler oracle``: a SCHED_FIFO process reading
which function each thread is in from shared memory, at the same mean rate
with jittered intervals) in a third run: what the machine's timing costs a
sampler that is on time and not in step with the workload.
``twophase`` adds the samples mxprof filed under the other phase's range or
under none, summed over repeats.

py-spy's flags: ``--idle`` keeps the samples of threads py-spy takes for
idle (sleeping, blocked in a lock or in I/O), which it otherwise drops;
wall-clock shares need them (mxprof keeps them too, as ``<waiting>``).
``-f raw`` writes folded stacks (``frame;frame count``), the easiest output
to read back. Left at the defaults: py-spy stops the process while it reads
each sample (``--nonblocking`` would make that cheaper but can read a stack
half-changed), samples every thread whether it holds the GIL or not (no
``--gil``), and reads Python frames only (no ``--native``).

Overhead: ``truth.py loop`` (pure Python) and ``truth.py mixed`` (3 ms
bursts), a fixed number of cycles with one calibration for all runs, bare,
under mxprof at 100 Hz and 1 kHz and under py-spy at the same rates; each in a
fresh process, REPEAT times, interleaved; the median of the workload's own
elapsed time (the process's start-up and the profiler's start and stop are
left out) and its ratio to the bare median of the same run.

py-spy rows are skipped, with the reason, where py-spy is not installed or
may not trace (ptrace refused). ``--quick`` runs one short repeat of each:
the test suite uses it to check that the script works, never how accurate
or fast anything is. The machine's cores and load, and the Python version,
head the output; the last line is the whole result as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

import mxprof

# Where the children find mxprof: the copy this process imported (an installed
# one, or a built tree), never the source tree's unbuilt mxprof/.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mxprof.__file__)))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTH = os.path.join(REPO, "tests", "sampling", "truth.py")

_spec = importlib.util.spec_from_file_location("truth", TRUTH)
assert _spec is not None and _spec.loader is not None
truth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(truth)

RATES = (100, 1000)
CASES = [  # (label, workload, burst ms or None for the workload's own)
    ("mixed 0.5 ms", "mixed", 0.5),
    ("mixed 3 ms", "mixed", 3.0),
    ("queue", "queue", None),
    ("lock", "lock", None),
    ("threads", "threads", None),
    ("asyncio", "asyncio", None),
    ("short", "short", None),
    ("twophase", "twophase", None),
]
OVERHEAD = [("loop", "pure-Python loop"), ("mixed", "mixed, 3 ms bursts")]


def child(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)


def read(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        result: dict[str, Any] = json.load(f)
    return result


def pyspy() -> tuple[str | None, str]:
    """py-spy's path and version, or None and why it cannot be used here."""
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(exe):
        return None, "py-spy is not installed (pip install py-spy)"
    version = child([exe, "--version"], 30).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "probe.txt")
        cmd = [exe, "record", "-r", "100", "-f", "raw", "-o", out, "--"]
        probe = child(cmd + [sys.executable, "-c", "import time; time.sleep(0.2)"], 60)
        if probe.returncode != 0 or not os.path.exists(out):
            why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"{version} cannot record here (ptrace refused?): {why[:120]}"
    return exe, version


class Runner:
    """Runs truth.py children in a scratch directory."""

    def __init__(self, tmp: str, spy: str | None, seconds: float, oracle: bool) -> None:
        self.tmp, self.spy, self.seconds, self.oracle = tmp, spy, seconds, oracle
        self.n = 0

    def _paths(self) -> tuple[str, str]:
        self.n += 1
        return (
            os.path.join(self.tmp, f"r{self.n}.json"),
            os.path.join(self.tmp, f"s{self.n}.txt"),
        )

    def truth_args(self, workload: str, burst: float | None, rate: int, extra: list[str]) -> list:
        seconds = self.seconds * (4 if rate == 100 else 1)
        args = [TRUTH, workload, "--seconds", f"{seconds:g}", *extra]
        if burst is not None:
            args += ["--burst-ms", f"{burst:g}"]
        return args

    def mxprof(self, args: list[str], rate: int, profiler: str = "mxprof") -> dict[str, Any]:
        result, _ = self._paths()
        cmd = [sys.executable, *args, "--profiler", profiler, "--rate", str(rate)]
        proc = child(cmd + ["--result", result], 600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
        return read(result)

    def ideal(self, args: list[str], rate: int) -> dict[str, Any]:
        return self.mxprof(args, rate, "oracle")

    def pyspy(self, args: list[str], rate: int) -> dict[str, Any]:
        assert self.spy is not None
        result, raw = self._paths()
        cmd = [self.spy, "record", "-r", str(rate), "--idle", "-f", "raw", "-o", raw, "--"]
        cmd += [sys.executable, *args, "--profiler", "none", "--result", result]
        proc = child(cmd, 600)
        if proc.returncode != 0 or not os.path.exists(raw):
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
        got = read(result)
        stacks = truth.pyspy_stacks(raw)
        got.update(truth.shares(got["groups"], stacks, got["mode"]))
        got["errors"] = truth.errors(got["shares"], got["true_shares"])
        got["total_samples"] = sum(n for _, n in stacks)
        return got


def med(values: list[float]) -> float:
    return round(statistics.median(values), 1) if values else float("nan")


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats, per group: true shares, shares, error, samples."""
    if not runs:
        return {}
    out: dict[str, Any] = {}
    for g, fns in runs[0]["groups"].items():
        out[g] = {
            "functions": fns,
            "truth": [med([r["true_shares"][g][fn] for r in runs]) for fn in fns],
            "shares": [med([r["shares"][g][fn] for r in runs]) for fn in fns],
            "error": med([r["errors"][g] for r in runs]),
            "samples": int(statistics.median(r["samples"][g] for r in runs)),
        }
    return out


def accuracy(run: Runner, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for label, workload, burst in CASES:
        for rate in RATES:
            args = run.truth_args(workload, burst, rate, [])
            mx: list[dict[str, Any]] = []
            spy: list[dict[str, Any]] = []
            ideal: list[dict[str, Any]] = []
            for i in range(repeat):
                # Rotate which goes first, so that none always follows another.
                order = ["mx", "spy", "ideal"]
                for who in order[i % 3 :] + order[: i % 3]:
                    if who == "mx":
                        mx.append(run.mxprof(args, rate))
                    elif who == "spy" and run.spy is not None:
                        spy.append(run.pyspy(args, rate))
                    elif who == "ideal" and run.oracle:
                        ideal.append(run.ideal(args, rate))
            wrong: dict[str, int] = {}
            for r in mx:
                for k, n in r.get("misattributed", {}).items():
                    wrong[k] = wrong.get(k, 0) + n
            row = {"case": label, "rate": rate, "repeat": repeat}
            row.update(mxprof=summarise(mx), pyspy=summarise(spy), oracle=summarise(ideal))
            if ideal:
                row["oracle_policy"] = ideal[0]["oracle_policy"]
            if workload == "twophase":
                row["misattributed"] = wrong
            rows.append(row)
            print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def overhead(run: Runner, repeat: int, cycles: dict[str, int]) -> list[dict[str, Any]]:
    result, _ = run._paths()
    calibrate = child([sys.executable, TRUTH, "loop", "--cycles", "1", "--result", result], 120)
    if calibrate.returncode != 0:
        raise RuntimeError(calibrate.stderr[-2000:])
    work = read(result)["work"]
    variants: list[tuple[str, str, int]] = [("bare", "none", 0)]
    variants += [(f"mxprof {hz} Hz", "mxprof", hz) for hz in RATES]
    if run.spy is not None:
        variants += [(f"py-spy {hz} Hz", "pyspy", hz) for hz in RATES]
    rows = []
    for workload, label in OVERHEAD:
        args = [TRUTH, workload, "--cycles", str(cycles[workload]), "--burst-ms", "3"]
        args += ["--work", work]
        times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        rates: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        for _ in range(repeat):
            for name, how, hz in variants:
                if how == "mxprof":
                    got = run.mxprof(args, hz)
                    rates[name].append(got["total_samples"] / got["elapsed"])
                elif how == "pyspy":
                    got = run.pyspy(args, hz)
                else:
                    path, _ = run._paths()
                    proc = child([sys.executable, *args, "--result", path], 600)
                    if proc.returncode != 0:
                        raise RuntimeError(proc.stderr[-2000:])
                    got = read(path)
                times[name].append(got["elapsed"])
        bare = statistics.median(times["bare"])
        for name, _, _ in variants:
            t = statistics.median(times[name])
            row = {"workload": label, "variant": name, "median_s": round(t, 4)}
            row["ratio"] = round(t / bare, 4)
            row["samples_per_s"] = round(statistics.median(rates[name])) if rates[name] else None
            rows.append(row)
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def fmt(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def print_accuracy(rows: list[dict[str, Any]], spy_note: str) -> None:
    head = ["case", "Hz", "thread: functions", "truth", "mxprof", "err"]
    head += ["truth (py-spy run)", "py-spy", "err", "ideal err"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        for g, m in row["mxprof"].items():
            s = row["pyspy"].get(g)
            o = row["oracle"].get(g)
            names = f"{g}: {' / '.join(m['functions'])}"
            cells = [row["case"], str(row["rate"]), names, fmt(m["truth"]), fmt(m["shares"])]
            cells.append(f"{m['error']:.1f}")
            if s:
                cells += [fmt(s["truth"]), fmt(s["shares"]), f"{s['error']:.1f}"]
            else:
                cells += ["", "skipped", ""]
            cells.append(f"{o['error']:.1f}" if o else "")
            print("| " + " | ".join(cells) + " |")
    print()
    print("shares in %, medians of the repeats; err: the median of each run's largest")
    print("|share - truth| in points; ideal: a SCHED_FIFO process reading which function")
    print("runs from shared memory at the same mean rate, intervals jittered by +-50 %;")
    print("samples per thread and run (median):")
    for row in rows:
        counts = ", ".join(
            f"{g} {m['samples']}" + (f"/{row['pyspy'][g]['samples']}" if g in row["pyspy"] else "")
            for g, m in row["mxprof"].items()
        )
        print(f"  {row['case']} {row['rate']} Hz: {counts}  (mxprof/py-spy)")
    for row in rows:
        if "misattributed" in row:
            wrong = row["misattributed"]
            total = sum(wrong.values())
            detail = ", ".join(f"{k}: {n}" for k, n in sorted(wrong.items())) or "none"
            print(
                f"twophase {row['rate']} Hz, mxprof: {total} samples in the wrong range over "
                f"{row['repeat']} runs ({detail})"
            )
    if spy_note:
        print(f"py-spy: {spy_note}")
    policies = {row.get("oracle_policy") for row in rows} - {None}
    if policies:
        print(f"ideal sampler's scheduling: {', '.join(sorted(policies))}")


def print_overhead(rows: list[dict[str, Any]]) -> None:
    print("| workload | variant | median s | x bare | samples/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        rate = "" if r["samples_per_s"] is None else str(r["samples_per_s"])
        cells = [r["workload"], r["variant"], f"{r['median_s']:.3f}", f"{r['ratio']:.3f}", rate]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short repeat of everything")
    parser.add_argument("--repeat", type=int, help="runs per case (default 5, quick 1)")
    parser.add_argument("--seconds", type=float, help="1 kHz run length (100 Hz: x4); default 2")
    parser.add_argument("--no-pyspy", action="store_true", help="leave py-spy out")
    parser.add_argument("--no-oracle", action="store_true", help="leave the ideal sampler out")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    repeat = args.repeat or (1 if args.quick else 5)
    seconds = args.seconds or (0.25 if args.quick else 2.0)
    cycles = {"loop": 60, "mixed": 20} if args.quick else {"loop": 700, "mixed": 200}
    spy, note = (None, "left out (--no-pyspy)") if args.no_pyspy else pyspy()
    machine = {
        "python": platform.python_version(),
        "mxprof": mxprof.__version__,
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "load": [round(x, 2) for x in os.getloadavg()],
        "pyspy": note if spy is not None else None,
    }
    print(
        f"mxprof {machine['mxprof']}, python {machine['python']}, {machine['cores']} cores "
        f"({machine['cpu']}), load {machine['load']}; py-spy: {note}"
    )
    print(f"{repeat} repeat(s); 1 kHz runs {seconds:g} s, 100 Hz runs {4 * seconds:g} s")
    with tempfile.TemporaryDirectory() as tmp:
        run = Runner(tmp, spy, seconds, not args.no_oracle)
        rows = accuracy(run, repeat)
        costs = overhead(run, repeat, cycles)
    machine["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print()
    print_accuracy(rows, "" if spy is not None else f"skipped: {note}")
    print()
    print_overhead(costs)
    print(f"\nload average after: {machine['load_after']}")
    doc = {"machine": machine, "accuracy": rows, "overhead": costs}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f)
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
