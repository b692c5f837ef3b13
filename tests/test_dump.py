"""dump(), continuous dump and reconfiguration: files are always complete JSON."""

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import mxprof
from mxprof import _testing
from mxprof._session import SESSION
from mxprof._testing import count, run_ranges


def task(name="t"):
    return mxprof.Domain("d").new_task(name)


def test_dump_not_finished_keeps_recording_and_file_valid(trace_file):
    t = task()
    mxprof.set_config(filename=trace_file, continuous_dump=False, profile_api=False)
    mxprof.set_state("run")
    for expected in (3, 6, 9):
        run_ranges(t, 3)
        mxprof.dump(finished=False)
        assert count(trace_file) == expected  # everything so far, no duplicates
    mxprof.dump()
    assert count(trace_file) == 9


def test_repeated_dumps_never_corrupt(trace_file):
    t = task()
    mxprof.set_config(filename=trace_file, profile_api=False)
    mxprof.set_state("run")
    run_ranges(t, 2)
    for _ in range(5):
        mxprof.dump(finished=False)
    mxprof.dump(True)
    mxprof.dump(True)  # after finished: does nothing
    mxprof.dump(False)
    assert count(trace_file) == 2


def test_finished_ends_output_until_next_run(trace_file, tmp_path):
    t = task()
    mxprof.set_config(filename=trace_file, profile_api=False)
    mxprof.set_state("run")
    run_ranges(t, 2)
    mxprof.dump(finished=True)
    run_ranges(t, 5)  # still 'run': these go to a continuation file, not nowhere
    with pytest.warns(RuntimeWarning, match="trace-1.json"):
        mxprof.dump()
    assert count(trace_file) == 2
    assert count(str(tmp_path / "trace-1.json")) == 5
    before = _testing.load_trace(trace_file)["baseTimeNanoseconds"]
    time.sleep(0.01)
    mxprof.set_state("run")  # a new profile rewrites the file
    run_ranges(t, 1)
    mxprof.dump()
    trace = _testing.load_trace(trace_file)
    assert len(_testing.events(trace, "X", "t")) == 1
    assert trace["baseTimeNanoseconds"] > before


def test_stop_then_run_continues_the_same_profile(trace_file):
    t = task()
    mxprof.set_config(filename=trace_file, profile_api=False)
    mxprof.set_state("run")
    run_ranges(t, 2)
    mxprof.set_state("stop")
    mxprof.set_state("run")
    run_ranges(t, 3)
    mxprof.dump()
    assert count(trace_file) == 5


def test_continuous_dump_file_is_valid_after_every_period(trace_file):
    t = task()
    mxprof.set_config(filename=trace_file, dump_period=0.05, profile_api=False)
    mxprof.set_state("run")
    seen = []
    deadline = time.monotonic() + 20
    torn_since = None  # a read that did not parse: the writer was mid-flush
    while len(seen) < 4 and time.monotonic() < deadline:
        run_ranges(t, 10)
        time.sleep(0.02)
        if os.path.exists(trace_file):
            # A flush cuts the old tail, then appends events and a new tail
            # (so a crash leaves a clean prefix): a read inside that moment
            # sees a cut file. Between flushes the file must parse.
            try:
                with open(trace_file) as f:
                    n = len(_testing.events(json.load(f), "X", "t"))
            except json.JSONDecodeError:
                torn_since = torn_since or time.monotonic()
                assert time.monotonic() - torn_since < 5, "the file stayed invalid"
                continue
            torn_since = None
            if not seen or n > seen[-1]:
                seen.append(n)
    assert len(seen) >= 4, seen
    assert seen == sorted(seen)
    mxprof.set_state("stop")
    mxprof.dump()
    assert count(trace_file) >= seen[-1]


def test_background_writes_record_their_own_cost(trace_file):
    mxprof.set_config(filename=trace_file, dump_period=0.02, aggregate_stats=True)
    mxprof.set_state("run")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats = json.loads(mxprof.dumps(format="json"))
        if stats["Time"].get("mxprof", {}).get("flush", {}).get("Count", 0) >= 2:
            break
        time.sleep(0.02)
    mxprof.dump()
    trace = _testing.load_trace(trace_file)
    flushes = _testing.events(trace, "X", "flush")
    assert flushes and {e["cat"] for e in flushes} == {"mxprof"}
    names = {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    assert {names[e["tid"]] for e in flushes} <= {"mxprof-flush", "MainThread"}


def test_profile_api_off_hides_the_flush_task(trace_file):
    mxprof.set_config(filename=trace_file, profile_api=False, aggregate_stats=True)
    mxprof.set_state("run")
    mxprof.dump(finished=False)
    mxprof.dump()
    assert "mxprof" not in json.loads(mxprof.dumps(format="json"))["Time"]


def test_set_config_again_same_or_new_file_while_running(tmp_path):
    t = task()
    first, second = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    mxprof.set_config(filename=first, profile_api=False)
    mxprof.set_state("run")
    run_ranges(t, 2)
    mxprof.set_config(filename=first)  # same name: nothing changes
    mxprof.set_config(filename=first, aggregate_stats=True)
    run_ranges(t, 1)
    mxprof.dump(finished=False)
    assert count(first) == 3
    mxprof.set_config(filename=second)  # completes a.json
    run_ranges(t, 4)
    mxprof.set_config(filename=second)
    mxprof.dump()
    assert count(first) == 3
    assert count(second) == 4
    a, b = _testing.load_trace(first), _testing.load_trace(second)
    assert a["baseTimeNanoseconds"] == b["baseTimeNanoseconds"]  # one profile, one ts 0


def test_filename_switch_before_any_write_goes_to_the_old_file(tmp_path):
    t = task()
    first, second = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    mxprof.set_config(filename=first, continuous_dump=False, profile_api=False)
    mxprof.set_state("run")
    run_ranges(t, 2)
    mxprof.set_config(filename=second)  # a.json is created and completed now
    run_ranges(t, 1)
    mxprof.dump()
    assert (count(first), count(second)) == (2, 1)


def test_set_config_while_stopped_between_profiles(tmp_path):
    t = task()
    paths = [str(tmp_path / f"{i}.json") for i in range(3)]
    for i, p in enumerate(paths):
        mxprof.set_config(filename=p, profile_api=False)
        mxprof.set_state("run")
        run_ranges(t, i + 1)
        mxprof.set_state("stop")
        mxprof.dump()
    assert [count(p) for p in paths] == [1, 2, 3]


def test_unwritable_path_errors_and_keeps_events(tmp_path):
    t = task()
    bad = str(tmp_path / "no" / "such" / "dir" / "trace.json")
    good = str(tmp_path / "good.json")
    mxprof.set_config(filename=bad, continuous_dump=False, profile_api=False)
    mxprof.set_state("run")
    run_ranges(t, 3)
    with pytest.raises(mxprof.OutputError) as e:
        mxprof.dump(finished=False)
    assert bad in str(e.value) and e.value.filename == bad
    assert "ENOENT" in str(e.value)
    with pytest.raises(mxprof.OutputError):
        mxprof.dump()  # finished=True fails too: the profile stays open
    run_ranges(t, 2)
    with pytest.warns(RuntimeWarning, match="ENOENT.*good.json") as w:
        mxprof.set_config(filename=good)
    assert w[0].filename == __file__  # attributed to the caller, not to mxprof
    mxprof.dump()
    assert count(good) == 5


def failing_background_write(tmp_path):
    """A profile whose background writes failed; the writer is then stopped."""
    bad = str(tmp_path / "missing" / "trace.json")
    mxprof.set_config(filename=bad, dump_period=0.01, profile_api=False)
    mxprof.set_state("run")
    run_ranges(task(), 3)
    deadline = time.monotonic() + 20
    while SESSION.pending is None and time.monotonic() < deadline:
        time.sleep(0.01)
    mxprof.set_config(continuous_dump=False)
    assert SESSION.pending is not None and bad in str(SESSION.pending)
    return bad


def test_failed_background_write_is_raised_by_dump(tmp_path):
    bad = failing_background_write(tmp_path)
    with pytest.raises(mxprof.OutputError, match="missing"):
        mxprof.dump()
    os.makedirs(os.path.dirname(bad))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once, not again
        mxprof.dump()
    assert count(bad) == 3


def test_dump_that_recovers_warns_about_the_earlier_failure(tmp_path):
    bad = failing_background_write(tmp_path)
    os.makedirs(os.path.dirname(bad))
    with pytest.warns(RuntimeWarning, match="earlier background write failed.*wrote everything"):
        mxprof.dump()
    assert count(bad) == 3


def test_switching_away_from_a_failed_path_warns(tmp_path):
    t = task()
    bad = str(tmp_path / "missing" / "trace.json")
    good = str(tmp_path / "good.json")
    mxprof.set_config(filename=bad, dump_period=0.01, profile_api=False)
    mxprof.set_state("run")
    run_ranges(t, 3)
    deadline = time.monotonic() + 20
    while SESSION.pending is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.warns(RuntimeWarning, match="good.json"):
        mxprof.set_config(filename=good)
    mxprof.dump()
    assert count(good) == 3


EXIT_SCRIPT = """
import mxprof, sys
mxprof.set_config(filename={path!r}, continuous_dump={cont}, profile_api=False)
task = mxprof.Domain("d").new_task("t")
mxprof.set_state("run")
for _ in range(7):
    task.start(); task.stop()
{tail}
"""


@pytest.mark.parametrize(
    "cont, tail, code",
    [
        (True, "", 0),
        (False, "", 0),
        (True, "sys.exit(3)", 3),
        (False, "raise RuntimeError('unhandled')", 1),
        (True, "mxprof.set_state('stop')", 0),
    ],
)
def test_interpreter_exit_dumps(tmp_path, cont, tail, code):
    path = str(tmp_path / "exit.json")
    script = EXIT_SCRIPT.format(path=path, cont=cont, tail=tail)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True)
    assert proc.returncode == code, proc.stderr
    assert count(path) == 7


def test_exit_after_finished_dump_leaves_file_alone(tmp_path):
    path = str(tmp_path / "exit.json")
    script = EXIT_SCRIPT.format(path=path, cont=True, tail="mxprof.dump()\nmxprof.set_state('run')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    # The second run began a new, empty profile, which exit completes; nothing
    # was recorded between the two, so there is no continuation file.
    assert count(path) == 0
    assert _testing.load_trace(path)["traceEvents"]
    assert sorted(os.listdir(tmp_path)) == ["exit.json"]


def test_exit_with_unwritable_path_warns_not_crashes(tmp_path):
    path = str(tmp_path / "nope" / "exit.json")
    script = EXIT_SCRIPT.format(path=path, cont=False, tail="")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0
    assert "trace not written at exit" in proc.stderr and "nope" in proc.stderr
