"""One model of a job's processes, for every reader after recording.

``processes(trace)`` gives each process of a loaded trace, worked out once
per Trace (and kept while its events are the same list): who it is, its
label, its threads' ranges, its steps with their outliers and time in no
range, its counters and memory peaks, and its wall span.  ``job(traces)``
puts the processes of several inputs (one job) side by side with labels
unique across them.  The report's sections, its hints, ``mxprof ranks`` and
``mxprof merge`` take these answers from here and from nowhere else.

Identity (``Identity``) is read from structured metadata, never from a
display name:

- a rank's own file: ``distributedInfo`` {role, rank, host, pid};
- a merged file: each entry of ``distributedInfo.ranks`` names the pid its
  process has in the merged file (``merged_pid``) beside the pid it was
  recorded with (``pid``).  Files merged before ``merged_pid`` existed are
  joined by ``pid``, where exactly one entry claims it (a merge renumbers a
  pid only when two inputs share it: those processes stay unnamed);
- otherwise the process is known by its pid (and ``otherData.host`` in a
  file of one process).

The label rule (``label``): ``<role> <rank>`` (``worker 1``) when both are
known, else ``pid N``; among several inputs, a process without a rank also
names its file (``pid N (rank3.json)``), and labels that would still be equal
(two inputs of one rank) get ``(pid N)`` or ``(pid N, file)`` added.

A step is a range of a frame or a ``ProfilerStep#N`` (``trace.steps``). A
process's steps are the group, on one thread, of one frame name (every
``ProfilerStep#N`` is one group) with the most ranges (ties: the most time).
The one outlier rule: a step is an outlier when it is longer than the median
plus ``max(OUTLIER_MADS`` x 1.4826 x MAD, ``OUTLIER_MIN_EXCESS`` x the
median): three scaled median absolute deviations is the usual robust fence
(1.4826 x MAD estimates a normal's standard deviation), and the floor of a
fifth of the median keeps it off timer and scheduling jitter when every step
takes the same time (MAD 0).

*In no range*, per step: the part of the step on its thread inside no other
range (the step less its direct children); between two steps: the part of
the gap inside no range of the thread.  Unrecorded work and waits (a queue's
``get`` outside any range) are there; stack samples say which.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import statistics
import weakref
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, count, repeat
from operator import add, eq
from typing import Any

from .._render import is_own
from ._columns import NO_DUR, Events, Ranges, Thread
from ._event import Event, Id
from .model import Trace
from .steps import chosen, step_number
from .steps import group as steps_group
from .tree import by_key

__all__ = [
    "DEVICE_STORAGE",
    "Id",
    "MEMORY_PREFIX",
    "SCOPE_STORAGE",
    "Identity",
    "MemoryPeak",
    "Process",
    "Steps",
    "counter_value",
    "display_name",
    "from_info",
    "job",
    "label",
    "outliers",
    "processes",
    "value_at",
]

OUTLIER_MADS = 3.0
MAD_SCALE = 1.4826  # MAD x this estimates the standard deviation of a normal
OUTLIER_MIN_EXCESS = 0.2  # of the median: an outlier step is longer than 1.2 x it
DEVICE_STORAGE = "Device Storage"  # mxprof's memory counters by device ...
SCOPE_STORAGE = "Scope Storage"  # ... and by scope (README, "The trace file")
MEMORY_PREFIX = "Memory: "  # a device counter's name: "Memory: gpu/0"


@dataclass(frozen=True)
class Identity:
    """Who a process is: its pid in this file, the pid it was recorded with,
    and where known its role (``worker``/``server``), rank and host."""

    pid: Id
    original_pid: Id
    role: str = ""
    rank: int | None = None
    host: str | None = None


def from_info(info: dict[str, Any], pid: Id, original: Any = None) -> Identity:
    """The identity a ``distributedInfo`` (a rank's own, or an entry of a merged
    file's ``ranks``) gives the process with this pid; its role is ``worker``
    when the rank's info names none.

    Example:
        >>> from_info({"role": "server", "rank": 0, "host": "h", "pid": 90}, 3, 90)
        Identity(pid=3, original_pid=90, role='server', rank=0, host='h')
    """
    return Identity(
        pid,
        original if original is not None else pid,
        _text(info.get("role")) or "worker",
        _rank(info.get("rank")),
        _text(info.get("host")),
    )


def label(identity: Identity) -> str:
    """A process's label: ``<role> <rank>`` when both are known, else ``pid N``.

    Example:
        >>> label(Identity(7, 4242, "worker", 1, "hostA")), label(Identity(7, 7))
        ('worker 1', 'pid 7')
    """
    if identity.role and identity.rank is not None:
        return f"{identity.role} {identity.rank}"
    return f"pid {identity.pid}"


def display_name(identity: Identity) -> str:
    """The process name ``mxprof merge`` writes: the label, with the host and
    the pid it was recorded with (a timeline viewer shows only this name).

    Example:
        >>> display_name(Identity(7, 4242, "worker", 1, "hostA"))
        'worker 1 (hostA, pid 4242)'
    """
    where = [w for w in (identity.host, f"pid {identity.original_pid}") if w]
    return f"{label(identity)} ({', '.join(where)})"


@dataclass
class Steps:
    """A process's steps (see the module docstring), in time order; times in ns.

    ``children[name][k]`` is step k's time in direct child ranges of that
    name on the step's thread (by column: one array per name, so that many
    steps cost 8 bytes a step and name); ``in_no_range[k]`` its time in none;
    ``between[k]`` the time in no range between step k and step k + 1.
    """

    name: str
    category: str
    tid: Id
    ranges: list[Event]
    positions: Sequence[int]  # the steps' places in their thread's columns (trace/_columns.py)
    index: list[int]
    children: dict[str, array[int]]
    in_no_range: array[int]
    between: array[int]
    median: float
    threshold: float
    outliers: list[int]  # positions in ranges, longest first

    @property
    def durations(self) -> list[int]:
        return [e.dur or 0 for e in self.ranges]

    @property
    def span(self) -> tuple[int, int]:
        """The first step's start to the last one's end (gaps between steps included)."""
        got: tuple[int, int] | None = self.__dict__.get("_span_cache")
        if got is None:
            got = self.__dict__["_span_cache"] = (
                self.ranges[0].ts,
                max(e.ts + (e.dur or 0) for e in self.ranges),
            )
        return got

    def position(self, t: int) -> int | None:
        """The position (in ``ranges``) of the step open at instant t, None between steps."""
        starts = self._starts()
        k = bisect.bisect_right(starts, t) - 1
        return k if k >= 0 and t < self.ranges[k].end else None

    def _starts(self) -> list[int]:
        got: list[int] | None = self.__dict__.get("_starts_cache")
        if got is None:
            got = self.__dict__["_starts_cache"] = [e.ts for e in self.ranges]
        return got


@dataclass(frozen=True)
class MemoryPeak:
    """A device's peak of bytes in use in one process and the scopes in use then.

    ``scopes`` are the process's scopes with bytes in use at the peak, most
    first.  A scope's counter adds up its bytes on every device, so
    ``holder`` (the scope holding most of the peak) is named only when the
    process has one device.
    """

    device: str
    peak: float
    at: int  # ns on the trace's axis
    tid: Id
    last: float  # bytes in use at the device's last sample
    scopes: tuple[tuple[str, float], ...]
    holder: str | None


@dataclass
class Process:
    """One process of a loaded trace: see the module docstring."""

    identity: Identity
    label: str
    name: str | None  # its process name in the file
    file: str  # its file's name (basename), or "trace N"
    source: int  # the index of its trace among the inputs (0 for one trace)
    start: int  # its first event's start, ns
    end: int  # its last event's end, ns
    events: int  # its events, every phase
    tids: set[Id] = field(default_factory=set)  # threads with an event
    phases: dict[str, int] = field(default_factory=dict)  # events that are not ranges, by ph
    threads: dict[Id, Ranges] = field(default_factory=dict)  # ranges, in ts order
    thread_names: dict[Id, str] = field(default_factory=dict)
    counters: dict[tuple[str, str], list[Event]] = field(default_factory=dict)  # time order
    steps: Steps | None = None
    memory: list[MemoryPeak] = field(default_factory=list)
    _durations: dict[tuple[str, str], array[int]] | None = field(default=None, repr=False)
    # The trace whose events these are, weakly (the model is kept per trace in
    # a WeakKeyDictionary: a strong reference would keep every trace alive):
    # its per-thread walk (Trace.per_thread) gives durations() and totals()
    # without another pass over the ranges.
    _trace: weakref.ref[Trace] | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        # Sent to or from a worker (``mxprof.trace.engine``) without its trace:
        # a weak reference does not pickle, and the copy's walk is its own.
        return {**self.__dict__, "_trace": None}

    @property
    def pid(self) -> Id:
        return self.identity.pid

    @property
    def role(self) -> str:
        return self.identity.role

    @property
    def rank(self) -> int | None:
        return self.identity.rank

    @property
    def wall(self) -> int:
        """Its wall span: first event's start to last event's end (0 without events)."""
        return max(self.end - self.start, 0)

    def thread_label(self, tid: Id) -> str:
        """``thread 'name' (tid N)``, or ``tid N`` for a thread without a name."""
        name = self.thread_names.get(tid)
        return f"thread '{name}' (tid {tid})" if name else f"tid {tid}"

    def step_at(self, t: int) -> int | None:
        """The number of the step open at instant t (None: no steps, or between them)."""
        if self.steps is None:
            return None
        k = self.steps.position(t)
        return None if k is None else self.steps.index[k]

    def no_range(self) -> list[tuple[int, int]]:
        """The spans, on the steps' thread from the first step's start to the
        last one's end, inside no range but the steps (the time in no range of
        ``Steps``, as spans in time order); [] without steps."""
        s = self.steps
        if s is None:
            return []
        lo, hi = s.span
        covered: list[list[int]] = []
        for _, _, ts, end, _ in _fitting(self, s):
            a, b = max(ts, lo), min(end, hi)
            if b <= a:
                continue
            if covered and a <= covered[-1][1]:
                covered[-1][1] = max(covered[-1][1], b)
            else:
                covered.append([a, b])
        out: list[tuple[int, int]] = []
        at = lo
        for a, b in covered:
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < hi:
            out.append((at, hi))
        return out

    def durations(self) -> dict[tuple[str, str], array[int]]:
        """Every range's duration by (name, category), each array (int64) sorted."""
        if self._durations is None:
            # Past int64 ns (a damaged file: its columns are lists): lists hold them.
            wide = any(isinstance(r.thread.dur, list) for r in self.threads.values())
            make: Any = list if wide else (lambda values: array("q", values))
            found: dict[tuple[str, str], list[Sequence[int]]] = {}
            for (name, category, _), runs in self._runs().items():
                found.setdefault((name, category), []).extend(runs)
            # Sorted one name at a time: a list of ints per range (40 bytes
            # each) is held for one name only.
            self._durations = {
                key: make(sorted(runs[0] if len(runs) == 1 else chain.from_iterable(runs)))
                for key, runs in found.items()
            }
        return self._durations

    def totals(self) -> dict[str, int]:
        """Total ns in ranges by name, the profiler's own ranges left out."""
        out: dict[str, int] = {}
        for (name, category, _), runs in self._runs().items():
            if not is_own(category, name):
                out[name] = out.get(name, 0) + sum(map(sum, runs))
        return out

    def _runs(self) -> dict[tuple[str, str, str], list[Sequence[int]]]:
        """Per (name, category, phase) of ranges, their durations: one run per
        thread, in ts order, from the trace's walk of each thread
        (``Trace.per_thread``, shared with its statistics: read, never changed)."""
        trace = self._trace() if self._trace is not None else None
        walked = trace.per_thread() if trace is not None else {}
        out: dict[tuple[str, str, str], list[Sequence[int]]] = {}
        for ranges in self.threads.values():
            t = ranges.thread
            mine = walked.get(id(t))
            if mine is None:  # a process made without its trace
                mine = by_key(t.ts, t.dur, t.kind, t.extras, NO_DUR)
            names, categories, phases = t.keys.names, t.keys.categories, t.keys.phases
            for k, (lengths, _) in mine.items():
                out.setdefault((names[k], categories[k], phases[k]), []).append(lengths)
        return out

    def devices(self) -> Iterator[tuple[str, list[Event]]]:
        """(device, its memory counter's samples) for each device, by name."""
        for (category, name), samples in sorted(self.counters.items()):
            if category == DEVICE_STORAGE and name.startswith(MEMORY_PREFIX):
                yield name[len(MEMORY_PREFIX) :], samples

    def scopes(self) -> Iterator[tuple[str, list[Event]]]:
        """(scope, its counter's samples) for each memory scope, by name."""
        for (category, name), samples in sorted(self.counters.items()):
            if category == SCOPE_STORAGE:
                yield name, samples


def counter_value(event: Event) -> float | None:
    """A counter sample's value: its arg named like the counter, else its only number.

    Example:
        >>> from mxprof.trace import Event
        >>> counter_value(Event("q", "", "C", ts=0, pid=1, tid=1, args={"q": 3}))
        3.0
    """
    value = event.args.get(event.name)
    if value is None:
        numbers = [v for v in event.args.values() if isinstance(v, (int, float))]
        value = numbers[0] if len(numbers) == 1 else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def value_at(samples: Sequence[Event], t: int) -> float:
    """A counter's value at instant t: its last sample at or before t (0 before any)."""
    lo, hi = 0, len(samples)
    while lo < hi:
        mid = (lo + hi) // 2
        if samples[mid].ts <= t:
            lo = mid + 1
        else:
            hi = mid
    return (counter_value(samples[lo - 1]) or 0.0) if lo else 0.0


def outliers(durations: Sequence[int]) -> tuple[float, float, list[int]]:
    """(median, threshold, positions of the steps longer than it, longest first):
    the one outlier rule of the module docstring.

    Example:
        >>> median, threshold, found = outliers([8] * 5 + [11] + [8] * 4)
        >>> median, round(threshold, 1), found
        (8.0, 9.6, [5])
    """
    if not durations:
        return 0.0, 0.0, []
    median = float(statistics.median(durations))
    mad = statistics.median(abs(d - median) for d in durations)
    threshold = median + max(OUTLIER_MADS * MAD_SCALE * mad, OUTLIER_MIN_EXCESS * median)
    found = [k for k, d in enumerate(durations) if d > threshold]
    found.sort(key=lambda k: (-durations[k], k))
    return median, threshold, found


# ---- building the model ----

_CACHE: weakref.WeakKeyDictionary[Trace, tuple[Events, tuple[Process, ...]]] = (
    weakref.WeakKeyDictionary()
)


def processes(trace: Trace) -> tuple[Process, ...]:
    """The trace's processes (pids with events or a name), by pid order in the file.

    Worked out on first use and kept while ``trace.events`` is the same list.

    Example:
        >>> import mxprof
        >>> [p.label for p in processes(mxprof.load("merged.json"))]  # doctest: +SKIP
        ['worker 0', 'worker 1', 'server 0']
    """
    events = trace.events
    got = _CACHE.get(trace)
    if got is not None and got[0] is events:
        return got[1]
    built = tuple(_build(trace, events))
    _CACHE[trace] = (events, built)
    return built


def job(traces: Sequence[Trace]) -> list[Process]:
    """The processes of several inputs of one job, labels unique across them.

    With one input these are ``processes(trace)`` themselves; with several,
    copies whose ``source`` is their input's index and whose label names the
    file where it has no rank (and where two would read the same).
    """
    if len(traces) == 1:
        return list(processes(traces[0]))
    return in_job([processes(t) for t in traces], [_file(t, i) for i, t in enumerate(traces)])


def in_job(inputs: Sequence[Sequence[Process]], files: Sequence[str]) -> list[Process]:
    """``job``'s copies and labels of several inputs' processes, given each
    input's processes and file name (an analysis that read its inputs apart,
    one per worker: ``mxprof.trace.engine``)."""
    out: list[Process] = []
    for i, (procs, file) in enumerate(zip(inputs, files)):
        for p in procs:
            name = p.label if p.rank is not None and p.role else f"{p.label} ({file})"
            out.append(dataclasses.replace(p, source=i, label=name, file=file))
    _unique(out, lambda p: f"pid {p.pid}, {p.file}")
    return out


def _unique(procs: list[Process], detail: Any) -> None:
    """Labels equal across processes get detail(p) added, in brackets."""
    seen: dict[str, int] = {}
    for p in procs:
        seen[p.label] = seen.get(p.label, 0) + 1
    for p in procs:
        if seen[p.label] > 1:
            p.label = f"{p.label} ({detail(p)})"


def _file(trace: Trace, i: int) -> str:
    return os.path.basename(trace.path) if trace.path else f"trace {i + 1}"


def _build(trace: Trace, events: Events) -> list[Process]:
    mine: dict[Id, Process] = {}
    groups: dict[Id, dict[tuple[Id, str, str], list[int]]] = {}
    file = _file(trace, 0)
    keys = events.keys
    # Per key index: the group of steps its ranges belong to (a frame's name,
    # or every ProfilerStep#N together), or None; worked out once per key.
    step_group: list[tuple[str, str] | None] = []
    for thread in events.threads:  # sorted by pid, tid: one thread after another
        p = mine.get(thread.pid)
        if p is None:
            p = mine[thread.pid] = Process(
                Identity(thread.pid, thread.pid), "", None, file, 0, thread.ts[0], thread.ts[0], 0
            )
            p._trace = weakref.ref(trace)
            groups[thread.pid] = {}
        p.events += len(thread)
        p.tids.add(thread.tid)
        if thread.ts[0] < p.start:
            p.start = thread.ts[0]
        # The last end: of the ranges, ts + dur; points end where they start.
        last = max(map(add, thread.ts, thread.dur))  # a point's is far below its ts
        if thread.ranges < len(thread):
            phases, counters = p.phases, p.counters
            for i in compress(count(), map(eq, thread.dur, repeat(NO_DUR))):
                e = thread.event(i)
                phases[e.ph] = phases.get(e.ph, 0) + 1
                if e.ph == "C":
                    counters.setdefault((e.category, e.name), []).append(e)
            # The points' latest start is the last one's (ts order).
            last = max(last, e.ts)
        if last > p.end:
            p.end = last
        if not thread.ranges:
            continue
        p.threads[thread.tid] = Ranges(thread)
        while len(step_group) < len(keys.names):
            k = len(step_group)
            step_group.append(steps_group(keys.names[k], keys.categories[k]))
        wanted = {k for k, g in enumerate(step_group) if g is not None}
        if not wanted:
            continue
        raw = wanted | {-(j + 1) for j, (k, _) in enumerate(thread.extras) if k in wanted}
        mine_groups = groups[thread.pid]
        lengths = thread.dur
        for i in compress(count(), map(raw.__contains__, thread.kind)):
            if lengths[i] == NO_DUR:
                continue
            group = step_group[thread.key(thread.kind[i])]
            assert group is not None
            mine_groups.setdefault((thread.tid, *group), []).append(i)
    for pid in trace.process_names:
        if pid not in mine:  # named, but no event: a process that recorded nothing
            mine[pid] = Process(Identity(pid, pid), "", None, file, 0, 0, 0, 0)
            groups[pid] = {}
    identities = identities_of(
        trace.metadata, list(mine), [pid for pid, p in mine.items() if p.events]
    )
    for pid, p in mine.items():
        p.identity = identities.get(pid, p.identity)
        p.label = label(p.identity)
        p.name = trace.process_names.get(pid)
        p.thread_names = {t: n for (q, t), n in trace.thread_names.items() if q == pid}
        for samples in p.counters.values():
            samples.sort(key=lambda e: e.ts)
        p.steps = _steps(p, groups[pid])
        p.memory = _memory(p)
    procs = list(mine.values())
    _unique(procs, lambda p: f"pid {p.pid}")
    return procs


def _rank(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def identities_of(meta: dict[str, Any], pids: list[Id], active: list[Id]) -> dict[Id, Identity]:
    """Identity of each pid a trace's metadata names (see the module
    docstring): the one reading of ``distributedInfo`` and ``otherData.host``
    for every consumer (the process model, the Parquet form's columns).

    Args:
        meta: the trace's metadata (``Trace.metadata``).
        pids: the trace's processes.
        active: those with events (a rank's info is its one process's).
    """
    out: dict[Id, Identity] = {}
    info = meta.get("distributedInfo")
    other = meta.get("otherData")
    host = _text(other.get("host")) if isinstance(other, dict) else None
    own = other.get("pid") if isinstance(other, dict) else None
    if isinstance(info, dict) and "rank" in info:  # a rank's own file
        recorded = info.get("pid", own)
        pid = recorded if recorded in active else (active[0] if len(active) == 1 else None)
        if pid is not None:
            found = from_info(info, pid, recorded)
            out[pid] = dataclasses.replace(found, host=found.host or host)
    entries = info.get("ranks") if isinstance(info, dict) else None
    if isinstance(entries, list):  # a merged file
        entries = [r for r in entries if isinstance(r, dict)]
        claims: dict[Any, int] = {}
        for r in entries:
            if "merged_pid" not in r:
                claims[r.get("pid")] = claims.get(r.get("pid"), 0) + 1
        for r in entries:
            pid = r.get("merged_pid")
            if "merged_pid" not in r and claims.get(r.get("pid")) == 1:
                pid = r.get("pid")  # merged before merged_pid: its pid, if it was kept
            if pid in pids and pid not in out:
                out[pid] = from_info(r, pid, r.get("pid"))
    if host is not None and len(pids) == 1 and pids[0] not in out and own in (pids[0], None):
        out[pids[0]] = Identity(pids[0], pids[0], host=host)
    return out


def _steps(p: Process, groups: dict[tuple[Id, str, str], list[int]]) -> Steps | None:
    if not groups:
        return None

    def measure(tid: Id, positions: list[int]) -> tuple[int, int]:
        lengths = p.threads[tid].thread.dur
        return len(positions), sum(lengths[i] for i in positions)

    # groups: in thread order, then by first start (the order chosen expects)
    tid, name, category = chosen({key: measure(key[0], found) for key, found in groups.items()})
    positions = groups[tid, name, category]
    thread = p.threads[tid].thread
    ranges = [thread.event(i) for i in positions]  # in ts order: positions ascend
    index = [step_number(e, k) for k, e in enumerate(ranges)]
    durations = [e.dur or 0 for e in ranges]
    steps = Steps(
        name=name,
        category=category,
        tid=tid,
        ranges=ranges,
        positions=array("q", positions),
        index=index,
        children={},
        in_no_range=array("q"),
        between=array("q"),
        median=0.0,
        threshold=0.0,
        outliers=[],
    )
    children = steps.children
    inside = [0] * len(ranges)
    between = [0] * max(len(ranges) - 1, 0)
    covered_gap = [0] * len(between)
    starts = steps._starts()
    ends = [e.end for e in ranges]
    names = thread.keys.names
    for k, in_step, length, key in _direct(thread, steps):
        if in_step:
            column = children.get(names[key])
            if column is None:
                column = children[names[key]] = array("q", bytes(8 * len(ranges)))
            column[k] += length
            inside[k] += length
        else:
            covered_gap[k] += length
    steps.in_no_range = array("q", (max(d - i, 0) for d, i in zip(durations, inside)))
    for k in range(len(between)):
        between[k] = max(starts[k + 1] - ends[k] - covered_gap[k], 0)
    steps.between = array("q", between)
    steps.median, steps.threshold, steps.outliers = outliers(durations)
    return steps


def _direct(thread: Thread, steps: Steps) -> Iterator[tuple[int, bool, int, int]]:
    """The ranges on the steps' thread that count in ``Steps``: (k, whether a
    direct child of step k, its length, its key index); not a child, a
    top-level range in the gap between steps k and k + 1. In ts order.

    A direct child of a step starts at or after the end of the step's
    previous direct child (a range that starts inside that one is below it,
    or overlaps it and is counted in neither), and fits in the step; a
    zero-length range inside the step counts wherever it starts (a child of
    length 0: its name gets a column).  Between steps k and k + 1, a range
    counts when it fits in the gap and starts at or after the end of the
    last one counted there.  The same rules as ``_fitting``'s walk applied
    range by range, but the ranges that start inside a counted range are
    stepped over by bisection on the sorted ``ts`` column (the zero-length
    ones among them looked up in a list of their own): the walk visits a
    step's direct children, not every range below them.
    """
    starts = steps._starts()
    ends = [e.end for e in steps.ranges]
    is_step = set(steps.positions)
    ts_col, dur_col, kind_col = thread.ts, thread.dur, thread.kind
    extras = thread.extras
    last = len(starts) - 1
    n = len(ts_col)
    # Where a skip past ranges inside step k (or the gap after it) ends at the
    # latest: the next step's position (its ts is where the skip stops).
    bound = [*steps.positions[1:], n]
    # Before the first step nothing counts; after the last one ends, nothing.
    i = bisect.bisect_left(ts_col, starts[0])
    k = -1
    zeros: list[int] | None = None  # positions of the zero-length ranges, when first needed
    while i < n:
        d = dur_col[i]
        if d == NO_DUR or i in is_step:
            i += 1
            continue
        t = ts_col[i]
        while k < last and starts[k + 1] <= t:
            k += 1  # the last step that starts at or before t
        if k == last and t >= ends[k]:
            break
        end = t + d
        # No range that starts at or after `stop` is skipped: the next step is there.
        stop = starts[k + 1] if k < last else ends[k]
        if t < ends[k]:  # starts inside step k
            if end > ends[k]:
                i += 1
                continue
            kk = kind_col[i]
            yield k, True, d, (kk if kk >= 0 else extras[-kk - 1][0])
            if d == 0:
                i += 1
                continue
            # Past the ranges that start inside this child: none is a direct
            # child, but a zero-length one (above).
            j = bisect.bisect_left(ts_col, min(end, stop), i + 1, bound[k])
            if zeros is None:
                zeros = list(compress(count(), map(eq, dur_col, repeat(0))))
            z = bisect.bisect_right(zeros, i)
            while z < len(zeros) and zeros[z] < j:
                if zeros[z] not in is_step:
                    kk = kind_col[zeros[z]]
                    yield k, True, 0, (kk if kk >= 0 else extras[-kk - 1][0])
                z += 1
            i = j
        elif end <= stop:  # within the gap after step k (k < last here)
            kk = kind_col[i]
            yield k, False, d, (kk if kk >= 0 else extras[-kk - 1][0])
            i = bisect.bisect_left(ts_col, end, i + 1, bound[k]) if d > 0 else i + 1
        else:
            i += 1


def _fitting(p: Process, steps: Steps) -> Iterator[tuple[int, bool, int, int, int]]:
    """The ranges on the steps' thread, other than the steps, that fit in a
    step or in the time before, between or after steps: (k, whether inside
    step k, ts, end, key index), in ts order (a parent before its children).
    k is the last step that starts at or before the range (-1: none); not
    inside it, the range lies in the gap after step k. The one walk behind
    a step's children and ``Process.no_range``.
    """
    starts = steps._starts()
    ends = [e.end for e in steps.ranges]
    is_step = set(steps.positions)
    k, last = -1, len(starts) - 1
    for i, ts, d, key in p.threads[steps.tid].thread.range_columns():
        if i in is_step:
            continue
        end = ts + d
        while k < last and starts[k + 1] <= ts:
            k += 1  # the last step that starts at or before ts
        if k >= 0 and ts < ends[k]:  # starts inside step k
            if end <= ends[k]:
                yield k, True, ts, end, key
        elif k == last or end <= starts[k + 1]:  # within the gap after step k
            yield k, False, ts, end, key


def _memory(p: Process) -> list[MemoryPeak]:
    devices = list(p.devices())
    scopes = list(p.scopes())
    out = []
    for device, samples in devices:
        values = [counter_value(e) or 0.0 for e in samples]
        k = max(range(len(values)), key=values.__getitem__)  # the first sample at the peak
        at = samples[k].ts
        held = sorted(((value_at(s, at), name) for name, s in scopes), reverse=True)
        kept = tuple((name, v) for v, name in held if v > 0)
        out.append(
            MemoryPeak(
                device=device,
                peak=values[k],
                at=at,
                tid=samples[k].tid,
                last=values[-1],
                scopes=kept,
                holder=kept[0][0] if kept and len(devices) == 1 else None,
            )
        )
    out.sort(key=lambda m: (-m.peak, m.device))
    return out
