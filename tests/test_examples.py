"""Every example runs and produces what it promises."""

import os
import subprocess
import sys

import pytest

from mxprof import _testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def run_example(name, tmp_path, *args):
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, name), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_every_example_is_tested():
    tested = {"quickstart.py"}
    assert {f for f in os.listdir(EXAMPLES) if f.endswith(".py")} == tested


def test_quickstart(tmp_path):
    out = run_example("quickstart.py", tmp_path)
    assert "epoch 2: loss" in out
    assert "Profile Statistics:" in out
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln and ln[0].isalpha()}
    for name in ("load_batch", "forward", "backward", "update", "step"):
        assert rows[name][1] == "120", name
    assert rows["epoch_end"][1] == "3"
    trace = _testing.load_trace(tmp_path / "quickstart_trace.json")
    for name, count in (("forward", 120), ("step", 120), ("load_batch", 120)):
        assert len(_testing.events(trace, "X", name)) == count
    assert len(_testing.events(trace, "i", "epoch_end")) == 3
    samples = [e["args"]["bytes_loaded"] for e in _testing.events(trace, "C", "bytes_loaded")]
    assert sorted(samples) == [4096 * i for i in range(1, 121)]
    threads = {e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    assert {"MainThread", "data-loader"} <= threads
    frames = [e["args"]["frame"] for e in _testing.events(trace, "X", "step")]
    assert sorted(frames) == list(range(120))


@pytest.mark.parametrize("path", ["custom.json", "sub/dir.json"])
def test_quickstart_trace_path_argument(tmp_path, path):
    os.makedirs(tmp_path / "sub", exist_ok=True)
    out = run_example("quickstart.py", tmp_path, path)
    assert f"trace written to {path}" in out
    assert _testing.events(_testing.load_trace(tmp_path / path), "X", "forward")
