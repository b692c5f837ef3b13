"""A loaded trace: events in ns, thread names, statistics, filtering, call trees.

Times move from the file's microseconds to integer nanoseconds on the file's
own axis: ``ts`` is ``ts_us * 1000`` rounded from the exact value of the number
in the file, and a range's end is rounded the same way from ``ts + dur``, so
ranges nested in the file stay nested after rounding.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union, overload

from ..averages import KeyAverages, Row
from .reader import PathArg, RawEvent, read_raw
from .samples import Samples  # HOOK(samples)
from .samples import split as split_samples  # HOOK(samples)
from .tree import CallTree, build_tree, structure

Id = Union[int, str]
ThreadKey = tuple[Id, Id]

_RANGE_PHASES = frozenset("XBEbe")
# Phases kept besides ranges, and what they become ('I' is the old name of 'i').
_POINT_PHASES = {"i": "i", "I": "i", "n": "n", "R": "R", "C": "C"}
_PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Event:
    """One range, instant or counter sample, times in ns on the trace's own axis.

    ``ph`` is ``'X'`` for every range, whatever phases it was written as (X,
    a B/E pair, a b/e pair); ``dur`` is None for events that are not ranges.
    ``pid`` and ``tid`` are as in the file (Kineto writes some as strings).

    Example:
        >>> e = Event("step", "train", "X", ts=1_000, dur=500, pid=1, tid=1, args={})
        >>> e.end
        1500
    """

    name: str
    category: str
    ph: str
    ts: int
    dur: int | None
    pid: Id
    tid: Id
    args: dict[str, Any]

    @property
    def end(self) -> int:
        """ts + dur in ns (ts for events that are not ranges)."""
        return self.ts + (self.dur or 0)


def load(path: PathArg) -> Trace:
    """Load a trace file: Chrome JSON (mxprof's, torch.profiler's, viztracer's, ...),
    gzip-compressed or not, or the Perfetto protobuf mxprof writes.

    A file cut short loads everything complete before the cut, with
    ``Trace.truncated`` set; see ``read_raw`` for the forms accepted.

    Raises:
        TraceReadError: the path cannot be read (missing, a directory, no
            permission, a name too long, a NUL byte or lone surrogate in it);
            both a TraceFormatError and an OSError, ``errno`` says why.
        TraceFormatError: empty, not JSON, or JSON that is not a trace.

    Example:
        >>> trace = mxprof.load("trace.json")  # doctest: +SKIP
        >>> print(trace.filter(category="train").table(sort_by="self"))  # doctest: +SKIP
    """
    events, metadata, truncated = read_raw(path)
    return Trace.from_raw(events, metadata=metadata, truncated=truncated, path=os.fspath(path))


def base_time_ns(metadata: dict[str, Any]) -> int | None:
    """Wall-clock time of a trace's ts 0 in ns since the epoch, from its metadata.

    mxprof and Kineto write a top-level ``baseTimeNanoseconds``; viztracer
    writes it inside ``viztracer_metadata``.  None when neither is there.

    Example:
        >>> base_time_ns({"viztracer_metadata": {"baseTimeNanoseconds": 5}})
        5
    """
    value = metadata.get("baseTimeNanoseconds")
    nested = metadata.get("viztracer_metadata")
    if value is None and isinstance(nested, dict):
        value = nested.get("baseTimeNanoseconds")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def _order(event: Event) -> tuple[str, str, int, int]:
    return (str(event.pid), str(event.tid), event.ts, -(event.dur or 0))


class Trace(Sequence[Event]):
    """The ranges, instants and counter samples of a trace, sorted per thread.

    ``events`` is ordered by ``(str(pid), str(tid), ts, -dur)``, ties in file
    order; metadata ('M') events are not in it but fill ``process_names`` (pid
    -> name) and ``thread_names`` ((pid, tid) -> name). ``unmatched`` counts
    B/E and b/e events left without a partner (dropped).

    Example:
        >>> trace = mxprof.load("trace.json")  # doctest: +SKIP
        >>> [row.name for row in trace.key_averages()]  # doctest: +SKIP
        ['outer', 'inner']
    """

    def __init__(
        self,
        events: Iterable[Event],
        *,
        metadata: dict[str, Any] | None = None,
        truncated: bool = False,
        process_names: dict[Id, str] | None = None,
        thread_names: dict[ThreadKey, str] | None = None,
        path: str | None = None,
        unmatched: int = 0,
    ) -> None:
        self.events: list[Event] = sorted(events, key=_order)
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        self.truncated = truncated
        self.process_names: dict[Id, str] = process_names if process_names is not None else {}
        self.thread_names: dict[ThreadKey, str] = thread_names if thread_names is not None else {}
        self.path = path
        self.unmatched = unmatched
        # (parent index, self ns) per event; computed on first use. A subset
        # carries its source's, so filtering never changes a range's self time.
        self._structure: tuple[list[int], list[int]] | None = None
        self.samples = Samples()  # HOOK(samples): stack samples (trace/samples.py)

    @classmethod
    def from_raw(
        cls,
        events: Iterable[RawEvent],
        *,
        metadata: dict[str, Any] | None = None,
        truncated: bool = False,
        path: str | None = None,
    ) -> Trace:
        """A Trace from raw event dicts (``read_raw``'s), pairing B/E and b/e.

        Events that cannot be placed (no valid ``ts``) and phases other than
        ranges, instants and counters (flows, samples, objects) are left out.

        Example:
            >>> t = Trace.from_raw([{"ph": "B", "name": "a", "ts": 1, "pid": 1, "tid": 1},
            ...                     {"ph": "E", "ts": 3, "pid": 1, "tid": 1}])
            >>> t[0].ph, t[0].ts, t[0].dur
            ('X', 1000, 2000)
        """
        converted = _Converter()
        events, samples = split_samples(events)  # HOOK(samples)
        for seq, raw in enumerate(events):
            converted.add(seq, raw)
        trace = cls(
            converted.finish(),
            metadata=metadata,
            truncated=truncated,
            process_names=converted.process_names,
            thread_names=converted.thread_names,
            path=path,
            unmatched=converted.unmatched,
        )
        trace.samples = samples  # HOOK(samples)
        return trace

    @property
    def base_time_ns(self) -> int | None:
        """Wall-clock time of ts 0 in ns since the epoch, when the file says."""
        return base_time_ns(self.metadata)

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        return self.events[index]

    def __repr__(self) -> str:
        return f"Trace({self.path!r}, {len(self.events)} events{', truncated' * self.truncated})"

    def _parts(self) -> tuple[list[int], list[int]]:
        if self._structure is None:
            self._structure = structure(self.events)
        return self._structure

    def _subset(self, keep: list[int]) -> Trace:
        """The events at indices keep (ascending), with parents re-linked past the dropped."""
        parents, selfs = self._parts()
        new_index = {old: new for new, old in enumerate(keep)}
        new_parents = []
        for old in keep:
            p = parents[old]
            while p >= 0 and p not in new_index:
                p = parents[p]
            new_parents.append(new_index.get(p, -1))
        subset = Trace.__new__(Trace)
        subset.__dict__.update(self.__dict__)
        subset.events = [self.events[i] for i in keep]
        subset._structure = (new_parents, [selfs[i] for i in keep])
        return subset

    def filter(
        self,
        name: str | Collection[str] | None = None,
        category: str | Collection[str] | None = None,
        thread: Id | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> Trace:
        """The events that match every criterion given, as a new Trace.

        Args:
            name: an exact name, or a collection of names.
            category: an exact category (``"train,frame"`` is one category), or
                a collection of them.
            thread: a tid as in the file, or a thread name (matched against
                ``thread_names``).
            start: ns on the trace's ts axis; keeps events that end at or after it.
            end: ns on the trace's ts axis; keeps events that start at or before it.
                Ranges overlapping ``[start, end]`` are kept whole.

        Returns:
            A Trace sharing this one's metadata and names. Self times and
            nesting stay those of the whole trace: a range keeps its self time
            when its children are filtered out, and ``tree()`` links each
            range to its nearest kept ancestor.

        Example:
            >>> trace.filter(name={"forward", "backward"}, thread="MainThread",
            ...              start=0, end=5_000_000).key_averages()  # doctest: +SKIP
        """
        names = _as_set(name, "name")
        categories = _as_set(category, "category")
        threads = None
        if thread is not None:
            if isinstance(thread, bool) or not isinstance(thread, (int, str)):
                raise TypeError(f"thread must be a tid or a thread name, got {thread!r}")
            threads = {k for k, v in self.thread_names.items() if v == thread}
        keep = [
            i
            for i, e in enumerate(self.events)
            if (names is None or e.name in names)
            and (categories is None or e.category in categories)
            and (threads is None or e.tid == thread or (e.pid, e.tid) in threads)
            and (start is None or e.end >= start)
            and (end is None or e.ts <= end)
        ]
        return self._subset(keep)

    def key_averages(self) -> KeyAverages:
        """One row per (name, category) of ranges, in ns, largest total first.

        ``self`` sums the ranges' self times (duration less direct children).
        Percentiles are exact, by the nearest-rank rule: P is the duration at
        1-based rank ceil(P/100 * count) of the sorted durations.  The live
        core's (``dumps()``, ``profile().key_averages()``) follow the same
        rule from a histogram, within 0.79 % of these (``mxprof.averages``).

        Example:
            >>> row = trace.key_averages()[0]  # doctest: +SKIP
            >>> row.name, row.count, row.total, row.p50  # doctest: +SKIP
            ('outer', 2, 8000000, 4000000)
        """
        _, selfs = self._parts()
        groups: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
        for i, event in enumerate(self.events):
            if event.dur is not None:
                durations, self_times = groups.setdefault((event.name, event.category), ([], []))
                durations.append(event.dur)
                self_times.append(selfs[i])
        rows = []
        for (name, category), (durations, self_times) in groups.items():
            durations.sort()
            count, total, least, most = len(durations), sum(durations), durations[0], durations[-1]
            p50, p90, p99 = (_nearest_rank(durations, p) for p in _PERCENTILES)
            rows.append(
                Row(name, category, count, total, sum(self_times), least, most, p50, p90, p99)
            )
        return KeyAverages(rows).sorted("total")

    def table(self, sort_by: str = "total", row_limit: int | None = 100) -> str:
        """``key_averages().table(...)``: the statistics as a text table.

        Example:
            >>> print(mxprof.load("trace.json").table(sort_by="self"))  # doctest: +SKIP
        """
        return self.key_averages().table(sort_by=sort_by, row_limit=row_limit)

    def tree(self) -> CallTree:
        """The ranges merged into per-thread call trees (see ``CallTree``).

        Example:
            >>> print(mxprof.load("trace.json").tree())  # doctest: +SKIP
        """
        parents, selfs = self._parts()
        return build_tree(self.events, parents, selfs, self.thread_names)


def _as_set(value: str | Collection[str] | None, what: str) -> Collection[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return {value}
    if not all(isinstance(v, str) for v in value):
        raise TypeError(f"{what} must be a str or a collection of str, got {value!r}")
    return set(value)


def _nearest_rank(ordered: list[int], percent: int) -> int:
    rank = -(-percent * len(ordered) // 100)  # ceil without floats
    return ordered[max(rank, 1) - 1]


def ns_ratio(value: object) -> tuple[int, int] | None:
    """A time in µs from the file as an exact fraction of ns (numerator,
    denominator), or None if it is none.  ``load`` and ``merge`` both read
    times through it, so that they round alike.

    Example:
        >>> ns_ratio(1.5), ns_ratio("2"), ns_ratio(None)
        ((3000, 2), (2000, 1), None)
    """
    if type(value) is str:
        try:
            value = float(value)
        except ValueError:
            return None
    if type(value) is float:
        if not math.isfinite(value):
            return None
        num, den = value.as_integer_ratio()
        return num * 1000, den
    if isinstance(value, int) and not isinstance(value, bool):
        return value * 1000, 1
    return None


def round_ratio(num: int, den: int) -> int:
    """num / den (den > 0) rounded to the nearest integer, halves up: a
    rounding that never decreases as num grows, so nesting survives it.

    Example:
        >>> round_ratio(*ns_ratio(0.0015)), round_ratio(5, 2)
        (2, 3)
    """
    return (2 * num + den) // (2 * den)


def _ident(value: object) -> Id:
    """A pid or tid as in the file, made hashable; a whole float becomes an int."""
    if type(value) is int or type(value) is str:
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return "" if value is None else json.dumps(value, sort_keys=True)


class _Converter:
    """Turns raw events into Events: pairs B/E per thread and b/e per async id."""

    def __init__(self) -> None:
        self.done: list[tuple[int, Event]] = []
        self.paired: list[tuple[int, int, RawEvent]] = []
        self.process_names: dict[Id, str] = {}
        self.thread_names: dict[ThreadKey, str] = {}
        self.unmatched = 0

    def add(self, seq: int, raw: RawEvent) -> None:
        ph = raw.get("ph")
        if ph == "M":
            self._metadata(raw)
            return
        if type(ph) is not str or (ph not in _RANGE_PHASES and ph not in _POINT_PHASES):
            return
        ts = ns_ratio(raw.get("ts"))
        if ts is None:
            return
        start = round_ratio(*ts)
        if ph != "X" and ph in _RANGE_PHASES:
            self.paired.append((start, seq, raw))
            return
        dur = None
        if ph == "X":
            length = ns_ratio(raw.get("dur", 0)) or (0, 1)
            # Round the end, not the length, so that nesting survives rounding.
            end = round_ratio(ts[0] * length[1] + length[0] * ts[1], ts[1] * length[1])
            dur = max(end - start, 0)
        self.done.append((seq, _event(raw, "X" if ph == "X" else _POINT_PHASES[ph], start, dur)))

    def _metadata(self, raw: RawEvent) -> None:
        args = raw.get("args")
        name = args.get("name") if isinstance(args, dict) else None
        if not isinstance(name, str):
            return
        pid = _ident(raw.get("pid", 0))
        if raw.get("name") == "process_name":
            self.process_names[pid] = name
        elif raw.get("name") == "thread_name":
            self.thread_names[(pid, _ident(raw.get("tid", 0)))] = name

    def finish(self) -> list[Event]:
        """All events in file order (a paired range at its begin's place)."""
        # Pair in time order, ties in file order, as chrome://tracing does.
        self.paired.sort(key=lambda item: (item[0], item[1]))
        threads: dict[ThreadKey, list[tuple[int, int, RawEvent]]] = {}
        flows: dict[tuple[Id, str, str], list[tuple[int, int, RawEvent]]] = {}
        for item in self.paired:
            ts, seq, raw = item
            ph = raw["ph"]
            if ph in ("B", "E"):
                stack = threads.setdefault(_thread(raw), [])
                if ph == "B":
                    stack.append(item)
                elif stack:
                    self._close(stack.pop(), ts, raw)
                else:
                    self.unmatched += 1
            else:
                async_id = json.dumps(raw.get("id", raw.get("id2")), sort_keys=True)
                key = (_ident(raw.get("pid", 0)), _text(raw.get("cat")), async_id)
                stack = flows.setdefault(key, [])
                if ph == "b":
                    stack.append(item)
                    continue
                # An 'e' closes the innermost open 'b' of its name (any, if it has none).
                name = raw.get("name")
                for k in range(len(stack) - 1, -1, -1):
                    if name is None or stack[k][2].get("name") == name:
                        self._close(stack.pop(k), ts, raw)
                        break
                else:
                    self.unmatched += 1
        self.unmatched += sum(len(s) for s in threads.values())
        self.unmatched += sum(len(s) for s in flows.values())
        self.done.sort(key=lambda item: item[0])
        return [event for _, event in self.done]

    def _close(self, begin: tuple[int, int, RawEvent], end_ts: int, end: RawEvent) -> None:
        start, seq, raw = begin
        args = raw.get("args")
        end_args = end.get("args")
        if isinstance(end_args, dict) and end_args:
            # The end's args add to the begin's, as in the Trace Event Format.
            args = {**(args if isinstance(args, dict) else {}), **end_args}
            raw = {**raw, "args": args}
        self.done.append((seq, _event(raw, "X", start, max(end_ts - start, 0))))


def _text(value: object) -> str:
    if type(value) is str:
        return value
    return "" if value is None else str(value)


def _thread(raw: RawEvent) -> ThreadKey:
    return (_ident(raw.get("pid", 0)), _ident(raw.get("tid", 0)))


def _event(raw: RawEvent, ph: str, ts: int, dur: int | None) -> Event:
    args = raw.get("args")
    pid, tid = _thread(raw)
    name, category = _text(raw.get("name")), _text(raw.get("cat"))
    return Event(name, category, ph, ts, dur, pid, tid, args if isinstance(args, dict) else {})
