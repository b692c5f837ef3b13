"""A loaded trace holds its events as columns per thread (trace/_columns.py):
the order, the values and the sequence behaviour of ``Trace.events`` are those
of a list of Events, at a fraction of the memory (issue 22, item 8)."""

import gc
import json
import random
import tracemalloc

import pytest

import mxprof
from mxprof.trace import Event, Trace
from mxprof.trace._columns import _MAX_MOVE
from mxprof.trace._event import NO_ARGS
from mxprof.trace.model import read_events
from mxprof.trace.processes import processes


def write_lines(path, events, metadata=None):
    """A file in mxprof's one-event-per-line shape (read by the fast path)."""
    head = {"displayTimeUnit": "ms", **(metadata or {})}
    opening = json.dumps(head)[:-1] + ',"traceEvents":[\n'
    body = ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
    path.write_text(opening + body + "\n]}\n")
    return path


def reference(events):
    """Trace.events's documented order, worked out on a list of Events:
    (str(pid), str(tid), ts, longer first), ties in the order given."""
    return sorted(events, key=lambda e: (str(e.pid), str(e.tid), e.ts, -(e.dur or 0)))


def as_events(raw):
    """The Events the raw dicts (times in whole µs) load as."""
    out = []
    for r in raw:
        dur = r["dur"] * 1000 if r["ph"] == "X" else None
        args = r.get("args", NO_ARGS)
        out.append(
            Event(
                r["name"], r.get("cat", ""), r["ph"], r["ts"] * 1000, dur, r["pid"], r["tid"], args
            )
        )
    return out


def mixed(n, seed=1):
    """Raw events as mxprof writes them (a range when it ends: children before
    their parent), with ties at one ts, instants and counters among them."""
    rng = random.Random(seed)
    out = []
    t = 0
    for step in range(n):
        for tid in (1, 2):
            children = []
            at = t
            for k in range(rng.randint(0, 4)):
                length = rng.choice([0, 1, 2, 3])
                children.append(
                    {
                        "ph": "X",
                        "name": f"op{k}",
                        "cat": "c",
                        "ts": at,
                        "dur": length,
                        "pid": 7,
                        "tid": tid,
                    }
                )
                if rng.random() < 0.3:
                    children.append(
                        {
                            "ph": "i",
                            "name": "mark",
                            "cat": "c",
                            "ts": at,
                            "s": "t",
                            "pid": 7,
                            "tid": tid,
                        }
                    )
                at += length if rng.random() < 0.5 else 0  # ties at one ts
            children.append(
                {
                    "ph": "C",
                    "name": "loss",
                    "cat": "c",
                    "ts": at,
                    "pid": 7,
                    "tid": tid,
                    "args": {"loss": step},
                }
            )
            out += children
            out.append(
                {
                    "ph": "X",
                    "name": "step",
                    "cat": "train,frame",
                    "ts": t,
                    "dur": at - t + 1,
                    "pid": 7,
                    "tid": tid,
                    "args": {"frame": step},
                }
            )
        t += 20
    return out


def test_events_come_in_the_documented_order_with_their_values(tmp_path):
    raw = mixed(300)
    path = write_lines(tmp_path / "t.json", raw)
    expected = reference(as_events(raw))
    for trace in (read_events(path), mxprof.load(path), Trace(as_events(raw))):
        assert len(trace) == len(expected) == len(raw)
        assert list(trace) == expected
        assert trace.events == expected  # a sequence equal to the list
        assert [trace[i] for i in (0, 5, -1, -7)] == [expected[i] for i in (0, 5, -1, -7)]
        assert trace[3:40:3] == expected[3:40:3] and trace[-5:] == expected[-5:]
    step = next(e for e in read_events(path) if e.name == "step")
    assert step.args == {"frame": 0} and step.ph == "X"
    mark = next(e for e in read_events(path) if e.name == "mark")
    assert mark.dur is None and mark.args is NO_ARGS  # shared and read-only
    with pytest.raises(IndexError):
        read_events(path)[len(raw)]


def test_a_thread_far_out_of_order_is_sorted_once(tmp_path):
    # Every range starts before the one before it: each would move back past
    # all others; past _MAX_MOVE the thread is sorted at the end instead.
    n = 2 * _MAX_MOVE + 10
    raw = [
        {"ph": "X", "name": f"r{k % 3}", "cat": "", "ts": n - k, "dur": k % 5, "pid": 1, "tid": 1}
        for k in range(n)
    ]
    raw += [
        {"ph": "X", "name": "tie", "cat": "", "ts": 5, "dur": d, "pid": 1, "tid": 1}
        for d in (1, 4, 4, 2)
    ]
    path = write_lines(tmp_path / "t.json", raw)
    expected = reference(as_events(raw))
    assert list(read_events(path)) == expected
    assert list(Trace(as_events(raw))) == expected
    at_five = [(e.name, e.dur) for e in read_events(path) if e.ts == 5000]
    # at one ts: longer first, then file order (r1 came before the ties)
    assert at_five == [("tie", 4000), ("tie", 4000), ("r1", 2000), ("tie", 2000), ("tie", 1000)]


def test_statistics_and_model_read_the_columns_alike(tmp_path):
    raw = mixed(200)
    path = write_lines(tmp_path / "t.json", raw)
    trace = read_events(path)
    listed = Trace(list(trace))  # the same events, from a list
    assert list(trace.key_averages()) == list(listed.key_averages())
    assert list(trace.key_averages()) == list(mxprof.load(path).key_averages())
    (p,) = processes(trace)
    ranges = [e for e in trace if e.dur is not None]
    assert sum(len(r) for r in p.threads.values()) == len(ranges)
    assert list(p.threads[1]) == [e for e in ranges if e.tid == 1]
    assert p.threads[2][0] == next(e for e in ranges if e.tid == 2)
    assert p.phases == {"i": sum(r["ph"] == "i" for r in raw), "C": 400}
    assert list(p.durations()[("op0", "c")]) == sorted(e.dur for e in ranges if e.name == "op0")
    assert p.totals()["step"] == sum(e.dur for e in ranges if e.name == "step")
    assert p.steps is not None and len(p.steps.ranges) == 200 and p.steps.tid == 1
    assert [len(v) for v in p.counters.values()] == [400]


def test_a_time_past_int64_ns_keeps_its_value(tmp_path):
    # The latest time a trace may hold (MAX_TIME_US) is just past int64 in ns:
    # that thread's columns become lists, which hold it.
    last = float(1 << 63) / 1000
    raw = [
        {"ph": "X", "name": "late", "cat": "", "ts": last, "dur": 2, "pid": 1, "tid": 1},
        {"ph": "X", "name": "early", "cat": "", "ts": 0, "dur": 1, "pid": 1, "tid": 1},
        {"ph": "X", "name": "other", "cat": "", "ts": 0, "dur": 1, "pid": 1, "tid": 2},
    ]
    path = write_lines(tmp_path / "t.json", raw)
    trace = read_events(path)
    assert [(e.name, e.ts, e.dur) for e in trace] == [
        ("early", 0, 1000),
        ("late", 9_223_372_036_854_776_000, 2000),
        ("other", 0, 1000),
    ]
    assert trace[1].ts > 2**63 - 1
    assert trace.durations()[("late", "")] == [2000]
    (p,) = processes(trace)
    assert p.end == 9_223_372_036_854_778_000 and list(p.durations()[("late", "")]) == [2000]
    assert {r.name: r.self for r in trace.key_averages()} == {
        "late": 2000,
        "early": 1000,
        "other": 1000,
    }


def test_a_loaded_event_costs_under_40_bytes(tmp_path):
    """An Event object per event took about 120 bytes (1.2 GB of 10 M events)."""
    n = 200_000
    lines = [
        {
            "ph": "X",
            "name": f"op{k % 16}",
            "cat": "train",
            "ts": 1_000_000 + 3 * k,
            "dur": 2,
            "pid": 1,
            "tid": 1 + k % 2,
        }
        for k in range(n)
    ]
    path = write_lines(tmp_path / "t.json", lines)
    gc.collect()
    tracemalloc.start()
    try:
        trace = read_events(path)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(trace) == n
    assert held / n < 40, f"{held / n:.0f} bytes an event"
