"""Run the pure-C tests of the core (native/tests) from the test suite."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "native", "tests", "run.sh")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None, reason="no C compiler")
def test_native_core_tests_pass():
    proc = subprocess.run(["bash", RUN, "plain"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "native core tests passed" in proc.stdout
