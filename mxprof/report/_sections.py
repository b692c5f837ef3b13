"""What the report shows, computed from loaded traces: plain data, no HTML.

Every series meant for a plot is bounded here (``downsample``), so the page
stays small whatever the number of events: the cost of a report is one pass
over the events, not one point per event.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from msgspec.structs import replace

from .._render import is_own
from .._tallies import TALLIES
from ..averages import Row
from ..trace import Event, Trace
from ..trace.steps import is_frame, is_profiler_step, step_number
from ._series import (
    DEVICE_STORAGE,
    SCOPE_STORAGE,
    Histogram,
    MemoryPeak,
    Series,
    histogram,
    peaks,
    raw_series,
    series,
)

HIST_ROWS = 500  # ranges (largest total first) whose histogram the page holds
TABLE_ROWS = 2000  # most rows of the ranges table
STEP_BARS = 1000  # most bars of the step breakdown (more steps are averaged in groups)
BREAKDOWN_NAMES = 8  # top-level ranges shown by name in the step breakdown
COUNTER_PLOTS = 12  # counters plotted (the rest are listed)
SCOPE_LINES = 10  # scopes plotted in the memory-by-scope plot
PROCESS_NAMES = 10  # ranges compared across processes
FLAME_NODES = 2000  # most nodes of the whole program's flame graph (the heaviest)
FLAME_RANGE_NODES = 300  # most nodes of one range's flame graph
FLAME_RANGES = 100  # ranges (most samples first) whose flame graph the page holds


@dataclass
class Process:
    """One process of the input: which file, its pid and name, and its numbers."""

    label: str
    path: str
    pid: Any
    threads: int
    ranges: int
    wall_ns: int
    tallies: dict[str, int]
    totals: dict[str, int]  # range name -> total ns in this process


@dataclass
class Steps:
    """Step times and their breakdown by top-level range (the steps as plotted)."""

    name: str
    thread: str  # the thread whose steps these are
    threads: int  # threads with steps of this kind (one is shown)
    count: int
    index: list[int]  # the step's number (frame index, N of ProfilerStep#N, or its order)
    duration: list[int]  # ns per plotted bar (a group mean when steps are grouped)
    parts: dict[str, list[int]]  # top-level range name -> ns per plotted bar; "other", "(self)"
    group: int  # steps per plotted bar (1: every step its own bar)
    outliers: list[tuple[int, int]]  # (step number, ns) of the outlier steps
    median_ns: float
    threshold_ns: float


@dataclass
class Sections:
    """Everything the page shows, for one set of inputs."""

    paths: list[str]
    traces: list[Trace]
    combined: Trace
    wall_ns: int
    rows: list[Row]
    histograms: dict[int, Histogram]  # index into rows -> histogram
    processes: list[Process]
    steps: Steps | None
    counters: list[Series]
    devices: list[Series]
    scopes: list[Series]
    peaks: list[MemoryPeak]
    counts: dict[str, int] = field(default_factory=dict)
    tallies: dict[str, int] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    truncated: list[str] = field(default_factory=list)
    flames: Flames | None = None  # None: the inputs hold no stack samples


@dataclass
class Flame:
    """A flame graph: a tree of call paths, each node a frame (an index into
    :attr:`Flames.frames`), its parent node (-1: the root's children) and its
    samples (inclusive: the samples whose stack starts with its path).
    Nodes come heaviest first, a parent before its children."""

    total: int  # samples of the whole tree (the root)
    frame: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    value: list[int] = field(default_factory=list)
    dropped: int = 0  # nodes left out (lighter than every node kept)


@dataclass
class Flames:
    """The flame graphs of the whole program and of the ranges table's rows."""

    frames: list[tuple[str, str, int]]  # function, file, line
    program: Flame
    ranges: dict[int, Flame]  # index into rows -> its samples' flame graph


def other_data(trace: Trace) -> dict[str, Any]:
    """The trace's ``otherData`` (mxprof's version, host, tallies ...), or {}."""
    value = trace.metadata.get("otherData")
    return value if isinstance(value, dict) else {}


def _combine(traces: Sequence[Trace]) -> tuple[Trace, list[int]]:
    """One Trace of every input, on one time axis, pids kept apart per file.

    Each input's events move by the difference between its wall-clock start
    (``baseTimeNanoseconds``) and the earliest input's when every input has
    one (as ``mxprof merge`` does); otherwise they stay on their own axis. A
    pid two files share becomes ``"<file number>:<pid>"`` in the later file.
    """
    if len(traces) == 1:
        return traces[0], [0]
    bases = [t.base_time_ns for t in traces]
    known = [b for b in bases if b is not None]
    first = min(known) if len(known) == len(bases) and known else None
    shifts = [b - first if first is not None and b is not None else 0 for b in bases]
    events: list[Event] = []
    seen: set[Any] = set()
    process_names: dict[Any, str] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    for k, (trace, shift) in enumerate(zip(traces, shifts)):
        pids = {e.pid for e in trace} | set(trace.process_names)
        clash = pids & seen
        seen |= pids

        def pid_of(pid: Any, clash: set[Any] = clash, k: int = k) -> Any:
            return f"{k}:{pid}" if pid in clash else pid

        if not clash and not shift:
            events.extend(trace.events)
        else:
            events.extend(replace(e, ts=e.ts + shift, pid=pid_of(e.pid)) for e in trace)
        for pid, name in trace.process_names.items():
            process_names[pid_of(pid)] = name
        for (pid, tid), name in trace.thread_names.items():
            thread_names[(pid_of(pid), tid)] = name
    combined = Trace(events, process_names=process_names, thread_names=thread_names)
    return combined, shifts


def build(paths: Sequence[str], traces: Sequence[Trace]) -> Sections:
    """The report's sections for traces (loaded from paths, in that order)."""
    combined, _ = _combine(traces)
    tallied = [_tally(trace) for trace in traces]
    firsts = [span[0] for t in tallied for span in t.spans.values()]
    lasts = [span[1] for t in tallied for span in t.spans.values()]
    start, end = min(firsts, default=0), max(lasts, default=0)
    wall = max(end - start, 0)
    every_row = list(combined.key_averages().without_own())  # no profiler's own ranges
    rows = every_row[:TABLE_ROWS]
    phases: Counter[str] = Counter()
    for t in tallied:
        phases.update(t.phases)
    counts = {
        "events": len(combined),
        "ranges": sum(span[2] for t in tallied for span in t.spans.values()),
        "instants": phases["i"] + phases["n"] + phases["R"],
        "counter samples": phases["C"],
        "unpaired begins/ends": sum(t.unmatched for t in traces),
        # Pids two files share are apart in combined: count each file's own.
        "processes": sum(
            len(set(t.spans) | set(tr.process_names)) for t, tr in zip(tallied, traces)
        ),
        "threads": sum(len(tids) for t in tallied for tids in t.tids.values()),
    }
    raw = raw_series(combined, start)
    counters = series(combined, raw)
    tallies: dict[str, int] = {}
    config: dict[str, Any] = {}
    for path, trace in zip(paths, traces):
        data = other_data(trace)
        for key in TALLIES:
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                tallies[key] = tallies.get(key, 0) + value
        for key, value in data.items():
            if key == "config" and isinstance(value, dict):  # the keys set_config took
                for name, setting in value.items():
                    config.setdefault(name, {})[path] = setting
            elif key not in TALLIES:
                config.setdefault(key, {})[path] = value
    return Sections(
        paths=list(paths),
        traces=list(traces),
        combined=combined,
        wall_ns=wall,
        rows=rows,
        histograms=_histograms(combined, rows),
        processes=_processes(paths, traces, tallied),
        steps=_steps(combined, every_row),
        counters=[s for s in counters if s.category not in _MEMORY],
        devices=[s for s in counters if s.category == DEVICE_STORAGE],
        scopes=[s for s in counters if s.category == SCOPE_STORAGE],
        peaks=peaks(combined, raw),
        counts=counts,
        tallies=tallies,
        config=config,
        truncated=[p for p, t in zip(paths, traces) if t.truncated],
        flames=_flames(traces, rows),
    )


Stack = tuple[tuple[str, str, int], ...]


def _flame(stacks: dict[Stack, int], cap: int, frame_index: dict[Any, int]) -> Flame:
    """The tree of stacks (outermost frame first) -> samples, its ``cap`` heaviest nodes."""
    nodes: dict[tuple[int, Any], int] = {}  # (parent node, frame) -> node
    frames: list[Any] = []
    parents: list[int] = []
    values: list[int] = []
    depths: list[int] = []
    total = 0
    for stack, n in stacks.items():
        total += n
        parent = -1
        for depth, frame in enumerate(stack):
            node = nodes.get((parent, frame))
            if node is None:
                node = nodes[(parent, frame)] = len(values)
                frames.append(frame)
                parents.append(parent)
                values.append(0)
                depths.append(depth)
            values[node] += n
            parent = node
    # A parent holds at least its child's samples and is shallower: sorting by
    # (-samples, depth) puts it first, so any prefix of the order is a tree.
    order = sorted(range(len(values)), key=lambda k: (-values[k], depths[k], k))[:cap]
    new = {old: k for k, old in enumerate(order)}
    out = Flame(total=total, dropped=len(values) - len(order))
    for old in order:
        frame = frames[old]
        out.frame.append(frame_index.setdefault(frame, len(frame_index)))
        out.parent.append(new[parents[old]] if parents[old] >= 0 else -1)
        out.value.append(values[old])
    return out


def _flames(traces: Sequence[Trace], rows: Sequence[Row]) -> Flames | None:
    """Flame graphs of every input's samples: the whole program, and per range of the
    table (the ``FLAME_RANGES`` with the most samples).  A sample taken in one of
    the profiler's own ranges is in the program's only (``Samples.counts``)."""
    program: dict[Stack, int] = {}
    per: dict[tuple[str, str], dict[Stack, int]] = {}
    for trace in traces:
        for (key, stack), n in trace.samples.counts().items():
            program[stack] = program.get(stack, 0) + n
            if key is not None:
                got = per.setdefault(key, {})
                got[stack] = got.get(stack, 0) + n
    if not program:
        return None
    index: dict[Any, int] = {}
    whole = _flame(program, FLAME_NODES, index)
    by_row = {(r.category, r.name): i for i, r in enumerate(rows)}
    sampled = [k for k in per if k in by_row]
    sampled.sort(key=lambda k: (-sum(per[k].values()), k))
    ranges = {by_row[k]: _flame(per[k], FLAME_RANGE_NODES, index) for k in sampled[:FLAME_RANGES]}
    frames = [("", "", 0)] * len(index)
    for frame, k in index.items():
        frames[k] = frame
    return Flames(frames=frames, program=whole, ranges=ranges)


_MEMORY = (DEVICE_STORAGE, SCOPE_STORAGE)
_TS = attrgetter("ts")
_PH = attrgetter("ph")
_THREAD = attrgetter("pid", "tid")


def _histograms(trace: Trace, rows: Sequence[Row]) -> dict[int, Histogram]:
    wanted = [(r.name, r.category) for r in rows[:HIST_ROWS]]
    durations = trace.durations(wanted)
    return {i: histogram(durations[key]) for i, key in enumerate(wanted) if durations.get(key)}


def _label(trace: Trace, pid: Any) -> str:
    info = trace.metadata.get("distributedInfo")
    name = trace.process_names.get(pid)
    if isinstance(info, dict) and "rank" in info:
        return f"{info.get('role', 'rank')} {info.get('rank')} (pid {pid})"
    return f"{name} (pid {pid})" if name else f"pid {pid}"


@dataclass
class _Tally:
    """One pass over a trace: per pid [first ts, last end, ranges] and tids;
    the count of each phase but ranges'."""

    spans: dict[Any, list[int]] = field(default_factory=dict)
    tids: dict[Any, set[Any]] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)


def _tally(trace: Trace) -> _Tally:
    t = _Tally()
    span = [0, 0, 0]
    pid: Any = None
    tid: Any = None
    for e in trace:  # one thread after another
        if e.tid != tid or e.pid != pid or not t.spans:
            pid, tid = e.pid, e.tid
            found = t.spans.get(pid)
            if found is None:
                found = t.spans[pid] = [e.ts, e.ts, 0]
                t.tids[pid] = set()
            span = found
            t.tids[pid].add(tid)
        ts = e.ts
        dur = e.dur
        if ts < span[0]:
            span[0] = ts
        if dur is None:
            t.phases[e.ph] = t.phases.get(e.ph, 0) + 1
            if ts > span[1]:
                span[1] = ts
        else:
            span[2] += 1
            if ts + dur > span[1]:
                span[1] = ts + dur
    return t


def _processes(
    paths: Sequence[str], traces: Sequence[Trace], tallied: Sequence[_Tally]
) -> list[Process]:
    out = []
    for path, trace, t in zip(paths, traces, tallied):
        totals: dict[tuple[Any, str], int] = {}
        ranged = [pid for pid, span in t.spans.items() if span[2]]
        if len(ranged) == 1:  # one process: its totals by name are the trace's
            for r in trace.key_averages().without_own():
                totals[(ranged[0], r.name)] = totals.get((ranged[0], r.name), 0) + int(r.total)
        else:
            for e in trace:
                if e.dur is not None and not is_own(e.category, e.name):
                    key = (e.pid, e.name)
                    totals[key] = totals.get(key, 0) + e.dur
        data = other_data(trace)
        tallies = {k: v for k, v in data.items() if k in TALLIES}
        for pid, (first, last, ranges) in t.spans.items():
            out.append(
                Process(
                    label=_label(trace, pid),
                    path=path,
                    pid=pid,
                    threads=len(t.tids[pid]),
                    ranges=ranges,
                    wall_ns=last - first,
                    tallies=tallies if data.get("pid") in (pid, None) else {},
                    totals={name: ns for (p, name), ns in totals.items() if p == pid},
                )
            )
    return out


def _step_kind(name: str, category: str) -> tuple[str, str] | None:
    """Which kind of step a range of this name and category is (None: no step).

    A frame (category ``<domain>,frame``) is a step of its own name; torch's
    ``ProfilerStep#N`` ranges are all steps of one kind, ``ProfilerStep``.
    """
    if is_frame(category):
        return (name, category)
    if is_profiler_step(name):
        return ("ProfilerStep", category)
    return None


def _steps(trace: Trace, rows: Sequence[Row]) -> Steps | None:
    """The most frequent kind of step, its times and top-level breakdown (rows:
    the trace's key_averages, all of them)."""
    kind_of = {(r.name, r.category): _step_kind(r.name, r.category) for r in rows}
    kinds: dict[tuple[str, str], int] = {}
    for r in rows:
        found = kind_of[(r.name, r.category)]
        if found is not None:
            kinds[found] = kinds.get(found, 0) + r.count
    if not kinds:
        return None
    kind = max(kinds, key=lambda k: (kinds[k], k))
    step_names = {key for key, found in kind_of.items() if found == kind}
    names = {name for name, _ in step_names}
    # Walk each thread in order (events are sorted per thread by ts, longest
    # first): a range inside the current step is top-level when it starts
    # past the end of the previous top-level one.
    # (number, ns, {child: ns}) per thread; the thread with the most steps is
    # shown (ranks' step numbers repeat: stacking them would add them up).
    by_thread: dict[tuple[Any, Any], list[tuple[int, int, dict[str, int]]]] = {}
    steps: list[tuple[int, int, dict[str, int]]] = []
    inside_step: dict[str, int] = {}
    step_end = -1
    child_end = 0
    pid: Any = None
    tid: Any = None
    for e in trace:
        dur = e.dur
        if dur is None:
            continue
        if e.tid != tid or e.pid != pid or not by_thread:
            pid, tid, step_end = e.pid, e.tid, -1
            steps = by_thread.setdefault((pid, tid), [])
        start = e.ts
        if e.name in names and (e.name, e.category) in step_names:
            inside_step = {}
            steps.append((step_number(e, len(steps)), dur, inside_step))
            step_end, child_end = start + dur, start
            continue
        if start >= step_end or start + dur > step_end:
            continue
        if start >= child_end or dur == 0:
            inside_step[e.name] = inside_step.get(e.name, 0) + dur
            if start + dur > child_end:
                child_end = start + dur
    thread = max(by_thread, key=lambda t: (len(by_thread[t]), str(t)))
    steps = sorted(by_thread[thread], key=lambda s: s[0])
    totals: dict[str, int] = {}
    for _, _, children in steps:
        for name, ns in children.items():
            totals[name] = totals.get(name, 0) + ns
    named = sorted(totals, key=lambda n: (-totals[n], n))[:BREAKDOWN_NAMES]
    durations = [d for _, d, _ in steps]
    median = statistics.median(durations)
    mad = statistics.median(abs(d - median) for d in durations)
    threshold = max(median + 5 * 1.4826 * mad, median * 1.2)
    outliers = [(n, d) for n, d, _ in steps if d > threshold]
    group = max(1, -(-len(steps) // STEP_BARS))
    index, duration = [], []
    parts: dict[str, list[int]] = {n: [] for n in [*named, "other", "(self)"]}
    for lo in range(0, len(steps), group):
        chunk = steps[lo : lo + group]
        size = len(chunk)
        index.append(chunk[0][0])
        duration.append(sum(d for _, d, _ in chunk) // size)
        for name in named:
            parts[name].append(sum(p.get(name, 0) for _, _, p in chunk) // size)
        inside = [sum(p.values()) for _, _, p in chunk]
        known = [sum(p.get(n, 0) for n in named) for _, _, p in chunk]
        parts["other"].append(sum(i - k for i, k in zip(inside, known)) // size)
        parts["(self)"].append(sum(max(d - i, 0) for (_, d, _), i in zip(chunk, inside)) // size)
    pid, tid = thread
    label = trace.process_names.get(pid)
    where = trace.thread_names.get(thread) or f"tid {tid}"
    return Steps(
        name=kind[0],
        thread=f"{where} of {label} (pid {pid})" if label else f"{where} of pid {pid}",
        threads=len(by_thread),
        count=len(steps),
        index=index,
        duration=duration,
        parts={n: v for n, v in parts.items() if any(v)},
        group=group,
        outliers=sorted(outliers, key=lambda o: -o[1])[:50],
        median_ns=float(median),
        threshold_ns=float(threshold),
    )
