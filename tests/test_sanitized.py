"""The compiled core under UndefinedBehaviorSanitizer, driven from Python.

native/tests/run.sh runs the core's C tests under ASan+UBSan; this runs the
Python entry points (the cffi module itself, built with
``MXPROF_SANITIZE=undefined``) so that undefined behaviour reached only
through Python's calls fails a test too. The first report ends the process
(``-fno-sanitize-recover``), so a passing run had none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# The files whose tests reach the core's memory, range, counter, statistics and
# writer entry points; a subset keeps the run to about a minute.
TESTS = [
    "test_memory.py",
    "test_memory_values.py",
    "test_memory_attribution.py",
    "test_ranges.py",
    "test_counter_values.py",
    "test_dumps.py",
    "test_trace_file.py",
]


def _build(tmp: Path) -> Path:
    """A copy of the package, its core built under UBSan; returns its parent."""
    # cffi builds relative to the current directory: give it the layout it expects.
    shutil.copytree(REPO / "native", tmp / "native", ignore=shutil.ignore_patterns("build"))
    with tarfile.open(tmp / "pkg.tar", "w") as tar:
        tar.add(
            REPO / "mxprof",
            arcname="mxprof",
            filter=lambda t: None if t.name.endswith(".so") or "__pycache__" in t.name else t,
        )
    with tarfile.open(tmp / "pkg.tar") as tar:
        tar.extractall(tmp)
    env = {**os.environ, "MXPROF_SANITIZE": "undefined"}
    script = "import sys; sys.path.insert(0, 'native'); import build_ffi; "
    script += "build_ffi.ffibuilder.compile(tmpdir='.')"
    built = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    return tmp


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory):
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("needs a C compiler (gcc) to build the core under UBSan")
    if not (REPO / "native" / "build_ffi.py").exists():
        pytest.skip("needs the source tree's native/ (run from a checkout)")
    return _build(tmp_path_factory.mktemp("ubsan"))


def _env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(root),
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }


def test_memory_usage_with_no_scopes_is_defined(sanitized):
    # mxp_memory_usage copied zero bytes from a NULL scope table: a report here.
    code = "import mxprof._native as n, mxprof.memory as m; print(n.__file__); print(m.usage())"
    run = subprocess.run(
        [sys.executable, "-c", code], env=_env(sanitized), capture_output=True, text=True,
        timeout=120, cwd=sanitized,
    )  # fmt: skip
    assert "runtime error" not in run.stderr, run.stderr
    assert run.returncode == 0, run.stderr
    first, second = run.stdout.splitlines()[:2]
    assert first.startswith(str(sanitized))  # the sanitized copy ran, not an installed one
    assert second == "[]"


def test_the_core_entry_points_run_clean_under_ubsan(sanitized):
    # Run from the sanitized copy: `python -m` puts the current directory first on
    # the path, and a checkout's own mxprof/ (without the core) must not win.
    args = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    args += ["--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml")]
    args += [str(REPO / "tests" / name) for name in TESTS]
    run = subprocess.run(
        args, env=_env(sanitized), capture_output=True, text=True, timeout=900, cwd=sanitized
    )
    out = run.stdout + run.stderr
    assert "runtime error" not in out, out[-5000:]
    assert run.returncode == 0, out[-5000:]
    assert " passed" in out
