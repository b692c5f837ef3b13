"""The repository's promises: README commands, CI, changelog, benchmarks."""

import os
import re
import subprocess
import sys

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
    assert quick_start_commands()[1] in ci.splitlines()
    assert "native/tests/run.sh asan" in ci


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


def test_benchmarks_quick_mode_prints_a_table():
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["operation", "ns/op", "x", "floor"]
    rows = {ln[:30].strip(): ln[30:].split() for ln in lines[2:]}
    assert "bare cffi call (floor)" in rows and "with task" in rows
    assert rows["bare cffi call (floor)"][1] == "1.00"
    for name, (ns, ratio) in rows.items():
        assert float(ns) > 0 and float(ratio) > 0, name
