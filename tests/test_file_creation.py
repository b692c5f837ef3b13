"""A trace file never exists empty, even when its first write fails or the
process dies right after creating it."""

import os
import subprocess
import sys
import textwrap

from mxprof import _testing

SCRIPT = """
import os, resource, signal, sys, mxprof
path = sys.argv[1]
mxprof.set_config(filename=path, continuous_dump=False, profile_api=False)
mxprof.set_state("run")
t = mxprof.Domain("d").new_task("t")
for _ in range(10):
    t.start(); t.stop()
# Nothing can be written from here on: a file may be created, but every write
# fails (EFBIG), as on a disk that fills at the worst moment.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    mxprof.dump(finished=False)
except mxprof.OutputError as e:
    print("refused:", e, flush=True)
print("exists" if os.path.exists(path) else "absent", flush=True)
"""


def run(tmp_path, path):
    script = tmp_path / "efbig.py"
    script.write_text(textwrap.dedent(SCRIPT))
    return subprocess.run(
        [sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=60
    )


def test_a_first_write_that_fails_leaves_no_empty_file(tmp_path):
    path = tmp_path / "t.json"
    proc = run(tmp_path, path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("refused:") and "t.json" in lines[0]
    assert lines[1] == "absent"  # not an empty file that load and repair refuse
    assert sorted(os.listdir(tmp_path)) == ["efbig.py"]  # nor a temporary one


def test_a_first_write_that_fails_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "t.json"
    _testing.start(path)
    _testing.finish(path)
    before = path.read_bytes()
    proc = run(tmp_path, path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1] == "exists"
    assert path.read_bytes() == before  # the last complete trace, still loadable
