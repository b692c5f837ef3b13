"""Every example runs and produces what it promises."""

import json
import os
import subprocess
import sys

import pytest

import mxprof
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
    tested = {
        "quickstart.py",
        "memory_scopes.py",
        "torch_module_profile.py",
        "parameter_server.py",
    }
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
    # The README's quick start gives the report too, on a default install.
    assert "report written to quickstart_trace.report.html" in out
    page = (tmp_path / "quickstart_trace.report.html").read_text(encoding="utf-8")
    assert "<p>120 steps of <code>step</code>" in page


@pytest.mark.parametrize("path", ["custom.json", "sub/dir.json"])
def test_quickstart_trace_path_argument(tmp_path, path):
    os.makedirs(tmp_path / "sub", exist_ok=True)
    out = run_example("quickstart.py", tmp_path, path)
    assert f"trace written to {path}" in out
    assert _testing.events(_testing.load_trace(tmp_path / path), "X", "forward")


def test_memory_scopes(tmp_path):
    out = run_example("memory_scopes.py", tmp_path)
    peaks = {
        ln.split()[0]: [int(ln.split()[i]) for i in (2, 5, 7)]
        for ln in out.splitlines()
        if ln.startswith("  ")
    }
    # dense0: weights 784*256*4 + 256*4, then at most one step's output (64*256*4) on top.
    assert peaks["model:dense0:"] == [803840 + 65536, 803840, 7]
    assert peaks["model:dense1:"] == [10280 + 2560, 10280, 7]  # 64*10*4 rounds to 2560
    assert peaks["loader:"] == [200704, 0, 5]
    trace = _testing.load_trace(tmp_path / "memory_trace.json")
    gpu = [e["args"]["Memory: gpu/0"] for e in _testing.events(trace, "C", "Memory: gpu/0")]
    assert max(gpu) == 803840 + 10280 + 65536 + 2560 and gpu[-1] == 803840 + 10280
    allocs = [e for e in _testing.events(trace, "i", "alloc") if e["args"]["device"] == "gpu/0"]
    assert len(allocs) == 4 + 5 * 2
    (csv_name,) = [p for p in os.listdir(tmp_path) if p.endswith(".csv")]
    with open(tmp_path / csv_name, encoding="utf-8") as f:
        rows = f.read().splitlines()
    assert rows == [
        '"Attribute Name","Requested Size","Device","Actual Size","Reuse?"',
        '"model:dense0:bias","1024","0","1024","0"',
        '"model:dense0:weight","802816","0","802816","0"',
        '"model:dense1:bias","40","0","40","0"',
        '"model:dense1:weight","10240","0","10240","0"',
    ]


@pytest.mark.slow
def test_torch_module_profile(tmp_path):
    pytest.importorskip("torch", reason="the example needs PyTorch")
    out = run_example("torch_module_profile.py", tmp_path)
    assert "step 4: loss" in out and "trace written to torch_module_trace.json" in out
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("model")}
    for name in ("model", "model.block1.conv", "model.block2.bn", "model.head"):
        assert rows[name][1] == "5", name  # one call per training step
    assert rows["model.head.backward"][1] == "5"
    assert "model.block1.relu.backward" not in rows  # in-place: no backward task
    trace = _testing.load_trace(tmp_path / "torch_module_trace.json")
    assert len(_testing.events(trace, "X", "model.block2.bn")) == 5
    (model,) = _testing.events(trace, "X", "model")[:1]
    conv = _testing.events(trace, "X", "model.block1.conv")[0]
    assert model["ts"] <= conv["ts"] and conv["ts"] + conv["dur"] <= model["ts"] + model["dur"]


def test_parameter_server(tmp_path):
    pytest.importorskip("zmq", reason="the example needs pyzmq (mxprof[dist])")
    out = run_example("parameter_server.py", tmp_path)
    assert "merged timeline written to ps_merged.json" in out
    merged = _testing.load_trace(tmp_path / "ps_merged.json")
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    counts = {}
    for e in _testing.events(merged, "X"):
        key = (names[e["pid"]].split(" (")[0], e["name"])
        counts[key] = counts.get(key, 0) + 1
    for worker in ("worker 0", "worker 1"):
        for task in ("step", "compute", "push", "pull"):
            assert counts[(worker, task)] == 8, (worker, task)
    for server in ("server 0", "server 1"):  # 2 workers x 8 steps each
        assert counts[(server, "apply_push")] == counts[(server, "serve_pull")] == 16
    ranks = merged["distributedInfo"]["ranks"]
    assert [(r["role"], r["rank"]) for r in ranks] == [
        ("worker", 0),
        ("worker", 1),
        ("server", 0),
        ("server", 1),
    ]
    for name in ("rank0_ps_trace.json", "rank1_ps_trace.json", "worker1_ps_trace.json"):
        assert _testing.load_trace(tmp_path / name)["distributedInfo"]["num_servers"] == 2
    # mxprof ranks: push and pull (the "kvstore" domain) are each worker's
    # communication, and the servers are listed.
    proc = _testing.cli("ranks", "--format", "json", "ps_merged.json", cwd=tmp_path, check=True)
    doc = json.loads(proc.stdout)
    assert doc["ranks"] == ["worker 0", "worker 1", "server 0", "server 1"]
    assert doc["servers"] == ["server 0", "server 1"]
    labels = {pid: label.split(" (")[0] for pid, label in names.items()}
    for worker in ("worker 0", "worker 1"):
        kv = sum(
            e["dur"] * 1000
            for e in _testing.events(merged, "X")
            if labels[e["pid"]] == worker and e["cat"] == "kvstore"
        )
        assert doc["per_rank"][worker]["communication"] * 8 == pytest.approx(kv, abs=8000)
    for server in ("server 0", "server 1"):
        assert doc["per_rank"][server]["compute"] > 0
        assert doc["per_rank"][server]["communication"] == 0


def test_quickstart_run_by_the_command_reports_the_scripts_own_file(tmp_path):
    """The script chooses its own filename: the report and the table are of
    its ranges, without the profiler's own (the writer's flush)."""
    pytest.importorskip("plotly")
    proc = _testing.cli("run", os.path.join(EXAMPLES, "quickstart.py"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert "mxprof: trace written to profile.json (no ranges: not in the report)" in lines
    assert "mxprof: trace written to quickstart_trace.json" in lines
    assert "mxprof: report written to quickstart_trace.report.html" in lines
    page = (tmp_path / "quickstart_trace.report.html").read_text(encoding="utf-8")
    ours = ("load_batch", "forward", "backward", "update", "step")
    assert all(f">{name}<" in page for name in ours)
    assert ">flush<" not in page
    table = [ln.split()[0] for ln in lines if ln[:1].isalpha() and " " in ln]
    assert set(ours) <= set(table) and "flush" not in table
    trace = mxprof.load(tmp_path / "quickstart_trace.json")
    assert {r.name for r in trace.key_averages() if r.category == "mxprof"} <= {"flush"}
