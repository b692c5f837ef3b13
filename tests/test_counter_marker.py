"""Counters and markers: values, samples, scopes, and argument errors."""

import json

import pytest

import mxprof
from mxprof import _testing
from mxprof._testing import finish, start


def test_counter_operations_and_samples(trace_file):
    c = mxprof.Domain("mem").new_counter("bytes")
    start(trace_file)
    c.set_value(10)
    c.increment(5)
    c.decrement(3)
    c += 4
    c -= 1
    c.increment()
    c.decrement()
    assert c.value == 15
    trace = finish(trace_file)
    samples = _testing.events(trace, "C", "bytes")
    assert [s["args"] for s in samples] == [{"bytes": v} for v in (10, 15, 12, 16, 15, 16, 15)]
    assert {s["cat"] for s in samples} == {"mem"}
    row = json.loads(mxprof.dumps(format="json"))["Counter"]["mem"]["bytes"]
    assert row == {"Count": 7, "Last": 15, "Min": 10, "Max": 16, "Avg": round(99 / 7, 6)}


def test_initial_value_and_identity():
    mxprof.set_config(aggregate_stats=True)
    a = mxprof.Counter(mxprof.Domain("d"), "shared", 7)
    assert json.loads(mxprof.dumps(format="json"))["Profiler"]["ignored_calls"] == 0
    b = mxprof.Domain("d").new_counter("shared")
    assert b.value == 7  # one counter
    b += 1
    assert a.value == 8
    c = mxprof.Domain("other").new_counter("shared")
    assert c.value == 0


def test_decrement_below_zero_is_negative_and_add_saturates():
    c = mxprof.Domain("d").new_counter("signed", 0)
    c.decrement(5)
    assert c.value == -5
    c.set_value(2**63 - 2)
    c += 10
    assert c.value == 2**63 - 1
    c.set_value(-(2**63))
    c -= 1
    assert c.value == -(2**63)


def test_counter_type_errors_are_ordinary():
    # More on values (floats, numpy, saturation, NaN) in test_counter_values.py.
    c = mxprof.Domain("d").new_counter("c", 0)
    with pytest.raises(TypeError, match="counter 'c'"):
        c.set_value("3")
    c.increment(1.5)
    assert c.value == 1
    c.set_value(2**63)
    assert c.value == 2**63 - 1


def test_counter_value_changes_in_every_state(trace_file):
    c = mxprof.Domain("d").new_counter("c", 1)
    c += 1
    start(trace_file)
    mxprof.pause()
    c += 1
    mxprof.resume()
    c += 1
    trace = finish(trace_file)
    assert c.value == 4
    assert [s["args"]["c"] for s in _testing.events(trace, "C", "c")] == [4]


def test_counter_in_table_has_real_values(trace_file):
    c = mxprof.Domain("PythonDomain").new_counter("PythonCounter")
    start(trace_file)
    c.set_value(5)
    c.set_value(6)
    table = mxprof.dumps()
    assert "PythonDomain,counter\n" in table
    line = next(ln for ln in table.splitlines() if ln.startswith("PythonCounter"))
    assert line.split() == ["PythonCounter", "2", "6", "5", "6", "5.5000"]


@pytest.mark.parametrize(
    "scope, s", [("global", "g"), ("process", "p"), ("thread", "t"), ("task", "t"), ("marker", "t")]
)
def test_marker_scopes(trace_file, scope, s):
    m = mxprof.Domain("d").new_marker("here")
    start(trace_file)
    m.mark(scope)
    trace = finish(trace_file)
    (e,) = _testing.events(trace, "i", "here")
    assert (e["s"], e["args"]["scope"], e["cat"]) == (s, scope, "d")


def test_marker_default_scope_and_count(trace_file):
    m = mxprof.Domain("d").new_marker("epoch")
    start(trace_file)
    for _ in range(3):
        m.mark()
    assert json.loads(mxprof.dumps(format="json"))["Marker"]["d"]["epoch"] == {"Count": 3}
    trace = finish(trace_file)
    assert [e["s"] for e in _testing.events(trace, "i", "epoch")] == ["p"] * 3


@pytest.mark.parametrize("state", ["stop", "run", "paused"])
def test_bad_marker_scope_raises_in_any_state(trace_file, state):
    m = mxprof.Domain("d").new_marker("m")
    if state != "stop":
        start(trace_file)
    if state == "paused":
        mxprof.pause()
    for bad in ("galaxy", "", None, 2, ["process"]):
        with pytest.raises(mxprof.ConfigError, match="global, process, thread, task, marker"):
            m.mark(bad)


def test_initial_value_while_recording_is_a_sample(trace_file):
    start(trace_file)
    mxprof.Domain("d").new_counter("init", 42)
    trace = finish(trace_file)
    assert [e["args"] for e in _testing.events(trace, "C", "init")] == [{"init": 42}]
