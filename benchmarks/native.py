"""The core's C API timed in C (benchmarks/native/bench_core.c).

The program is compiled from the core's sources with the machine's C
compiler, like the extension (-O2, hidden symbols), and each case runs in a
fresh process; the result is the median over repeats.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASES = ("clock", "range", "fresh", "trace", "aggregate", "stopped", "threads1", "threads2")


def build() -> str | None:
    """Compile bench_core; None (with the reason printed) when there is no compiler."""
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        print(f"native benchmarks skipped: no C compiler ({cc})")
        return None
    src = os.path.join(ROOT, "native", "src")
    out = os.path.join(tempfile.mkdtemp(prefix="mxprof-bench-"), "bench_core")
    sources = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".c"))
    cmd = [cc, "-O2", "-std=c11", "-pthread", "-fvisibility=hidden"]
    cmd += ["-I" + os.path.join(ROOT, "native", "include"), "-I" + src]
    cmd += [os.path.join(HERE, "native", "bench_core.c"), *sources, "-o", out, "-ldl"]  # NVTX
    probe = subprocess.run(
        [cc, "-E", "-"], input="#include <zlib.h>\n", capture_output=True, text=True
    )
    if probe.returncode == 0:
        cmd += ["-DMXPI_HAVE_ZLIB=1", "-lz"]
    subprocess.run(cmd, check=True)
    return out


def run_case(binary: str, case: str, n: int) -> dict[str, float]:
    proc = subprocess.run([binary, case, str(n)], check=True, capture_output=True, text=True)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def measure(n: int, repeats: int) -> dict[str, dict[str, float]] | None:
    """Median ns per range (and events/s) per case, plus bytes per range."""
    binary = build()
    if binary is None:
        return None
    results: dict[str, list[dict[str, float]]] = {c: [] for c in CASES}
    for _ in range(repeats):
        for case in CASES:
            results[case].append(run_case(binary, case, n))
    out = {
        case: {
            "ns_per_op": statistics.median(r["ns_per_op"] for r in runs),
            "per_second": statistics.median(r["per_second"] for r in runs),
        }
        for case, runs in results.items()
    }
    memory = run_case(binary, "memory", n)
    out["memory"] = {"bytes_per_range": memory["bytes_per_range"], "ranges": memory["ranges"]}
    return out
