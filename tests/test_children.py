"""Child processes: a clean core after fork, and follow_children for every kind of child."""

import glob
import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

import mxprof
from mxprof import _testing
from mxprof._children import child_filename

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_child_filename():
    assert child_filename("trace.json", 42) == "trace.42.json"
    assert child_filename("d/run.json.gz", 7) == "d/run.7.json.gz"
    assert child_filename("x.perfetto-trace", 7) == "x.7.perfetto-trace"
    assert child_filename("x.pftrace", 7) == "x.7.pftrace"
    assert child_filename("noext", 7) == "noext.7"


def names(path, ph="X"):
    return sorted(e["name"] for e in _testing.events(_testing.load_trace(path), ph))


def start(path, follow):
    mxprof.set_config(
        filename=str(path), follow_children=follow, profile_api=False, dump_period=0.05
    )
    mxprof.set_state("run")
    return mxprof.Domain("fam")


@pytest.mark.parametrize("follow", [True, False])
def test_os_fork(tmp_path, follow):
    path = tmp_path / "parent.json"
    d = start(path, follow)
    d.new_task("parent_before").start()
    d.new_task("parent_before").stop()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            t = d.new_task("child_work")
            for _ in range(3):
                t.start()
                t.stop()
            if follow:
                mxprof.dump()  # os._exit skips atexit: write before leaving
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    d.new_task("parent_after").start()
    d.new_task("parent_after").stop()
    mxprof.dump()
    assert names(path) == ["parent_after", "parent_before"]
    child = tmp_path / f"parent.{pid}.json"
    if follow:
        assert names(child) == ["child_work"] * 3  # nothing of the parent's
        assert _testing.load_trace(child)["otherData"]["pid"] == pid
    else:
        assert not child.exists()


def mp_work(n):
    t = mxprof.Domain("fam").new_task("mp_work")
    for _ in range(n):
        t.start()
        t.stop()


def test_multiprocessing_fork_children_write_at_exit(tmp_path):
    path = tmp_path / "mp.json"
    start(path, True)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=mp_work, args=(i + 2,)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    mxprof.dump()
    for i, p in enumerate(procs):
        # multiprocessing's fork children leave by os._exit: written by its exit hook
        assert names(tmp_path / f"mp.{p.pid}.json") == ["mp_work"] * (i + 2)


SPAWN_SCRIPT = """
import multiprocessing, os, sys
import mxprof

def work(n):
    t = mxprof.Domain("fam").new_task("spawned")
    for _ in range(n):
        t.start(); t.stop()

if __name__ == "__main__":
    mxprof.set_config(filename=sys.argv[1], follow_children=True, profile_api=False)
    mxprof.set_state("run")
    main = mxprof.Domain("fam").new_task("parent")
    main.start()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=work, args=(3,)) for _ in range(2)]
    for p in procs: p.start()
    for p in procs: p.join()
    main.stop()
    print(" ".join(str(p.pid) for p in procs))
"""


def test_multiprocessing_spawn_children_and_merge(tmp_path):
    script = tmp_path / "spawner.py"
    script.write_text(textwrap.dedent(SPAWN_SCRIPT))
    proc = subprocess.run(
        [sys.executable, str(script), "job.json"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    pids = [int(p) for p in proc.stdout.split()]
    files = [tmp_path / f"job.{pid}.json" for pid in pids]
    for f in files:
        assert names(f) == ["spawned"] * 3
    assert names(tmp_path / "job.json") == ["parent"]
    merged = tmp_path / "all.json"
    _testing.cli("merge", "job.json", *files, "-o", merged, cwd=tmp_path, check=True)
    trace = _testing.load_trace(merged)
    xs = _testing.events(trace, "X")
    assert sorted(e["name"] for e in xs) == ["parent"] + ["spawned"] * 6
    assert len({e["pid"] for e in xs}) == 3  # one process track per process
    (parent,) = [e for e in xs if e["name"] == "parent"]
    for e in xs:  # on one wall-clock timeline: the children ran inside the parent's range
        if e["name"] == "spawned":
            assert parent["ts"] <= e["ts"] <= parent["ts"] + parent["dur"]


def test_cli_follow_children(tmp_path):
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys
            code = "import mxprof; t = mxprof.Domain('fam').new_task('sub'); t.start(); t.stop()"
            print(subprocess.run([sys.executable, "-c", code]).returncode)
            """
        )
    )
    proc = _testing.cli("run", "--follow-children", "-o", "app.json", "app.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    children = glob.glob(str(tmp_path / "app.*.json"))
    assert len(children) == 1
    assert names(children[0]) == ["sub"]


def test_children_started_after_the_profile_ends_do_not_profile(tmp_path):
    start(tmp_path / "p.json", True)
    mxprof.dump()  # the profile ends
    code = "import mxprof, os; print(mxprof._session.SESSION.profile_open)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip() == "False"
    assert "MXPROF_FOLLOW_CHILDREN" not in os.environ
