"""After os.fork() the child starts clean: no parent events, no stuck locks."""

import asyncio
import os
import signal
import sys
import threading
import time

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


def wait_child(pid, timeout=60.0):
    """The child's exit status; a child still running after timeout is killed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child ran for over {timeout} s")


def ranges_by_track(path):
    """{track name: [names of its complete ranges]} in the trace at path."""
    trace = _testing.load_trace(path)
    names = {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    out = {}
    for e in _testing.events(trace, "X"):
        out.setdefault(names.get(e["tid"], "?"), []).append(e["name"])
    return out


def in_child(check):
    """Run check() in the forked child and leave with its verdict, never returning."""
    code = 1
    try:
        code = 0 if check() else 3
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def test_an_asyncio_tasks_track_records_in_the_child(tmp_path):
    """A track opened before fork() (this asyncio task's) goes on in the child:
    its ranges there are written to the child's trace under the task's name."""
    parent_file, child_file = str(tmp_path / "parent.json"), str(tmp_path / "child.json")
    task = mxprof.Domain("d").new_task("step")
    mxprof.set_config(filename=parent_file, profile_api=False)
    mxprof.set_state("run")

    def child_check():
        mxprof.set_config(filename=child_file)
        mxprof.set_state("run")
        for _ in range(2):
            with task:
                pass
        mxprof.set_state("stop")
        mxprof.dump()
        got = ranges_by_track(child_file)
        print(got, file=sys.stderr)
        return got == {"worker": ["step", "step"]}

    async def worker():
        with task:  # opens this task's track
            pass
        pid = os.fork()
        if pid == 0:
            in_child(child_check)
        with task:
            pass
        return pid

    async def main():
        return await asyncio.create_task(worker(), name="worker")

    pid = asyncio.run(main())
    status = wait_child(pid)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    mxprof.set_state("stop")
    mxprof.dump()
    assert ranges_by_track(parent_file) == {"worker": ["step", "step"]}


def test_the_torch_backward_track_records_in_the_child(tmp_path):
    """The torch adapter's backward track, made by a backward pass before
    fork(), holds the child's backward ranges in the child's trace."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")
    from mxprof.integrations.torch import instrument

    parent_file, child_file = str(tmp_path / "parent.json"), str(tmp_path / "child.json")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    handle = instrument(net)
    x = torch.ones(2, 4)
    track = f"torch backward (MainThread {threading.get_ident():x})"
    try:
        mxprof.set_config(filename=parent_file, profile_api=False)
        mxprof.set_state("run")
        net(x).sum().backward()  # makes this thread's backward track
        mxprof.set_state("stop")

        def child_check():
            mxprof.set_config(filename=child_file)
            mxprof.set_state("run")
            net(x).sum().backward()
            mxprof.set_state("stop")
            mxprof.dump()
            got = ranges_by_track(child_file)
            print(got, file=sys.stderr)
            want = ["model.0.backward", "model.1.backward", "model.backward"]
            return sorted(got.get(track, [])) == want

        pid = os.fork()
        if pid == 0:
            in_child(child_check)
        status = wait_child(pid)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        handle.remove()
