"""Code written for mxnet.profiler runs unchanged with ``import mxprof as profiler``.

The functions below use only what MXNet's profiler module offers, with
MXNet's argument names, the way its users and its own tests call it.
"""

import json
import os
from collections import OrderedDict

import mxprof as profiler
from mxprof import _testing


def enable(filename, run=True, continuous_dump=False, aggregate_stats=False):
    profiler.set_config(
        profile_symbolic=True,
        profile_imperative=True,
        profile_memory=True,
        profile_api=True,
        filename=filename,
        continuous_dump=continuous_dump,
        aggregate_stats=aggregate_stats,
    )
    if run:
        profiler.set_state("run")


def busy(n=2000):
    return sum(i * i for i in range(n))


def mxnet_style_session(filename):
    enable(filename, run=True, continuous_dump=True, aggregate_stats=True)
    profiler.dumps(reset=True)
    domain = profiler.Domain(name="PythonDomain::compat")
    task = profiler.Task(domain, "compat_task")
    frame = profiler.Frame(domain, "compat_frame")
    event = profiler.Event("compat_event")
    counter = profiler.Counter(domain, "PythonCounter::compat")
    other = domain.new_counter("second", 10)
    counter.set_value(5)
    counter += 1
    for i in range(5):
        profiler.Marker(domain, "StartIteration-" + str(i)).mark("process")
        frame.start()
        task.start()
        busy()
        task.stop()
        event.start()
        busy()
        event.stop()
        frame.stop()
        if i % 2:
            counter += 1
        else:
            counter -= 1
        other.increment(2)
        other.decrement()
        profiler.dump(False)
    profiler.pause()
    task.start()
    task.stop()
    profiler.resume()
    debug_str = profiler.dumps()
    json_str = profiler.dumps(format="json", sort_by="avg", ascending=True)
    profiler.set_state("stop")
    profiler.dump(True)
    return debug_str, json_str


def test_mxnet_style_code_runs_and_its_output_parses(tmp_path):
    filename = str(tmp_path / "compat.json")
    debug_str, json_str = mxnet_style_session(filename)
    assert "compat_task" in debug_str and "PythonDomain::compat" in debug_str
    stats = json.loads(json_str, object_pairs_hook=OrderedDict)
    assert "Memory" in stats and "Time" in stats and "Unit" in stats
    assert stats["Time"]["PythonDomain::compat"]["compat_task"]["Count"] == 5
    assert stats["Time"]["PythonDomain::compat,frame"]["compat_frame"]["Count"] == 5
    assert stats["Time"]["event"]["compat_event"]["Count"] == 5
    counter = stats["Counter"]["PythonDomain::compat"]["PythonCounter::compat"]
    assert counter["Last"] == 5 and counter["Count"] == 7  # 5, 6, then -1 +1 -1 +1 -1
    assert stats["Counter"]["PythonDomain::compat"]["second"]["Last"] == 15
    markers = stats["Marker"]["PythonDomain::compat"]
    assert sorted(markers) == [f"StartIteration-{i}" for i in range(5)]
    trace = _testing.load_trace(filename)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"compat_task", "compat_frame", "compat_event", "PythonCounter::compat"} <= names


def test_sorting_check_as_mxnet_tests_do_it(tmp_path):
    enable(str(tmp_path / "s.json"), True, True, True)
    domain = profiler.Domain("d")
    for i, name in enumerate(("a", "b", "c")):
        t = profiler.Task(domain, name)
        for _ in range(i + 1):
            t.start()
            busy(500 * (3 - i))
            t.stop()
    keys = {"total": "Total", "avg": "Avg", "min": "Min", "max": "Max", "count": "Count"}
    for sort_by, key in keys.items():
        for asc in (False, True):
            d = json.loads(
                profiler.dumps(format="json", sort_by=sort_by, ascending=asc),
                object_pairs_hook=OrderedDict,
            )
            for cat in d["Time"].values():
                values = [item[key] for item in cat.values()]
                assert values == sorted(values, reverse=not asc)
    profiler.set_state("stop")


def test_table_is_parseable_by_mxnets_column_positions(tmp_path):
    enable(str(tmp_path / "t.json"), True, False, True)
    op = profiler.Task(profiler.Domain("operator"), "dot")
    for _ in range(3):
        with op:
            busy()
    table = profiler.dumps()
    # Split on whitespace and read MXNet's columns by position: name, count,
    # total, min, max, average.  mxprof's own columns follow them (so the
    # average is no longer the last column, which MXNet's opperf helper read).
    header = next(ln for ln in table.splitlines() if ln.startswith("Name"))
    assert header.split("  ")[0] == "Name" and "Avg Time (ms)        Self (ms)" in header
    rows = [ln.split() for ln in table.splitlines() if ln.startswith("dot ")]
    assert len(rows) == 1 and rows[0][1] == "3"
    total, low, high, avg = map(float, rows[0][2:6])
    assert 0 < low <= avg <= high and abs(total / 3 - avg) < 1e-3


def test_default_filename_is_profile_json(tmp_path):
    # The conftest runs every test in tmp_path.
    profiler.set_config(continuous_dump=False)
    profiler.set_state("run")
    profiler.Event("e").start()
    profiler.Event("e").stop()
    profiler.set_state("stop")
    profiler.dump()
    assert os.path.exists(tmp_path / "profile.json")
    assert _testing.events(_testing.load_trace(tmp_path / "profile.json"), "X", "e")
