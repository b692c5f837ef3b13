"""The repository's promises: README commands, CI, changelog, benchmarks."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def quick_start_commands():
    section = read("README.md").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_readme_has_exactly_two_quick_start_commands():
    commands = quick_start_commands()
    assert commands == [
        "pip install . && python examples/quickstart.py",
        'pip install ".[test]" && pytest',
    ]


def test_ci_runs_the_readme_test_command():
    ci = read(".ci", "run")
    lines = ci.splitlines()
    assert quick_start_commands()[1] in lines
    # The README's command leaves the slow tests out; CI runs them too, and the C
    # tests under both sanitizer builds.
    assert "pytest -m slow" in lines
    assert "native/tests/run.sh asan" in lines
    assert "native/tests/run.sh tsan" in lines


def collected(where, *marker):
    """The test ids pytest collects here, with the project's options and -m marker.

    It runs in another directory, so that it imports the installed mxprof, as this
    run does, not the source tree's.
    """
    args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    args += ["--rootdir", ROOT, "-c", os.path.join(ROOT, "pyproject.toml"), *marker]
    out = subprocess.run(
        args + [os.path.join(ROOT, "tests")], cwd=where, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_the_default_run_leaves_out_only_the_slow_tests(tmp_path):
    default, slow = collected(tmp_path), collected(tmp_path, "-m", "slow")
    everything = collected(tmp_path, "-m", "")
    assert "tests/test_fuzz.py::test_fuzz_target_finds_nothing[fuzz_reader.py-corpus]" in slow
    assert "tests/test_repository.py::test_changelog_has_an_unreleased_section" in default
    assert not default & slow and default | slow == everything


def test_changelog_has_an_unreleased_section():
    assert "## [Unreleased]" in read("CHANGELOG.md")


def test_version_is_in_one_place():
    import mxprof

    assert re.search(r'__version__ = "([^"]+)"', read("mxprof", "_version.py")).group(1) == (
        mxprof.__version__
    )
    assert "version=" not in read("pyproject.toml").replace("dynamic", "")


def test_cdef_is_the_headers_marked_region():
    sys.path.insert(0, os.path.join(ROOT, "native"))
    try:
        import build_ffi
    finally:
        sys.path.pop(0)
    cdef = build_ffi.read_cdef()
    assert "int mxp_range_begin(uint32_t id);" in cdef
    assert "#define MXP_OK ..." in cdef  # values come from the compiler


@pytest.mark.slow
def test_benchmarks_quick_mode_runs_and_reports(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--quick", "--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    doc = json.loads(out.read_text())
    base = doc["per_call"]["baselines"]
    assert set(base) >= {"empty loop", "empty with", "floor: no-op cffi call"}
    for mode in ("recording", "aggregate-only", "paused", "stopped"):
        cases = doc["per_call"][f"mxprof, {mode}"]
        assert set(cases) >= {"task.start(); task.stop()", "with task", "counter += 1"}
        assert all(ns > 0 for ns in cases.values())
    if doc["native"] is not None:
        assert doc["native"]["range"]["ns_per_op"] > 0
        assert 20 <= doc["native"]["memory"]["bytes_per_range"] <= 64
    assert doc["bulk"]["events"] == 100_000 and doc["bulk"]["file_bytes"] > 100_000 * 50
    assert {t["what"] for t in doc["targets"]} >= {"with task", "write 10 M events as JSON"}
    # The printed tables: one line per case, the targets last.
    assert "floor: no-op cffi call" in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("dumps() over them")


@pytest.mark.slow
def test_sampling_benchmark_quick_mode_runs_and_reports(tmp_path):
    out = tmp_path / "sampling.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "sampling.py"), "--quick"]
        + ["--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    doc = json.loads(out.read_text())
    cases = {(row["case"], row["rate"]) for row in doc["accuracy"]}
    assert len(cases) == 16 and ("twophase", 1000) in cases
    for row in doc["accuracy"]:
        for group in row["mxprof"].values():
            assert len(group["shares"]) == len(group["truth"]) == len(group["functions"])
    variants = {(r["workload"], r["variant"]) for r in doc["overhead"]}
    assert ("pure-Python loop", "mxprof 1000 Hz") in variants
    # py-spy: its rows, or the reason they are missing.
    assert doc["machine"]["pyspy"] or "py-spy: skipped" in proc.stdout
    assert "| mixed 0.5 ms | 100 | main: py_cpu / c_holds_gil / sleeps |" in proc.stdout


@pytest.mark.parametrize(
    ("script", "args", "needs", "expect"),
    [
        ("torch_adapter.py", ["--calls", "20", "--repeats", "2"], "torch", "forward+backward"),
        ("distributed.py", ["--calls", "4", "--events", "200"], "zmq", "events from 3 processes"),
        ("ranges_elsewhere.py", ["--number", "200", "--repeats", "1"], "asyncio", "asyncio task"),
        (
            "collect.py",
            ["--workers", "2", "--servers", "1", "--events", "1000"],
            "zmq",
            "events from 3 processes",
        ),
        ("collect_scale.py", ["--ranks", "4", "--events", "100"], "zmq", "ranks"),
        ("stats.py", ["--quick"], "msgspec", "load().key_averages()"),
        ("diff_gate.py", ["--quick", "--burners", "0"], "msgspec", "| 1 v 1, same code |"),
        ("ctl.py", ["--quick"], "socket", "target: `where` answers in <= 1 s"),
        ("flight.py", ["--quick"], "msgspec", "ring mode"),
        ("window.py", ["--quick"], "msgspec", "blocks each"),
        ("dataloader.py", ["--quick"], "torch", "instrumented / plain"),
        ("sql.py", ["--quick"], "duckdb", "mxprof.sql(), cached"),
    ],  # fmt: skip
)
def test_standalone_benchmarks_run(tmp_path, script, args, needs, expect):
    pytest.importorskip(needs, reason=f"benchmarks/{script} needs {needs}")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert expect in proc.stdout
