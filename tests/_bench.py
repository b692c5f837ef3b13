"""Run a benchmark script in its quick mode (which checks that it works, never speed)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quick(script, cwd):
    """``benchmarks/<script> --quick --json`` run in cwd: (stdout, its JSON)."""
    out = os.path.join(str(cwd), "bench.json")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", script), "--quick", "--json", out],
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out, encoding="utf-8") as f:
        return proc.stdout, json.load(f)
