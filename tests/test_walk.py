"""The walks after reading (issue 22's report time): ``tree.by_key`` (the
statistics' walk of a thread's columns) gives what ``tree.nest`` gives, and a
step's direct children found by stepping over the ranges inside each child
(``processes._direct``) are those the range-by-range walk finds (the rule of
``processes._fitting`` applied to every range), on the cases that tell the
walks apart: nested zero-length ranges, a child starting at its parent's end,
overlapping siblings, ranges between steps, and random threads of them."""

import random
from array import array

import pytest

from mxprof.trace import Event, Trace
from mxprof.trace._columns import NO_DUR
from mxprof.trace.processes import _fitting, processes
from mxprof.trace.tree import by_key, nest


def X(name, ts, dur, *, cat="c", tid=1, pid=1, args=None):
    return Event(name, cat, "X", ts, dur, pid, tid, args if args is not None else {})


def step(index, ts, dur, **kw):
    return X("step", ts, dur, cat="train,frame", args={"frame": index}, **kw)


def _reference_groups(trace):
    """(sorted durations, self total) per (name, category), from ``nest`` over each thread."""
    out = {}
    for thread in trace.events.threads:
        names, cats = thread.keys.names, thread.keys.categories
        for i, own in nest(thread.spans()):
            k = thread.key(thread.kind[i])
            got = out.setdefault((names[k], cats[k]), [[], 0])
            got[0].append(thread.dur[i])
            got[1] += own if own > 0 else 0
    return {key: (sorted(d), s) for key, (d, s) in out.items()}


def _walked_groups(trace):
    out = {}
    for thread in trace.events.threads:
        got = by_key(thread.ts, thread.dur, thread.kind, thread.extras, NO_DUR)
        for k, (lengths, own) in got.items():
            key = (thread.keys.names[k], thread.keys.categories[k])
            have = out.setdefault(key, [[], 0])
            have[0] += list(lengths)
            have[1] += own[0]
    return {key: (sorted(d), s) for key, (d, s) in out.items()}


def _random_thread(rnd, n, *, tid=1, pid=1):
    events = []
    for _ in range(n):
        ts = rnd.randint(0, 60)
        dur = rnd.choice([0, 0, 1, 2, 3, 5, 8, 20])
        events.append(X(f"r{rnd.randint(0, 4)}", ts, dur, tid=tid, pid=pid))
    return events


def test_by_key_self_times_of_nested_zero_length_and_overlapping_ranges():
    # outer [0, 10): a child [2, 5) holding a zero-length range at 3 and one
    # at its end (5); a child starting at the first's end [5, 7); a range
    # [6, 12) overlapping [5, 7) and outer's end: a child of neither.
    events = [
        X("outer", 0, 10),
        X("a", 2, 3),
        X("z", 3, 0),
        X("z", 5, 0),
        X("b", 5, 2),
        X("over", 6, 6),
    ]
    trace = Trace(events)
    rows = {r.name: r for r in trace.key_averages()}
    # outer: 10 less a (3), b (2) and the zero-length z at 5 (0): 5
    assert {n: (r.count, r.total, r.self) for n, r in rows.items()} == {
        "outer": (1, 10, 5),
        "a": (1, 3, 3),
        "z": (2, 0, 0),
        "b": (1, 2, 2),
        "over": (1, 6, 6),
    }
    assert _walked_groups(trace) == _reference_groups(trace)


def test_by_key_self_time_when_children_overlap_is_at_least_zero():
    # Two children of 8 in a parent of 10 (the second overlaps the first
    # without fitting in it): the parent's self is clamped at 0.
    trace = Trace([X("p", 0, 10), X("c", 0, 8), X("c", 2, 8)])
    rows = {r.name: r.self for r in trace.key_averages()}
    # The second c is a child of p, not of the first: p has 10 - 8 - 8 < 0, so 0.
    assert rows == {"p": 0, "c": 16}
    assert _walked_groups(trace) == _reference_groups(trace)


@pytest.mark.parametrize("seed", range(40))
def test_by_key_gives_nest_s_durations_and_self_times(seed):
    rnd = random.Random(seed)
    events = _random_thread(rnd, rnd.randint(1, 80)) + _random_thread(rnd, 30, tid=2)
    trace = Trace(events)
    assert _walked_groups(trace) == _reference_groups(trace)
    rows = {(r.name, r.category): (r.count, r.total, r.self) for r in trace.key_averages()}
    ref = _reference_groups(trace)
    assert rows == {key: (len(d), sum(d), s) for key, (d, s) in ref.items()}


def test_by_key_of_wide_columns_keeps_values_past_int64():
    big = 1 << 70
    got = by_key([0, 1], [big, 2], [0, 1], [], -1)  # lists: a damaged file's columns
    assert {k: (list(d), s) for k, (d, s) in got.items()} == {0: ([big], [big - 2]), 1: ([2], [2])}


def _reference_steps(p):
    """Steps' children, time in no range and between, by the range-by-range rule."""
    s = p.steps
    names = p.threads[s.tid].thread.keys.names
    n = len(s.ranges)
    children, inside = {}, [0] * n
    between, covered = [0] * max(n - 1, 0), [0] * max(n - 1, 0)
    starts = [e.ts for e in s.ranges]
    ends = [e.end for e in s.ranges]
    child_end, gap_end = list(starts), ends[: len(between)]
    for k, in_step, ts, end, key in _fitting(p, s):
        length = end - ts
        if in_step:
            if ts >= child_end[k] or length == 0:
                children.setdefault(names[key], [0] * n)[k] += length
                inside[k] += length
                child_end[k] = max(child_end[k], end)
        elif 0 <= k < len(between) and ts >= gap_end[k]:
            covered[k] += length
            gap_end[k] = end
    for k in range(len(between)):
        between[k] = max(starts[k + 1] - ends[k] - covered[k], 0)
    in_no_range = [max(e.dur - i, 0) for e, i in zip(s.ranges, inside)]
    return children, in_no_range, between


def _model_steps(p):
    s = p.steps
    return {k: list(v) for k, v in s.children.items()}, list(s.in_no_range), list(s.between)


def test_a_step_s_direct_children_skip_what_is_inside_them():
    events = [
        step(0, 0, 20),
        X("fwd", 1, 6),
        X("layer", 1, 2),  # inside fwd: not a direct child
        X("zero", 3, 0),  # zero-length inside fwd: counts as a direct child (length 0)
        X("layer", 4, 3),  # ends at fwd's end
        X("bwd", 7, 5),  # starts at fwd's end: a direct child
        X("over", 10, 4),  # starts inside bwd, ends after it: counted in neither
        X("opt", 15, 5),  # ends at the step's end
        X("gap", 21, 2),  # between steps 0 and 1
        X("gap_in", 21, 1),  # inside it
        step(1, 25, 10),
        X("fwd", 26, 3),
        X("late", 40, 1),  # after the last step: nowhere
    ]
    (p,) = processes(Trace(events))
    children, in_no_range, between = _model_steps(p)
    assert children == {"fwd": [6, 3], "zero": [0, 0], "bwd": [5, 0], "opt": [5, 0]}
    assert in_no_range == [20 - 16, 10 - 3]
    assert between == [25 - 20 - 2]
    assert (children, in_no_range, between) == _reference_steps(p)


def test_overlapping_steps_keep_their_own_children():
    # Step 1 starts inside step 0's child: the skip past that child stops at step 1.
    events = [step(0, 0, 10), X("a", 1, 8), step(1, 5, 10), X("b", 6, 2), X("c", 11, 3)]
    (p,) = processes(Trace(events))
    assert _model_steps(p) == _reference_steps(p)
    assert _model_steps(p)[0] == {"a": [8, 0], "b": [0, 2], "c": [0, 3]}


@pytest.mark.parametrize("seed", range(60))
def test_direct_children_match_the_range_by_range_walk(seed):
    rnd = random.Random(seed)
    events = []
    t = rnd.randint(0, 3)
    for k in range(rnd.randint(1, 12)):
        length = rnd.randint(0, 30)
        events.append(step(k, t, length))
        for _ in range(rnd.randint(0, 12)):  # ranges in, around and between the steps
            ts = t + rnd.randint(-3, length + 3)
            events.append(X(f"r{rnd.randint(0, 3)}", ts, rnd.choice([0, 0, 1, 2, 4, 7, 12])))
        t += length + rnd.choice([0, 0, 1, 4])
    events.append(X("other thread", 0, 5, tid=2))
    events.append(Event("loss", "c", "C", 1, None, 1, 1, {"loss": 1}))
    rnd.shuffle(events)
    (p,) = processes(Trace(events))
    assert p.steps is not None
    assert _model_steps(p) == _reference_steps(p)


def test_process_durations_and_totals_over_threads():
    events = [X("a", 0, 5), X("b", 1, 2), X("a", 0, 3, tid=2), X("a", 4, 1, tid=2)]
    events.append(X("own", 0, 1, cat="mxprof"))  # the profiler's own: not in totals
    trace = Trace(events)
    (p,) = processes(trace)
    assert {k: list(v) for k, v in p.durations().items()} == {
        ("a", "c"): [1, 3, 5],
        ("b", "c"): [2],
        ("own", "mxprof"): [1],
    }
    assert all(isinstance(v, array) for v in p.durations().values())
    assert p.totals() == {"a": 9, "b": 2}
    # The trace's statistics and the process's read one walk and do not change it.
    rows = {r.name: (r.count, r.total, r.self) for r in trace.key_averages()}
    assert rows["a"] == (3, 9, 6)  # a on tid 1: 5 less b (2) and own (1)
    assert {k: list(v) for k, v in p.durations().items()}[("a", "c")] == [1, 3, 5]
    again = {r.name: (r.count, r.total, r.self) for r in trace.key_averages()}
    assert again == rows


def _reference_gaps(thread, least):
    """The range-by-range walk of idle gaps (what hints.steps.idle_gaps did)."""
    out, end, last = [], None, -1
    for _, ts, d, k in thread.range_columns():
        if end is not None and ts > end and ts - end >= least:
            out.append((ts - end, end, ts, last, k))
        if end is None or ts + d > end:
            end, last = ts + d, k
    return out


@pytest.mark.parametrize("seed", range(40))
def test_long_gaps_match_the_range_by_range_walk(seed):
    from mxprof.report.hints.steps import _long_gaps

    rnd = random.Random(seed)
    events = []
    for _ in range(rnd.randint(1, 60)):
        ts = rnd.randint(0, 400)
        if rnd.random() < 0.2:  # a counter sample: neither ends nor starts a gap
            events.append(Event("q", "c", "C", ts, None, 1, 1, {"q": 1}))
        else:
            events.append(X(f"r{rnd.randint(0, 3)}", ts, rnd.choice([0, 1, 5, 20, 40])))
    trace = Trace(events)
    for thread in trace.events.threads:
        for least in (1, 3, 25):
            assert _long_gaps(thread, least) == _reference_gaps(thread, least)


def test_long_gaps_name_the_range_whose_end_starts_the_gap():
    from mxprof.report.hints.steps import _long_gaps

    # a [0, 10) and b [2, 10) end together: the gap after them starts at a's
    # end (the first to reach it); the counter sample at 20 starts nothing.
    events = [X("a", 0, 10), X("b", 2, 8), Event("q", "c", "C", 20, None, 1, 1, {"q": 1})]
    events += [X("c", 30, 5), X("d", 31, 1), X("e", 50, 1)]
    (thread,) = Trace(events).events.threads
    names = thread.keys.names
    got = [(n, a, b, names[x], names[y]) for n, a, b, x, y in _long_gaps(thread, 5)]
    assert got == [(20, 10, 30, "a", "c"), (15, 35, 50, "c", "e")]


def _reference_other(thread, loads, floor):
    open_end = floor
    for i, ts, d, _ in thread.range_columns():
        if thread.key(thread.kind[i]) not in loads and ts >= open_end:
            return True
        open_end = max(open_end, ts + d)
    return False


@pytest.mark.parametrize("seed", range(30))
def test_other_top_level_matches_the_range_by_range_walk(seed):
    from mxprof.report.hints.loading import _other_top_level

    rnd = random.Random(seed)
    events = []
    for _ in range(rnd.randint(1, 30)):
        ts = rnd.randint(0, 100)
        if rnd.random() < 0.2:
            events.append(Event("load", "c", "C", ts, None, 1, 1, {"load": 1}))
        else:
            name = rnd.choice(["load", "load", "work"])
            events.append(X(name, ts, rnd.choice([0, 2, 10, 50])))
    trace = Trace(events)
    (thread,) = trace.events.threads
    keys = thread.keys
    loads = {k for k, n in enumerate(keys.names) if n == "load" and keys.phases[k] == "X"}
    kinds = loads | {-(j + 1) for j, (k, _) in enumerate(thread.extras) if k in loads}
    for floor in (-1, 30):
        assert _other_top_level(thread, kinds, floor) == _reference_other(thread, loads, floor)


@pytest.mark.parametrize("seed", range(30))
def test_counter_series_from_the_processes_match_a_pass_over_the_events(seed):
    from mxprof.report._series import raw_series

    rnd = random.Random(seed)
    events = [X("r", 0, 50)]
    numbers = [1, 2, 3] if seed < 20 else [1, 2, 3, "not a number"]
    for _ in range(rnd.randint(1, 40)):  # one counter on several threads and pids, ties in time
        name = rnd.choice(["q", "loss"])
        value = rnd.choice(numbers)
        tid, pid = rnd.choice([1, 2, "3"]), rnd.choice([1, 7])
        events.append(Event(name, "c", "C", rnd.randint(0, 20), None, pid, tid, {name: value}))
    trace = Trace(events)
    got, want = raw_series(trace, 5, processes(trace)), raw_series(trace, 5)
    assert list(got.items()) == list(want.items())  # the order of the counters too


def test_the_model_does_not_keep_its_trace_alive():
    import gc
    import weakref

    trace = Trace([step(0, 0, 10), X("a", 1, 2)])
    (p,) = processes(trace)
    assert p.totals() == {"step": 10, "a": 2}
    gone = weakref.ref(trace)
    del trace, p
    gc.collect()
    assert gone() is None


def test_a_pickled_process_gives_the_same_durations_and_totals():
    import pickle

    trace = Trace([step(0, 0, 10), X("a", 1, 2), X("a", 4, 3, tid=2)])
    (p,) = processes(trace)
    copy = pickle.loads(pickle.dumps(p))
    assert copy.totals() == p.totals() == {"step": 10, "a": 5}
    assert {k: list(v) for k, v in copy.durations().items()} == {
        ("step", "train,frame"): [10],
        ("a", "c"): [2, 3],
    }
