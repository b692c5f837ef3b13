"""Tests that must run in a fresh interpreter, in a pytest of their own.

``mark, run = isolated(__file__, "WHY")``: ``@mark`` on such a test skips it in
the suite's process (with the reason) and ``run(marks)`` is the body of the one
test that runs them all again in a child pytest, bounded, and fails with its
output if any fails there.
"""

import os
import subprocess
import sys

import pytest

CHILD = "MXPROF_ISOLATED_CHILD"


def isolated(path, why):
    here = os.environ.get(CHILD) == os.path.basename(path)
    mark = pytest.mark.skipif(not here, reason=f"{why}: run in a pytest of its own")

    def run(marks):
        if here:
            pytest.skip("this is that pytest")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path,
             "-m", marks, "-k", "not in_a_process_of_its_own"],
            env={**os.environ, CHILD: os.path.basename(path)},
            capture_output=True,
            text=True,
            timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert " passed" in proc.stdout, proc.stdout[-2000:]

    return mark, run
