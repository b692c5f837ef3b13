"""A profile survives its process: kill -9, SIGTERM, SIGINT, and `mxprof repair`."""

import json
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import mxprof
from mxprof import _testing

WORKER = """
import sys, time, mxprof
path, period = sys.argv[1], float(sys.argv[2])
timing = {"dump_period": period} if period > 0 else {"continuous_dump": False}
mxprof.set_config(filename=path, profile_api=False, **timing)
d = mxprof.Domain("crash")
task, progress = d.new_task("work"), d.new_counter("done", 0)
mxprof.set_state("run")
i = 0
while True:
    for _ in range(50):
        with task:
            i += 1
            progress.set_value(i)
    if period == 0:
        mxprof.dump(finished=False)
    time.sleep(0.0005)  # keep the files small: the test loads them in Python
    # With period 0 the first i samples are on disk when this is printed.
    print("recorded", i, flush=True)
"""


# The longest any one wait on a child may take: generous, so that a loaded
# machine never reaches it, and a child that died or stalls fails the test
# (with its stderr) instead of hanging it.
LIMIT = 120.0


class Child:
    """A child process whose stdout is read line by line with bounded waits."""

    def __init__(self, args):
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._lines = queue.Queue()
        self._err = []
        threading.Thread(target=self._pump, daemon=True).start()
        # stderr drained too: a chatty child never blocks on a full pipe
        threading.Thread(target=lambda: self._err.extend(self.proc.stderr), daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)  # end of output: the child has gone

    def fail(self, why):
        """Kill the child (if still there) and fail with what it wrote to stderr."""
        self.proc.kill()
        self.proc.wait(timeout=LIMIT)
        time.sleep(0.1)  # let the stderr reader take the last of it
        pytest.fail(f"{why}; the child's stderr:\n{''.join(self._err)}")

    def line(self):
        """The next line of its stdout."""
        try:
            line = self._lines.get(timeout=LIMIT)
        except queue.Empty:
            self.fail(f"no output within {LIMIT:g} s")
        if line is None:
            self._lines.put(None)
            self.fail(f"the child ended (status {self.proc.wait(timeout=LIMIT)})")
        return line

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.wait()

    def wait(self):
        """Its exit status, waiting at most LIMIT seconds."""
        try:
            return self.proc.wait(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            self.fail(f"still running {LIMIT:g} s after it should have ended")


def start_worker(tmp_path, path, period):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    return Child([sys.executable, str(script), str(path), str(period)])


def samples(trace):
    return [e.args["done"] for e in trace if e.ph == "C" and e.name == "done"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_kill_9_at_random_moments_keeps_everything_written(tmp_path, name):
    rng = random.Random(7)
    for attempt in range(4):
        path = tmp_path / f"{attempt}-{name}"
        # period 0: the worker writes after every batch, itself, so "recorded n"
        # (printed after the write) means the first n samples are on disk.
        proc = start_worker(tmp_path, path, 0)
        promised = 0
        deadline = time.monotonic() + rng.uniform(0.3, 1.2)
        while time.monotonic() < deadline or promised == 0:
            line = proc.line()
            assert line.startswith("recorded"), line
            promised = int(line.split()[1])
        proc.kill()
        trace = mxprof.load(path)  # whole, or cut mid-write: never an error
        got = samples(trace)
        assert got[: len(got)] == list(range(1, len(got) + 1))  # in order, none missing
        assert len(got) >= promised, (attempt, len(got), promised)
        # repair leaves a valid JSON file with the same events
        fixed = tmp_path / f"{attempt}-fixed.json"
        _testing.cli("repair", path, "-o", fixed, cwd=tmp_path, check=True)
        doc = _testing.load_trace(fixed)
        assert len([e for e in doc["traceEvents"] if e.get("name") == "done"]) == len(got)
        assert "baseTimeNanoseconds" in doc  # written before the events: survives a cut


def test_kill_9_mid_write_leaves_a_clean_prefix(tmp_path):
    """Background writes every 5 ms: a kill lands in the middle of one sooner or later."""
    cut = 0
    for attempt in range(6):
        path = tmp_path / f"bg{attempt}.json"
        proc = start_worker(tmp_path, path, 0.005)
        deadline = time.monotonic() + 0.1 + attempt * 0.05
        # Each line is a batch recorded; the background writer makes the file
        # within its period, so a bounded number of lines sees it (on a loaded
        # machine, later than the deadline).
        give_up = time.monotonic() + LIMIT
        while time.monotonic() < deadline or not path.exists():
            proc.line()
            if time.monotonic() > give_up:
                proc.fail(f"{path.name} not written within {LIMIT:g} s")
        proc.kill()
        trace = mxprof.load(path)
        got = samples(trace)
        assert got == list(range(1, len(got) + 1))
        cut += trace.truncated
        if trace.truncated:
            repaired = tmp_path / f"bg{attempt}-fixed.json"
            _testing.cli("repair", path, "-o", repaired, cwd=tmp_path, check=True)
            json.loads(repaired.read_text())
    # Not asserting cut > 0: whether a kill lands mid-write is up to the scheduler.


def control_run(tmp_path, code):
    script = tmp_path / "control.py"
    script.write_text(textwrap.dedent(code))
    return Child([sys.executable, str(script)])


SIGNAL_SCRIPT = """
import sys, time
{setup}
{body}
"""


@pytest.mark.parametrize("with_mxprof", [False, True])
def test_sigterm_writes_the_trace_and_keeps_the_exit_status(tmp_path, with_mxprof):
    path = tmp_path / "term.json"
    setup = (
        f"import mxprof\n"
        f"mxprof.set_config(filename={str(path)!r}, continuous_dump=False, profile_api=False)\n"
        f"t = mxprof.Domain('sig').new_task('before_signal')\n"
        f"mxprof.set_state('run')\n"
        f"for _ in range(100):\n    t.start(); t.stop()\n"
        if with_mxprof
        else ""
    )
    proc = control_run(
        tmp_path,
        SIGNAL_SCRIPT.format(setup=setup, body="print('ready', flush=True)\ntime.sleep(30)"),
    )
    assert proc.line() == "ready\n"
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait() == -signal.SIGTERM  # as without mxprof
    if with_mxprof:
        trace = _testing.load_trace(path)  # complete JSON
        assert len(_testing.events(trace, "X", "before_signal")) == 100


@pytest.mark.parametrize("with_mxprof", [False, True])
def test_sigint_writes_the_trace_and_still_raises_keyboardinterrupt(tmp_path, with_mxprof):
    path = tmp_path / "int.json"
    setup = (
        f"import mxprof\n"
        f"mxprof.set_config(filename={str(path)!r}, continuous_dump=False, profile_api=False)\n"
        f"t = mxprof.Domain('sig').new_task('before')\n"
        f"after = mxprof.Domain('sig').new_task('after_interrupt')\n"
        f"mxprof.set_state('run')\n"
        f"for _ in range(10):\n    t.start(); t.stop()\n"
        if with_mxprof
        else ""
    )
    body = (
        # "ready" inside the try: a signal right after it must land in the try.
        "try:\n    print('ready', flush=True)\n    time.sleep(30)\n"
        "except KeyboardInterrupt:\n    print('caught', flush=True)\n"
        + ("for _ in range(5):\n    after.start(); after.stop()\n" if with_mxprof else "")
        + "print('recorded', flush=True)\ntime.sleep(30)\n"
    )
    proc = control_run(tmp_path, SIGNAL_SCRIPT.format(setup=setup, body=body))
    assert proc.line() == "ready\n"
    proc.proc.send_signal(signal.SIGINT)
    assert proc.line() == "caught\n"  # KeyboardInterrupt, as before
    if with_mxprof:
        # Written at the first signal, and still profiling after it.
        assert len(_testing.events(_testing.load_trace(path), "X", "before")) == 10
    # The second signal only once the ranges after the first are recorded (on a
    # busy machine the child may not have run them yet when "caught" arrives).
    assert proc.line() == "recorded\n"
    proc.proc.send_signal(signal.SIGINT)  # uncaught this time
    assert proc.wait() == -signal.SIGINT  # Python's own exit status for it
    if with_mxprof:
        trace = _testing.load_trace(path)
        assert len(_testing.events(trace, "X", "after_interrupt")) == 5


def test_signal_handlers_chain_to_a_python_handler(tmp_path):
    path = tmp_path / "chain.json"
    script = f"""
import os, signal, sys, time, mxprof
seen = []
signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
mxprof.set_config(filename={str(path)!r}, continuous_dump=False, profile_api=False)
mxprof.set_state("run")
t = mxprof.Domain("sig").new_task("x")
t.start(); t.stop()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.1)
print("handler ran", seen == [signal.SIGTERM], flush=True)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=LIMIT
    )
    assert proc.returncode == 0, proc.stderr
    assert "handler ran True" in proc.stdout
    assert len(_testing.events(_testing.load_trace(path), "X", "x")) == 1


def test_flush_on_signal_turned_off_later_stops_the_signal_write(tmp_path):
    path = tmp_path / "late.json"
    script = f"""
import os, signal, time, mxprof
seen = []
signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
mxprof.set_config(filename={str(path)!r}, continuous_dump=False, profile_api=False)
mxprof.set_state("run")  # the handler goes in here
t = mxprof.Domain("sig").new_task("x")
t.start(); t.stop()
mxprof.set_config(flush_on_signal=False)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.1)
print(seen == [signal.SIGTERM], os.path.exists({str(path)!r}), flush=True)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=LIMIT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]  # chained, and nothing written
    assert len(_testing.events(_testing.load_trace(path), "X", "x")) == 1  # at exit


def test_flush_on_signal_off_leaves_handlers_alone(tmp_path):
    script = """
import signal, mxprof
mxprof.set_config(flush_on_signal=False, filename="x.json")
mxprof.set_state("run")
term, intr = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
print(term is signal.SIG_DFL, intr is signal.default_int_handler)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=LIMIT
    )
    assert proc.stdout.split() == ["True", "True"], proc.stderr


def test_repair_in_place_and_of_a_complete_file(tmp_path):
    task = mxprof.Domain("d").new_task("t")
    path = tmp_path / "whole.json"
    mxprof.set_config(filename=str(path), profile_api=False, continuous_dump=False)
    mxprof.set_state("run")
    for _ in range(50):
        task.start()
        task.stop()
    mxprof.dump()
    data = path.read_bytes()
    from mxprof.trace.repair import repair

    result = repair(path, tmp_path / "copy.json.gz")
    events = len(_testing.load_trace(path)["traceEvents"])
    assert result == {"events": events, "truncated": False, "problem": None}
    import gzip

    assert json.loads(gzip.decompress((tmp_path / "copy.json.gz").read_bytes())) == json.loads(data)
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) * 2 // 3])
    result = repair(cut)
    assert result["truncated"] is True
    doc = _testing.load_trace(cut)  # now valid JSON, in place
    assert 0 < len(_testing.events(doc, "X", "t")) < 50
    assert doc["otherData"]["repaired"] is True


def test_repair_errors(tmp_path):
    out = _testing.cli("repair", "missing.json", cwd=tmp_path)
    assert out.returncode == 2 and "no such file" in out.stderr
    (tmp_path / "bad.json").write_text("not json")
    out = _testing.cli("repair", "bad.json", cwd=tmp_path)
    assert out.returncode == 2 and "not JSON" in out.stderr


def test_kill_9_perfetto_keeps_every_written_packet(tmp_path):
    pb = pytest.importorskip(
        "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
        reason="decoding Perfetto traces needs the perfetto and protobuf packages",
    )
    from mxprof.trace.repair import repair

    for attempt in range(3):
        path = tmp_path / f"k{attempt}.perfetto-trace"
        proc = start_worker(tmp_path, path, 0)
        promised = 0
        deadline = time.monotonic() + 0.3 + 0.3 * attempt
        while time.monotonic() < deadline or promised == 0:
            promised = int(proc.line().split()[1])
        proc.kill()
        result = repair(path)
        trace = pb.Trace()
        trace.ParseFromString(path.read_bytes())  # whole packets only: always decodes
        assert len(trace.packet) == result["events"]
        values = [
            p.track_event.counter_value
            for p in trace.packet
            if p.HasField("track_event") and p.track_event.type == 4  # COUNTER
        ]
        assert values == list(range(1, len(values) + 1))
        assert len(values) >= promised


def test_a_trace_file_never_exists_empty(tmp_path):
    """The file appears with its beginning written (a temporary file beside
    it takes its name), so a kill right after it appears leaves a trace; the
    kill loops above are what catch an empty file."""
    import os

    path = tmp_path / "fresh.json"
    _testing.start(path)
    mxprof.dump(finished=False)
    assert _testing.load_trace(path)["traceEvents"]
    assert sorted(os.listdir(tmp_path)) == ["fresh.json"]  # no temporary file left
