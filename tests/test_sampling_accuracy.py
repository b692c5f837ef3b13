"""Stack sampling against ground truth: each workload of tests/sampling/truth.py
clocks its own functions, and the shares mxprof's samples give them must
match, at 100 Hz and 1 kHz; no sample of a two-phase loop may land in the
other phase's range.

Tolerance (points of share, per function) = SYSTEMATIC + Z * 100 * sqrt(p (1 - p) / n),
p the true share, n the samples of the function's thread:

- The second term is sampling noise. A sample hits a function with
  probability p; n samples give a share with standard error sqrt(p(1-p)/n)
  when each burst of the function is shorter than the sampling period (it
  then gets one sample or none, independently), and less when bursts are
  longer (each then gets its expected count to within one). So the binomial
  error is the upper bound. Z = 4: the file checks about 75 shares, and
  with a two-sided tail of 6e-5 per share an unbiased sampler fails a run
  of the file by chance less than once in 200 runs.
- SYSTEMATIC = 4 points: the sampler's target on a quiet machine (within 3
  points of the truth), plus 1 for a loaded machine, where the threads lose
  the CPU in stretches of milliseconds, which makes the samples fewer in
  effect than they are in number. (For n = 500, p = 1/3 the tolerance is
  12.4 points; for n = 1,500, 8.9.)

That this is attainable on a loaded two-core machine was measured with the
ideal sampler (``truth.py --profiler oracle``: another process, at
SCHED_FIFO priority, reading which function each thread is in from shared
memory, at intervals drawn from 0.5 to 1.5 periods). It passed all 16
cases on a quiet machine, and beside two CPU burners and the machine's
other work (load average up to 5.5), with 5.8 points at most. It takes
both of its properties to get there:

- on time: the same reader at the default priority, on the quiet machine,
  missed the lock waiter's shares by up to 17 points and the producer's by
  10 (2 to 3 cases of 16 failing per run). A sampler woken on the CPU of a
  thread that has just woken too waits until that thread blocks again, so
  it does not see a short burst after a wake-up;
- not in step: with a fixed period, at SCHED_FIFO, beside CPU burners, it
  missed by 9 to 18 points in 2 of 16 cases, in each of two runs. Sleeps of
  whole milliseconds beat against a period of whole milliseconds, and the
  samples keep falling on the same phases of the workload's cycle.

py-spy (a fixed period, at the default priority) misses by 10 to 28 points
in such cases (benchmarks/sampling.py); the current sampler misses 11 of
the 16 cases, by 10 to 76 points.

The 3-point target itself needs more samples than a test can afford at
100 Hz; benchmarks/sampling.py measures it, as medians of longer runs.

Each thread must also get at least MIN_FRACTION of the samples its rate
promises over the time its functions ran, so that a sampler cannot pass by
taking few samples (and a wide tolerance). Durations: 100 Hz runs last 5 s
(about 500 samples per thread), 1 kHz runs 1.5 s (about 1,500), twophase
5 s at both rates; 16 runs and 2 of the ideal sampler, about 65 s on two
cores. Nothing here is a timed assertion: the run's length only bounds the
subprocess (timeout).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import mxprof

HERE = os.path.dirname(os.path.abspath(__file__))
TRUTH = os.path.join(HERE, "sampling", "truth.py")
# Where this process found mxprof (an installed copy, or a built tree): the
# children import the same one, never the source tree's unbuilt mxprof/.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mxprof.__file__)))

SYSTEMATIC = 4.0  # points
Z = 4.0
MIN_FRACTION = 0.25
SECONDS = {100: 5.0, 1000: 1.5}
# The wrong-range race is rare (the current sampler: about one sample in
# 2,000 at 1 kHz), so twophase runs longer, for more phase changes to catch.
TWOPHASE_SECONDS = 5.0

CASES = [  # id, truth.py arguments
    ("mixed-0.5ms", ["mixed", "--burst-ms", "0.5"]),
    ("mixed-3ms", ["mixed", "--burst-ms", "3"]),
    ("queue", ["queue"]),
    ("lock", ["lock"]),
    ("threads", ["threads"]),
    ("asyncio", ["asyncio"]),
    ("short", ["short"]),
    ("twophase", ["twophase"]),
]


def tolerance(p: float, n: int) -> float:
    """Points a share of true value p (in %) may miss by with n samples."""
    q = p / 100.0
    return SYSTEMATIC + Z * 100.0 * math.sqrt(q * (1.0 - q) / max(n, 1))


def record(tmp_path, args: list[str], rate: int, profiler: str = "mxprof") -> dict:
    out = tmp_path / "result.json"
    seconds = TWOPHASE_SECONDS if args[0] == "twophase" else SECONDS[rate]
    cmd = [sys.executable, TRUTH, *args, "--seconds", str(seconds), "--profiler", profiler]
    cmd += ["--rate", str(rate), "--out", str(tmp_path / "trace.json"), "--result", str(out)]
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run(
        cmd,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60 + 10 * seconds,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def misses(result: dict, rate: int) -> list[str]:
    """What is wrong with a result: too few samples, shares out of tolerance."""
    problems = []
    for group, functions in result["groups"].items():
        n = result["samples"][group]
        ran = sum(result["truth"][fn]["wall"] for fn in functions if fn in result["truth"])
        promised = rate * ran
        if n < MIN_FRACTION * promised:
            problems.append(f"{group}: {n} samples, fewer than a quarter of {promised:.0f}")
            continue
        for fn in functions:
            p = result["true_shares"][group][fn]
            got = result["shares"][group][fn]
            tol = tolerance(p, n)
            if abs(got - p) > tol:
                problems.append(
                    f"{group}.{fn}: {got:.1f} % sampled, {p:.1f} % true "
                    f"(off by {abs(got - p):.1f}, tolerance {tol:.1f}, n {n})"
                )
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("rate", [100, 1000], ids=["100Hz", "1kHz"])
@pytest.mark.parametrize(("args"), [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_shares_match_the_truth(tmp_path, args, rate):
    result = record(tmp_path, args, rate)
    problems = misses(result, rate)
    if args[0] == "twophase":
        # Every sample of only_in_a in phase_a, of only_in_b in phase_b.
        problems += [f"{k}: {n} samples" for k, n in result["misattributed"].items()]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize(("args"), [CASES[0][1], CASES[3][1]], ids=[CASES[0][0], CASES[3][0]])
def test_the_ideal_sampler_meets_the_tolerance(tmp_path, args):
    # The harness checks itself: sampled on time, the workloads' shares are
    # their clocks' shares. These two cases are ones a late sampler misses.
    result = record(tmp_path, args, 1000, profiler="oracle")
    if result["oracle_policy"] != "fifo":
        pytest.skip(f"the ideal sampler needs SCHED_FIFO: {result['oracle_policy']}")
    problems = misses(result, 1000)
    assert not problems, "\n".join(problems)


def test_tolerance_follows_the_standard_error():
    # 1/3 with 500 samples: SE 2.1 points; with 1,500: 1.2.
    assert tolerance(100 / 3, 500) == pytest.approx(SYSTEMATIC + Z * 2.108, abs=0.01)
    assert tolerance(100 / 3, 1500) == pytest.approx(SYSTEMATIC + Z * 1.217, abs=0.01)
    assert tolerance(0.0, 10) == SYSTEMATIC


def test_misses_names_each_share_out_of_tolerance():
    result = {
        "groups": {"main": ["f", "g"]},
        "samples": {"main": 1000},
        "truth": {"f": {"wall": 0.5}, "g": {"wall": 0.5}},
        "true_shares": {"main": {"f": 50.0, "g": 50.0}},
        "shares": {"main": {"f": 70.0, "g": 30.0}},
    }
    assert [m.split(":")[0] for m in misses(result, 1000)] == ["main.f", "main.g"]
    result["shares"] = {"main": {"f": 52.0, "g": 48.0}}
    assert misses(result, 1000) == []
    result["samples"] = {"main": 200}  # a quarter of 1,000 is 250
    assert misses(result, 1000) == ["main: 200 samples, fewer than a quarter of 1000"]
