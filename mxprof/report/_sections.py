"""What the report shows, computed from loaded traces: plain data, no HTML.

Every series meant for a plot is bounded here (``downsample``), so the page
stays small whatever the number of events: the cost of a report is one pass
over the events, not one point per event.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from msgspec.structs import replace

from .._tallies import TALLIES
from ..averages import Row
from ..trace import Event, Trace
from ..trace.dataloader import loader
from ..trace.processes import DEVICE_STORAGE, SCOPE_STORAGE, job, processes
from ..trace.processes import Process as TraceProcess
from ..trace.snapshot import Trigger, trigger_of
from ._series import Histogram, MemoryPeak, Series, histogram, raw_series, series

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
IN_NO_RANGE = "in no range"  # a step's time inside no range on its thread (trace.processes)


@dataclass
class Process:
    """One process of the input (``trace.processes``): its file, label, and numbers."""

    label: str
    path: str
    pid: Any
    name: str | None  # its process name in the file
    threads: int
    ranges: int
    wall_ns: int
    tallies: dict[str, int] | None  # None: the file's tallies are not this process's alone
    totals: dict[str, int]  # range name -> total ns in this process


@dataclass
class Steps:
    """One process's steps as plotted: times, breakdown by top-level range and
    the time in no range (``trace.processes``: its steps and outlier rule)."""

    name: str
    thread: str  # the thread and process whose steps these are
    processes: int  # processes with steps (one is shown)
    count: int
    index: list[int]  # the step's number (frame index, N of ProfilerStep#N, or its order)
    duration: list[int]  # ns per plotted bar (a group mean when steps are grouped)
    parts: dict[str, list[int]]  # top-level range name -> ns per bar; "other", IN_NO_RANGE
    group: int  # steps per plotted bar (1: every step its own bar)
    outliers: list[tuple[int, int]]  # (step number, ns) of the outlier steps, longest first
    median_ns: float
    threshold_ns: float
    in_no_range_ns: int  # inside the steps, in no range, all steps together
    between_ns: int  # between the steps, in no range, all gaps together
    span_ns: int  # the first step's start to the last one's end
    # torch's DataLoader (trace.dataloader), per bar: the wait before the step
    # by the worker whose batch it waited for, and each worker's busy time
    data_wait: dict[str, list[int]] = field(default_factory=dict)
    worker_busy: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class Triggered:
    """A flight recorder snapshot's trigger (``trace.snapshot``), placed on the page."""

    path: str
    trigger: Trigger
    at_ns: float  # ns from the page's start, the counters' and memory plots' axis
    step: int | None  # the step chart's step open at the trigger (or the last one begun)


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
    row_walls: list[int]  # per row: the wall time of the processes that ran it (its % base)
    steps: Steps | None
    counters: list[Series]
    devices: list[Series]
    scopes: list[Series]
    peaks: list[MemoryPeak]
    counts: dict[str, int] = field(default_factory=dict)
    tallies: dict[str, int] = field(default_factory=dict)
    tallies_missing: str = ""  # why the input holds no tallies (when it holds none)
    config: dict[str, Any] = field(default_factory=dict)
    truncated: list[str] = field(default_factory=list)
    flames: Flames | None = None  # None: the inputs hold no stack samples
    triggers: list[Triggered] = field(default_factory=list)  # of the snapshots among the inputs


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


def _combine(traces: Sequence[Trace]) -> tuple[Trace, list[int], list[dict[Any, Any]]]:
    """One Trace of every input, on one time axis, pids kept apart per file.

    Each input's events move by the difference between its wall-clock start
    (``baseTimeNanoseconds``) and the earliest input's when every input has
    one (as ``mxprof merge`` does); otherwise they stay on their own axis. A
    pid two files share becomes ``"<file number>:<pid>"`` in the later file.
    Returns the combined trace, each input's shift and its renamed pids.
    """
    if len(traces) == 1:
        return traces[0], [0], [{}]
    bases = [t.base_time_ns for t in traces]
    known = [b for b in bases if b is not None]
    first = min(known) if len(known) == len(bases) and known else None
    shifts = [b - first if first is not None and b is not None else 0 for b in bases]
    events: list[Event] = []
    renamed: list[dict[Any, Any]] = []
    seen: set[Any] = set()
    process_names: dict[Any, str] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    for k, (trace, shift) in enumerate(zip(traces, shifts)):
        pids = {t.pid for t in trace.events.threads} | set(trace.process_names)
        clash = pids & seen
        seen |= pids
        renamed.append({pid: f"{k}:{pid}" for pid in clash})

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
    return combined, shifts, renamed


def build(paths: Sequence[str], traces: Sequence[Trace]) -> Sections:
    """The report's sections for traces (loaded from paths, in that order)."""
    combined, shifts, renamed = _combine(traces)
    procs = job(traces)
    labels = {renamed[p.source].get(p.pid, p.pid): p.label for p in procs}
    moved = [(p.start + shifts[p.source], p.end + shifts[p.source]) for p in procs if p.events]
    start = min((a for a, _ in moved), default=0)
    end = max((b for _, b in moved), default=0)
    wall = max(end - start, 0)
    every_row = list(combined.key_averages().without_own())  # no profiler's own ranges
    rows = every_row[:TABLE_ROWS]
    phases: Counter[str] = Counter()
    for p in procs:
        phases.update(p.phases)
    counts = {
        "events": len(combined),
        "ranges": sum(len(r) for p in procs for r in p.threads.values()),
        "instants": phases["i"] + phases["n"] + phases["R"],
        "counter samples": phases["C"],
        "unpaired begins/ends": sum(t.unmatched for t in traces),
        "processes": len(procs),
        "threads": sum(len(p.tids) for p in procs),
    }
    # One input: its processes' counters (the model holds them); several: the combined trace's.
    raw = raw_series(combined, start, procs if len(traces) == 1 else None)
    counters = series(labels, raw)
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
    listed = _processes(paths, traces, procs)
    return Sections(
        paths=list(paths),
        traces=list(traces),
        combined=combined,
        wall_ns=wall,
        rows=rows,
        histograms=_histograms(combined, rows),
        processes=listed,
        row_walls=_row_walls(rows, listed),
        steps=_steps(procs),
        counters=[s for s in counters if s.category not in _MEMORY],
        devices=[s for s in counters if s.category == DEVICE_STORAGE],
        scopes=[s for s in counters if s.category == SCOPE_STORAGE],
        peaks=_peaks(procs, shifts, start),
        counts=counts,
        tallies=tallies,
        tallies_missing="" if tallies else _why_no_tallies(traces),
        config=config,
        truncated=[p for p, t in zip(paths, traces) if t.truncated],
        flames=_flames(traces, rows),
        triggers=_triggers(paths, traces, shifts, start, procs),
    )


def _triggers(
    paths: Sequence[str],
    traces: Sequence[Trace],
    shifts: list[int],
    start: int,
    procs: Sequence[TraceProcess],
) -> list[Triggered]:
    """The trigger of each input that is a flight recorder snapshot."""
    out = []
    stepped = _stepped(procs)
    for k, (path, trace) in enumerate(zip(paths, traces)):
        trigger = trigger_of(trace)
        if trigger is None:
            continue
        step = None
        if stepped is not None and stepped.steps is not None:
            t = trigger.at_ns + shifts[k] - shifts[stepped.source]  # onto its own axis
            begun = bisect.bisect_right([e.ts for e in stepped.steps.ranges], t) - 1
            step = stepped.steps.index[begun] if begun >= 0 else None
        out.append(Triggered(path, trigger, float(trigger.at_ns + shifts[k] - start), step))
    return out


def _why_no_tallies(traces: Sequence[Trace]) -> str:
    """Why no input carries the core's tallies: mxprof's own merged file of
    inputs without them is mxprof's, a file of another tool is not."""
    data = [other_data(t) for t in traces]
    if any("merged_from" in d for d in data):
        return "not in the trace (mxprof merge of inputs that held none)"
    if any("mxprof_version" in d for d in data):
        return "not in the trace (written by an mxprof without them)"
    return "not in the trace (not written by mxprof)"


def _peaks(procs: Sequence[TraceProcess], shifts: list[int], start: int) -> list[MemoryPeak]:
    """Each process's device peaks (``trace.processes``), times from the page's start."""
    out = [
        MemoryPeak(
            device=m.device,
            process=p.label,
            peak=m.peak,
            at_ns=float(m.at + shifts[p.source] - start),
            scope=m.holder,
            scope_bytes=dict(m.scopes).get(m.holder) if m.holder else None,
        )
        for p in procs
        for m in p.memory
    ]
    return sorted(out, key=lambda m: (-m.peak, m.device))


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


def _histograms(trace: Trace, rows: Sequence[Row]) -> dict[int, Histogram]:
    wanted = [(r.name, r.category) for r in rows[:HIST_ROWS]]
    out = {}
    for i, key in enumerate(wanted):  # one sorted list of ints at a time (40 bytes a range)
        durations = trace.durations([key]).get(key)
        if durations:
            out[i] = histogram(durations)
    return out


def _processes(
    paths: Sequence[str], traces: Sequence[Trace], procs: Sequence[TraceProcess]
) -> list[Process]:
    out = []
    for p in procs:
        data = other_data(traces[p.source])
        ours = data.get("pid") in (p.pid, None) and len(processes(traces[p.source])) == 1
        out.append(
            Process(
                label=p.label,
                path=paths[p.source],
                pid=p.pid,
                name=p.name,
                threads=len(p.tids),
                ranges=sum(len(r) for r in p.threads.values()),
                wall_ns=p.wall,
                tallies={k: v for k, v in data.items() if k in TALLIES} if ours else None,
                totals=p.totals(),
            )
        )
    return out


def _row_walls(rows: Sequence[Row], procs: Sequence[Process]) -> list[int]:
    """Per row, the wall time of the processes that ran its name: the base of
    its "% of wall", so that a name run by every rank is not counted against
    one rank's wall time (which put it above 100 %)."""
    walls: dict[str, int] = {}
    for p in procs:
        for name in p.totals:
            walls[name] = walls.get(name, 0) + p.wall_ns
    return [walls.get(r.name, 0) for r in rows]


def _stepped(procs: Sequence[TraceProcess]) -> TraceProcess | None:
    """The process whose steps the page plots: the one with the most (ties: the first)."""
    stepped = [p for p in procs if p.steps is not None]
    if not stepped:
        return None
    return max(stepped, key=lambda q: len(q.steps.ranges) if q.steps else 0)


def _steps(procs: Sequence[TraceProcess]) -> Steps | None:
    """The steps of the process with the most (ties: the first), as plotted."""
    p = _stepped(procs)
    if p is None:
        return None
    st = p.steps
    assert st is not None
    totals = {name: sum(column) for name, column in st.children.items()}
    named = sorted(totals, key=lambda n: (-totals[n], n))[:BREAKDOWN_NAMES]
    durations = st.durations
    n = len(durations)
    group = max(1, -(-n // STEP_BARS))
    index, duration = [], []
    parts: dict[str, list[int]] = {name: [] for name in [*named, "other", IN_NO_RANGE]}
    for lo in range(0, n, group):
        ks = range(lo, min(lo + group, n))
        size = len(ks)
        index.append(st.index[lo])
        duration.append(sum(durations[k] for k in ks) // size)
        for name in named:
            parts[name].append(sum(st.children[name][k] for k in ks) // size)
        inside = sum(durations[k] - st.in_no_range[k] for k in ks)
        known = sum(st.children[name][k] for name in named for k in ks)
        parts["other"].append((inside - known) // size)
        parts[IN_NO_RANGE].append(sum(st.in_no_range[k] for k in ks) // size)
    lo_ns, hi_ns = st.span
    data_wait, worker_busy = _data_wait(procs, p, n, group)
    return Steps(
        name=st.name,
        thread=f"{p.thread_label(st.tid)} of {p.label}",
        processes=sum(1 for q in procs if q.steps is not None),
        count=n,
        index=index,
        duration=duration,
        parts={name: v for name, v in parts.items() if any(v)},
        group=group,
        outliers=[(st.index[k], durations[k]) for k in st.outliers[:50]],
        median_ns=st.median,
        threshold_ns=st.threshold,
        in_no_range_ns=sum(st.in_no_range),
        between_ns=sum(st.between),
        span_ns=hi_ns - lo_ns,
        data_wait=data_wait,
        worker_busy=worker_busy,
    )


def _data_wait(
    procs: Sequence[TraceProcess], p: TraceProcess, n: int, group: int
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Per plotted bar of p's steps: DataLoader wait by producing worker, and
    each worker's busy ns (means over a bar's steps); empty without a loader."""
    ld = loader(procs)
    if ld is None or ld.main is not p or len(ld.steps) != n:
        return {}, {}
    wait: dict[str, list[int]] = {}
    busy: dict[str, list[int]] = {}
    who = sorted({w for s in ld.steps for w in s.waited_for})
    for lo in range(0, n, group):
        ks = range(lo, min(lo + group, n))
        for w in who:
            name = f"data wait: worker {w}" if w >= 0 else "data wait: no batch joined"
            total = sum(ld.steps[k].waited_for.get(w, 0) for k in ks)
            wait.setdefault(name, []).append(total // len(ks))
        for w in sorted(ld.workers):
            total = sum(ld.steps[k].busy.get(w, 0) for k in ks)
            busy.setdefault(f"worker {w} busy", []).append(total // len(ks))
    return {k: v for k, v in wait.items() if any(v)}, busy
