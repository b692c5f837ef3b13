"""After os.fork() the child starts clean: no parent events, no stuck locks."""

import os
import sys

import pytest

import mxprof
from mxprof import _testing

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_child_records_its_own_events_only(tmp_path):
    parent_file, child_file = str(tmp_path / "parent.json"), str(tmp_path / "child.json")
    task = mxprof.Domain("d").new_task("t")
    mxprof.set_config(
        filename=parent_file, continuous_dump=True, dump_period=0.01, profile_api=False
    )
    mxprof.set_state("run")
    for _ in range(3):
        task.start()
        task.stop()
    pid = os.fork()
    if pid == 0:  # child: exits without running pytest's teardown
        code = 1
        try:
            mxprof.set_config(filename=child_file)
            mxprof.set_state("run")
            for _ in range(2):
                task.start()
                task.stop()
            mxprof.dump()
            trace = _testing.load_trace(child_file)
            ok = len(_testing.events(trace, "X", "t")) == 2
            ok = ok and trace["otherData"]["pid"] == os.getpid()
            code = 0 if ok else 3
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    task.start()
    task.stop()
    mxprof.dump()
    trace = _testing.load_trace(parent_file)
    assert len(_testing.events(trace, "X", "t")) == 4
    assert {e["pid"] for e in _testing.events(trace, "X")} == {os.getpid()}
