"""Stack sampling: overhead, rate achieved, accuracy, threads (issue 14).

    PYTHONPATH=. python benchmarks/sampling.py [--quick]

Overhead: a CPU-bound pure-Python workload (recursive calls, ~10 M calls/s)
run bare, under mxprof sampling at 100 Hz and 1 kHz, and beside it under
viztracer (tracing), pyinstrument (in-process sampling) and py-spy
(out-of-process sampling, where ptrace is permitted); each in a fresh
process, the median of REPEAT runs, the ratio to the bare median.
Accuracy: two functions taking ~70 % / 30 % of the CPU, sampled at 1 kHz
for 2 s; the shares reported.  Threads: 8 threads with a function each,
and one thread blocked in time.sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import mxprof  # noqa: E402  (where the children find it: the same copy as here)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mxprof.__file__)))
QUICK = "--quick" in sys.argv
REPEAT = 3 if QUICK else 5

WORKLOAD = """
import sys, time
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
t = time.perf_counter()
fib(int(sys.argv[1]) if len(sys.argv) > 1 else 31)
print(time.perf_counter() - t)
"""

MXPROF = """
import sys, time, mxprof
mxprof.set_config(filename=sys.argv[2], aggregate_stats=True, sample_rate=float(sys.argv[1]))
mxprof.set_state("run")
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
t = time.perf_counter()
fib(31)
e = time.perf_counter() - t
mxprof.set_state("stop")
print(e)
import json
print(json.loads(mxprof.dumps(format="json")).get("Samples", {}).get("Count", 0), file=sys.stderr)
"""


def run(cmd: list[str], **kw: object) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=True)
    for line in reversed(out.stdout.splitlines()):
        try:
            return float(line.strip()), out.stderr
        except ValueError:
            continue
    raise ValueError(f"no time printed by {cmd}: {out.stdout[-200:]} {out.stderr[-200:]}")


def median(cmd: list[str]) -> tuple[float, str]:
    results = [run(cmd) for _ in range(REPEAT)]
    return statistics.median(r[0] for r in results), results[-1][1]


ACCURACY = """
import json, sys, time, mxprof
mxprof.set_config(filename=sys.argv[1], aggregate_stats=True, sample_rate=1000)
def seventy(n):
    for _ in range(n):
        pass
def thirty(n):
    for _ in range(n):
        pass
mxprof.set_state("run")
end = time.perf_counter() + 2.0
while time.perf_counter() < end:
    seventy(70_000)
    thirty(30_000)
mxprof.set_state("stop")
s = json.loads(mxprof.dumps(format="json"))["Samples"]
shares = {f["Function"]: f["Self %"] for f in s["Program"]}
print(s["Count"], shares.get("seventy"), shares.get("thirty"))
"""


def accuracy(tmp: str) -> None:
    path = os.path.join(tmp, "acc.py")
    with open(path, "w") as f:
        f.write(ACCURACY)
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, path, os.path.join(tmp, "a.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    count, seventy, thirty = out.stdout.split()
    print(f"accuracy (1 kHz, 2 s): {count} samples, seventy {seventy} %, thirty {thirty} %")


def main() -> None:
    tmp = tempfile.mkdtemp()
    work = os.path.join(tmp, "work.py")
    with open(work, "w") as f:
        f.write(WORKLOAD)
    mx = os.path.join(tmp, "mx.py")
    with open(mx, "w") as f:
        f.write(MXPROF)
    py = sys.executable
    bare, _ = median([py, work])
    rows = [("bare", bare, "")]
    for hz in (100, 1000):
        t, err = median([py, mx, str(hz), os.path.join(tmp, "t.json")])
        rows.append((f"mxprof sampling {hz} Hz", t, f"{err.strip()} samples"))
    if True:
        try:
            t, _ = median(
                [py, "-m", "viztracer", "--quiet", "-o", os.path.join(tmp, "v.json"), work]
            )
            rows.append(("viztracer (tracing)", t, ""))
        except Exception as e:  # noqa: BLE001
            rows.append(("viztracer", float("nan"), str(e)[:60]))
    try:
        t, _ = median([py, "-m", "pyinstrument", "-o", os.path.join(tmp, "p.txt"), work])
        rows.append(("pyinstrument (1 ms)", t, ""))
    except Exception as e:  # noqa: BLE001
        rows.append(("pyinstrument", float("nan"), f"unavailable: {str(e)[:60]}"))
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(py), "py-spy")
    try:
        t, _ = median(
            [spy, "record", "-r", "1000", "-o", os.path.join(tmp, "s.svg"), "--", py, work]
        )
        rows.append(("py-spy 1 kHz", t, ""))
    except Exception as e:  # noqa: BLE001
        rows.append(("py-spy", float("nan"), f"unavailable here: {type(e).__name__}"))
    print(f"{'workload':<28}{'median s':>10}{'ratio':>8}  note")
    for name, t, note in rows:
        print(f"{name:<28}{t:>10.3f}{t / bare:>8.3f}  {note}")
    print(json.dumps({n: t / bare for n, t, _ in rows}))
    accuracy(tmp)


if __name__ == "__main__":
    main()
