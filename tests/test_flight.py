"""The flight recorder: a ring of the last seconds, written as snapshots on demand."""

import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import mxprof
from mxprof import flight
from mxprof._session import SESSION
from mxprof.errors import ConfigError, OutputError

MS = 1_000_000


def names(path):
    return sorted(e.name for e in mxprof.load(path).events if e.ph == "X")


def other(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["otherData"]["flight_recorder"]


def start(**config):
    config = {"filename": "train.json", "flight_recorder_interval": 0, **config}
    mxprof.set_config(profile_api=False, **config)
    mxprof.set_state("run")


def ranges(domain, prefix, n, advance, each_ns=MS):
    for i in range(n):
        t = domain.new_task(f"{prefix}{i}")
        t.start()
        advance(each_ns)
        t.stop()


def test_the_snapshot_holds_the_window_and_nothing_else(clock):
    d = mxprof.Domain("d")
    loss = mxprof.Counter(d, "loss")
    start(flight_recorder=1.0)
    loss.set_value(5)
    ranges(d, "old", 10, clock)
    loss.set_value(7)
    clock(2000 * MS)  # the old ranges leave the window
    ranges(d, "new", 5, clock)
    still_open = d.new_task("open")
    still_open.start()
    clock(3 * MS)
    path = mxprof.trigger("loss is NaN")
    assert path == "train.flight1-loss_is_NaN.json"
    assert os.listdir(".") == [path]  # no trace file besides
    assert names(path) == ["new0", "new1", "new2", "new3", "new4", "open"]
    raw = json.load(open(path))
    (open_event,) = [e for e in raw["traceEvents"] if e.get("name") == "open"]
    assert open_event["args"] == {"cut_short": True}
    assert open_event["dur"] == pytest.approx(3000, abs=1)  # cut at the trigger
    info = raw["otherData"]["flight_recorder"]
    assert info["reason"] == "loss is NaN"
    assert info["end_us"] - info["start_us"] == pytest.approx(1e6, abs=1)
    assert info["trigger_us"] == info["end_us"]
    assert info["shortened_by_cap"] is False
    # The counter's value when the window opened, at its start.
    (c,) = [e for e in raw["traceEvents"] if e.get("ph") == "C"]
    assert c["args"] == {"loss": 7}
    assert c["ts"] == pytest.approx(info["start_us"], abs=1)
    still_open.stop()


def test_statistics_count_everything_the_ring_dropped(clock):
    d = mxprof.Domain("d")
    start(flight_recorder=0.5, aggregate_stats=True)
    ranges(d, "r", 3, clock)
    clock(1000 * MS)
    SESSION.background_flush(threading.Event())  # a trim, as the writer does
    path = mxprof.trigger("now")
    assert names(path) == []
    assert "r0" in mxprof.dumps() and "r2" in mxprof.dumps()


@pytest.mark.parametrize("ext", [".json.gz", ".pftrace"])
def test_snapshots_take_the_trace_files_format(clock, ext):
    d = mxprof.Domain("d")
    start(flight_recorder=5.0, filename=f"run{ext}")
    ranges(d, "r", 4, clock)
    path = mxprof.trigger("fmt")
    assert path == f"run.flight1-fmt{ext}"
    assert names(path) == ["r0", "r1", "r2", "r3"]


def test_a_storm_of_triggers_is_limited_and_counted(clock):
    d = mxprof.Domain("d")
    start(flight_recorder=1.0, flight_recorder_interval=5.0, flight_recorder_max=2)
    ranges(d, "r", 1, clock)
    first = mxprof.trigger("a")
    assert mxprof.trigger("b") is None  # within the interval
    assert mxprof.trigger("c") is None
    clock(6000 * MS)
    open("train.flight2-d.json", "w").close()  # a file is never replaced
    second = mxprof.trigger("d")
    assert second == "train.flight3-d.json"
    assert other(second)["suppressed_triggers"] == 2
    clock(6000 * MS)
    assert mxprof.trigger("e") is None  # flight_recorder_max reached
    assert first == "train.flight1-a.json"
    assert mxprof.flight.counts() == {
        "triggers": 5, "written": 2, "not_recording": 0, "suppressed": 2, "over_max": 1,
        "failed": 0,
    }  # fmt: skip


def test_a_trigger_while_not_recording_is_a_counted_no_op():
    assert mxprof.trigger("nothing") is None
    mxprof.set_config(filename="plain.json")
    mxprof.set_state("run")  # a profile, but no flight recorder
    assert mxprof.trigger("still nothing") is None
    mxprof.set_state("stop")
    assert flight.counts()["not_recording"] == 2
    with pytest.raises(ConfigError, match="reason must be a str"):
        mxprof.trigger(42)


def test_an_unwritable_snapshot_keeps_the_ring_for_the_next(clock, tmp_path):
    d = mxprof.Domain("d")
    start(flight_recorder=10.0, filename=str(tmp_path / "gone" / "t.json"))
    ranges(d, "kept", 3, clock)
    with pytest.raises(OutputError, match="cannot write flight recorder snapshot") as e:
        mxprof.trigger("first")
    assert e.value.filename.endswith("t.flight1-first.json")
    assert e.value.errno == errno.ENOENT
    assert not (tmp_path / "gone").exists()
    mxprof.set_config(filename=str(tmp_path / "t.json"))
    path = mxprof.trigger("second")
    assert names(path) == ["kept0", "kept1", "kept2"]
    assert flight.counts()["failed"] == 1


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("flight_recorder", -1, "flight_recorder must be a number of seconds"),
        ("flight_recorder", "30", "flight_recorder must be a number of seconds"),
        ("flight_recorder", float("nan"), "flight_recorder must be"),
        ("flight_recorder", 10**6, "to 86400"),
        ("flight_recorder_after", -0.5, "flight_recorder_after must be"),
        ("flight_recorder_bytes", 1000, "flight_recorder_bytes must be an int number of bytes"),
        ("flight_recorder_max", -1, "flight_recorder_max must be an int"),
    ],
)
def test_bad_values_name_their_key(key, value, words):
    with pytest.raises(ConfigError, match=words):
        mxprof.set_config(**{key: value})


def test_the_cap_shortens_the_window_and_says_so(clock):
    d = mxprof.Domain("d")
    cap = 1 << 20  # 43,690 records
    start(flight_recorder=100.0, flight_recorder_bytes=cap)
    task = d.new_task("r")
    for _ in range(100_000):  # 2.5 times the cap, 1 us each
        task.start()
        clock(1000)
        task.stop()
    SESSION.background_flush(threading.Event())
    path = mxprof.trigger("capped")
    info = other(path)
    assert info["shortened_by_cap"] is True
    assert info["start_us"] > info["requested_start_us"]
    kept = len(mxprof.load(path).events)
    assert 0 < kept <= cap // 24
    # What is kept is the newest: the window's start says where it begins.
    first = min(e.ts for e in mxprof.load(path).events if e.ph == "X")
    assert first >= info["start_us"] - 1


def test_the_window_after_the_trigger(clock):
    d = mxprof.Domain("d")
    start(flight_recorder=1.0, flight_recorder_after=0.5)
    ranges(d, "before", 2, clock)
    result = {}

    def later():
        result["path"] = mxprof.trigger("after", wait=True)

    waiter = threading.Thread(target=later)
    waiter.start()
    deadline = time.monotonic() + 30
    while not flight.RECORDER.queue and time.monotonic() < deadline:
        time.sleep(0.01)
    ranges(d, "during", 2, clock)
    clock(600 * MS)  # the after-window passes
    ranges(d, "too_late", 1, clock)
    waiter.join(60)
    assert names(result["path"]) == ["before0", "before1", "during0", "during1"]
    assert other(result["path"])["after_seconds"] == 0.5


def test_dump_takes_a_snapshot_and_exit_writes_no_trace(tmp_path):
    script = textwrap.dedent(
        """
        import mxprof
        mxprof.set_config(flight_recorder=30, filename="job.json", profile_api=False)
        mxprof.set_state("run")
        with mxprof.Domain("d").new_task("work"):
            pass
        mxprof.dump()
        with mxprof.Domain("d").new_task("unsaved"):
            pass
        """
    )
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True, timeout=120)
    assert sorted(os.listdir(tmp_path)) == ["job.flight1-dump.json"]
    assert names(str(tmp_path / "job.flight1-dump.json")) == ["work"]
    assert other(str(tmp_path / "job.flight1-dump.json"))["reason"] == "dump()"


def test_a_trigger_from_a_signal_handler_is_queued_and_written(clock):
    d = mxprof.Domain("d")
    start(flight_recorder=5.0)
    ranges(d, "r", 2, clock)
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *_: got.append(mxprof.trigger("sig", wait=False)))
    try:
        signal.raise_signal(signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, old)
    (path,) = got
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert names(path) == ["r0", "r1"]


def test_dump_after_stop_still_snapshots_the_open_profile(clock):
    d = mxprof.Domain("d")
    start(flight_recorder=5.0)
    ranges(d, "r", 2, clock)
    mxprof.set_state("stop")
    assert mxprof.trigger("late") is None  # not recording
    mxprof.dump()
    (path,) = [p for p in os.listdir(".") if "flight" in p]
    assert names(path) == ["r0", "r1"]
    assert other(path)["reason"] == "dump()"


def test_a_snapshot_names_the_threads(clock):
    d = mxprof.Domain("d")
    start(flight_recorder=5.0)
    worker = threading.Thread(target=lambda: ranges(d, "w", 1, clock), name="loader 3")
    worker.start()
    worker.join(60)
    path = mxprof.trigger("names")
    raw = json.load(open(path))
    named = {e["args"]["name"] for e in raw["traceEvents"] if e.get("name") == "thread_name"}
    assert "loader 3" in named
