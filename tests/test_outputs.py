"""Trace paths that are not plain files, and files that go away while written.

A FIFO must never make a write wait (a reader may never come, and a signal
must still end the process); a file removed or replaced under the profiler
must fail the write, keeping the events for a path that works.
"""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import mxprof
from mxprof._native import lib
from mxprof._testing import count, run_ranges

# Bounded waits for child processes: far above what they need, so that only
# a hang reaches them.
CHILD_TIMEOUT = 60


def task(name="t"):
    return mxprof.Domain("d").new_task(name)


def start(path):
    mxprof.set_config(filename=str(path), continuous_dump=False, profile_api=False)
    mxprof.set_state("run")


# ---- pipes ----

FIFO_DUMP = """
import errno, mxprof
mxprof.set_config(filename={fifo!r}, continuous_dump=False, profile_api=False)
t = mxprof.Domain("d").new_task("t")
mxprof.set_state("run")
for _ in range(3):
    t.start(); t.stop()
try:
    mxprof.dump(finished=False)
except mxprof.OutputError as e:
    print("refused", errno.errorcode[e.errno], e.filename == {fifo!r}, "pipe" in str(e))
mxprof.set_config(filename={good!r})
mxprof.dump()
"""


def test_fifo_path_is_refused_at_once_and_the_events_kept(tmp_path):
    fifo, good = str(tmp_path / "fifo.json"), str(tmp_path / "good.json")
    os.mkfifo(fifo)
    script = FIFO_DUMP.format(fifo=fifo, good=good)
    # Before the fix, dump() waited in open() for a reader that never came.
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=CHILD_TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["refused", "ESPIPE", "True", "True"]
    assert count(good) == 3


FIFO_SIGNAL = """
import os, sys, time, mxprof
from mxprof._session import SESSION
mxprof.set_config(filename={fifo!r}, dump_period=0.01, profile_api=False)
t = mxprof.Domain("d").new_task("t")
mxprof.set_state("run")
t.start(); t.stop()
deadline = time.monotonic() + 20
while SESSION.pending is None and time.monotonic() < deadline:
    time.sleep(0.01)
with open({ready!r} + ".part", "w") as f:
    f.write(str(SESSION.pending.errno if SESSION.pending else None))
os.rename({ready!r} + ".part", {ready!r})
time.sleep({timeout})
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_a_process_whose_trace_path_is_a_fifo(tmp_path, signum):
    fifo, ready = str(tmp_path / "fifo.json"), str(tmp_path / "ready")
    os.mkfifo(fifo)
    script = FIFO_SIGNAL.format(fifo=fifo, ready=ready, timeout=CHILD_TIMEOUT)
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT
        while not os.path.exists(ready) and child.poll() is None:
            assert time.monotonic() < deadline, "the child never got ready"
            time.sleep(0.02)
        with open(ready) as f:
            pending = f.read()
        child.send_signal(signum)
        # Before the fix the handler's write waited behind the background one,
        # blocked in open(), and the process never ended.
        child.wait(timeout=CHILD_TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        stderr = child.stderr.read().decode()
        child.stderr.close()
    assert child.returncode == -signum, stderr
    assert pending == str(errno.ESPIPE)  # the background write failed at once


def test_dev_null_still_takes_the_trace():
    t = task()
    start(os.devnull)
    run_ranges(t, 5)
    mxprof.dump(finished=False)
    assert lib.mxp_trace_pending() == 0  # every event was written, none kept back
    run_ranges(t, 5)
    mxprof.dump()
    assert lib.mxp_trace_pending() == 0


# ---- files that go away ----


def test_removed_directory_fails_the_write_and_keeps_the_events(tmp_path):
    t = task()
    folder = tmp_path / "out"
    folder.mkdir()
    path, good = str(folder / "trace.json"), str(tmp_path / "good.json")
    start(path)
    run_ranges(t, 10)
    mxprof.dump(finished=False)
    assert count(path) == 10
    shutil.rmtree(folder)
    run_ranges(t, 200)
    with pytest.raises(mxprof.OutputError) as e:
        mxprof.dump(finished=False)
    assert e.value.filename == path and path in str(e.value)
    assert e.value.errno == errno.ESTALE and "removed" in str(e.value)
    # The folder is still missing: the write before the switch fails too.
    with pytest.warns(RuntimeWarning, match="ENOENT.*good.json"):
        mxprof.set_config(filename=good)
    mxprof.dump()
    assert count(good) == 200  # before the fix: 0, all written to the removed file


def test_removed_directory_is_reported_by_a_background_write(tmp_path):
    from mxprof._session import SESSION

    t = task()
    folder = tmp_path / "out"
    folder.mkdir()
    path = str(folder / "trace.json")
    start(path)
    run_ranges(t, 10)
    mxprof.dump(finished=False)
    shutil.rmtree(folder)
    mxprof.set_config(continuous_dump=True, dump_period=0.01)
    run_ranges(t, 20)
    deadline = time.monotonic() + 20
    while SESSION.pending is None and time.monotonic() < deadline:
        time.sleep(0.01)
    mxprof.set_config(continuous_dump=False)
    assert SESSION.pending is not None and SESSION.pending.filename == path
    with pytest.raises(mxprof.OutputError) as e:
        mxprof.dump(finished=False)
    assert e.value.filename == path
    folder.mkdir()
    mxprof.dump()
    # The file made anew has every event that was not in the removed one.
    assert count(path) == 20


@pytest.mark.parametrize("how", ["unlink", "replace"])
def test_file_removed_or_replaced_is_made_anew_at_its_path(tmp_path, how):
    t = task()
    path = str(tmp_path / "trace.json")
    start(path)
    run_ranges(t, 10)
    mxprof.dump(finished=False)
    if how == "unlink":
        os.unlink(path)
    else:
        other = tmp_path / "other.json"
        other.write_text("{}")
        os.replace(other, path)
    run_ranges(t, 7)
    with pytest.raises(mxprof.OutputError) as e:
        mxprof.dump(finished=False)
    assert e.value.filename == path and e.value.errno == errno.ESTALE
    run_ranges(t, 3)
    mxprof.dump()
    assert count(path) == 10  # the 7 and 3 recorded since; the first 10 went with the old file


def test_changing_directory_is_not_taken_for_a_removal(tmp_path, monkeypatch):
    t = task()
    start("trace.json")  # relative: to the directory at the file's creation
    run_ranges(t, 4)
    mxprof.dump(finished=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run_ranges(t, 6)
    mxprof.dump()
    assert count(tmp_path / "trace.json") == 10
    assert os.listdir(elsewhere) == []
