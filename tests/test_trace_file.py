"""The Chrome trace file: layout, metadata, escaping, ids, the event cap."""

import gzip
import json
import os
import sys
import threading
import time

import pytest

import mxprof
from mxprof import _testing


def record(trace_file, body, **kw):
    mxprof.set_config(filename=trace_file, profile_api=False, **kw)
    mxprof.set_state("run")
    body()
    mxprof.set_state("stop")
    mxprof.dump()
    return _testing.load_trace(trace_file)


def test_object_form_and_top_level_keys(trace_file):
    task = mxprof.Domain("d").new_task("t")
    wall_before = time.time_ns()
    trace = record(trace_file, lambda: (task.start(), task.stop()))
    assert set(trace) >= {"traceEvents", "displayTimeUnit", "baseTimeNanoseconds", "otherData"}
    assert trace["displayTimeUnit"] == "ms"
    assert wall_before - 10**9 <= trace["baseTimeNanoseconds"] <= time.time_ns()
    other = trace["otherData"]
    assert other["mxprof_version"] == mxprof.__version__
    assert other["pid"] == os.getpid()
    assert other["host"]
    assert other["dropped_events"] == 0


def test_real_pid_small_tids_and_names(trace_file):
    task = mxprof.Domain("d").new_task("t")

    def body():
        task.start()
        task.stop()
        worker = threading.Thread(target=lambda: (task.start(), task.stop()), name="loader-0")
        worker.start()
        worker.join()

    trace = record(trace_file, body)
    xs = _testing.events(trace, "X", "t")
    assert {e["pid"] for e in xs} == {os.getpid()}
    tids = sorted({e["tid"] for e in xs})
    assert len(tids) == 2 and all(0 < t < 1000 for t in tids)
    names = {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    assert sorted(names.values()) == ["MainThread", "loader-0"]
    assert set(names) == set(tids)
    procs = _testing.events(trace, "M", "process_name")  # in the head and the trailer
    assert {(p["pid"], p["args"]["name"]) for p in procs} == {
        (os.getpid(), procs[0]["args"]["name"])
    }
    assert procs[0]["args"]["name"]


def test_thread_renamed_before_dump_shows_new_name(trace_file):
    task = mxprof.Domain("d").new_task("t")
    started, go = threading.Event(), threading.Event()

    def work():
        task.start()
        task.stop()
        started.set()
        go.wait()

    def body():
        t = threading.Thread(target=work, name="before")
        t.start()
        started.wait()
        t.name = "after"
        mxprof.dump(finished=False)
        go.set()
        t.join()

    trace = record(trace_file, body)
    names = {e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    assert "after" in names and "before" not in names


NASTY = [
    'quote"inside',
    "back\\slash",
    "new\nline and\ttab\r",
    "emoji 🚀🧠 and ünïcödé 漢字",
    "control \x00\x01\x1f\x7f",
    "\u2028\u2029",
    "x" * 10_000,
]


def test_names_round_trip_through_the_trace(trace_file):
    objs = []
    for i, name in enumerate(NASTY):
        d = mxprof.Domain(f"dom {name}")
        objs.append((d.new_task(name), d.new_counter(name), d.new_marker(name), i))

    def body():
        for task, counter, marker, i in objs:
            task.start()
            task.stop()
            counter.set_value(i)
            marker.mark()

    trace = record(trace_file, body)
    for kind, ph in (("task", "X"), ("counter", "C"), ("marker", "i")):
        got = [(e["name"], e["cat"]) for e in _testing.events(trace, ph)]
        assert got == [(n, f"dom {n}") for n in NASTY], kind
    args = [e["args"] for e in _testing.events(trace, "C")]
    assert args == [{n: i} for i, n in enumerate(NASTY)]


# Backslashes in every position a reader can trip on: last, alone, doubled,
# before a quote, before a letter that makes an escape.
BACKSLASHES = ["end\\", "\\", "two\\\\", 'bs\\"q', '\\"', "mid\\dle", "\\n", "c:\\dir\\"]


def string_ends(text, strict):
    """Where each JSON string of text ends. strict=False scans like Perfetto v52's
    JSON importer: a quote right after a backslash never ends a string."""
    ends, i, n = [], 0, len(text)
    while i < n:
        if text[i] == '"':
            i += 1
            while i < n and (text[i] != '"' or (not strict and text[i - 1] == "\\")):
                i += 2 if strict and text[i] == "\\" else 1
            ends.append(i)
        i += 1
    return ends


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_backslashes_in_names_are_read_back_by_any_reader(tmp_path, monkeypatch, suffix):
    monkeypatch.setattr(sys, "argv", ["/bin/tool\\"])  # the process name
    path = tmp_path / ("trace" + suffix)
    objs = []
    for name in BACKSLASHES:
        d = mxprof.Domain(name + "dom\\")
        objs.append((d.new_task(name), d.new_counter(name), d.new_marker(name)))

    def work():
        for task, counter, marker in objs:
            with task:
                counter.set_value(1)
            for scope in ("global", "process", "thread", "task", "marker"):
                marker.mark(scope)

    mxprof.set_config(filename=os.fspath(path), profile_api=False)
    mxprof.set_state("run")
    t = threading.Thread(target=work, name="worker\\")
    t.start()
    t.join()
    mxprof.set_state("stop")
    mxprof.dump()

    raw = path.read_bytes()
    text = (gzip.decompress(raw) if suffix.endswith(".gz") else raw).decode()
    # A backslash is never written as \\, so a quote after a backslash is always
    # an escaped one and a reader scanning that way finds the same strings.
    assert "\\\\" not in text
    assert '"name":"end\\u005c"' in text
    assert string_ends(text, strict=False) == string_ends(text, strict=True)

    doc = json.loads(text)
    trace = mxprof.load(path)
    for events in (_testing.events(doc, "X"), [e for e in trace if e.ph == "X"]):
        got = [
            (e["name"], e["cat"]) if isinstance(e, dict) else (e.name, e.category) for e in events
        ]
        assert got == [(n, n + "dom\\") for n in BACKSLASHES]
    assert [e["args"] for e in _testing.events(doc, "C")] == [{n: 1} for n in BACKSLASHES]
    marks = [(e["name"], e["s"], e["args"]["scope"]) for e in _testing.events(doc, "i")]
    assert marks == [
        (n, s, scope)
        for n in BACKSLASHES
        for s, scope in zip("gpttt", ("global", "process", "thread", "task", "marker"))
    ]
    assert "worker\\" in trace.thread_names.values()
    assert set(trace.process_names.values()) == {"tool\\"}


def test_thread_name_escaping(trace_file):
    task = mxprof.Domain("d").new_task("t")
    weird = 'th"read\n🚀'

    def body():
        t = threading.Thread(target=lambda: (task.start(), task.stop()), name=weird)
        t.start()
        t.join()

    trace = record(trace_file, body)
    assert weird in {e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}


def test_timestamps_are_relative_microseconds(trace_file, clock):
    task = mxprof.Domain("d").new_task("t")

    def body():
        clock(1_234_567)  # 1234.567 µs after ts 0
        task.start()
        clock(890)
        task.stop()

    trace = record(trace_file, body)
    (e,) = _testing.events(trace, "X", "t")
    assert (e["ts"], e["dur"]) == (1234.567, 0.89)


def test_event_cap_drops_and_counts(trace_file):
    task = mxprof.Domain("d").new_task("t")

    def body():
        for _ in range(1000):
            task.start()
            task.stop()

    trace = record(trace_file, body, max_events=100, continuous_dump=False, aggregate_stats=True)
    assert len(_testing.events(trace, "X", "t")) == 100
    assert trace["otherData"]["dropped_events"] == 900
    import json

    stats = json.loads(mxprof.dumps(format="json"))
    assert stats["Time"]["d"]["t"]["Count"] == 1000  # statistics are not capped
    assert stats["Profiler"]["dropped_events"] == 900


def test_cap_frees_up_after_a_write(trace_file):
    task = mxprof.Domain("d").new_task("t")

    def body():
        for _ in range(3):
            for _ in range(60):
                task.start()
                task.stop()
            mxprof.dump(finished=False)

    trace = record(trace_file, body, max_events=100, continuous_dump=False)
    assert len(_testing.events(trace, "X", "t")) == 180
    assert trace["otherData"]["dropped_events"] == 0


def test_write_trace_off_records_statistics_only(trace_file):
    task = mxprof.Domain("d").new_task("t")
    mxprof.set_config(filename=trace_file, write_trace=False, aggregate_stats=True)
    mxprof.set_state("run")
    task.start()
    task.stop()
    mxprof.dump()
    assert not os.path.exists(trace_file)
    assert "t" in mxprof.dumps()


def test_dev_null_as_the_trace_file():
    task = mxprof.Domain("d").new_task("t")
    mxprof.set_config(filename=os.devnull, aggregate_stats=True)
    mxprof.set_state("run")
    task.start()
    task.stop()
    mxprof.dump(finished=False)  # writes, cannot cut a device: no error
    mxprof.dump()
    import json

    assert json.loads(mxprof.dumps(format="json"))["Time"]["d"]["t"]["Count"] == 1
