"""A loaded trace: events in ns, thread names, statistics, filtering, call trees.

Times move from the file's microseconds to integer nanoseconds on the file's
own axis: ``ts`` is ``ts_us * 1000`` rounded from the exact value of the number
in the file, and a range's end is rounded the same way from ``ts + dur``, so
ranges nested in the file stay nested after rounding.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, overload

import msgspec

from ..averages import KeyAverages, Row
from . import _fastread, _scan
from ._columns import NO_DUR, Events, Keys, Thread, in_columns
from ._convert import Converter, ThreadKey, ns_ratio, round_ratio
from ._event import DECODE_EVENTS, Event, Id
from .nvidia import is_database
from .perfetto import load_perfetto, looks_like_perfetto
from .reader import PathArg, RawEvent, open_trace, read_raw, shown
from .samples import Samples
from .tree import CallTree, build_tree, by_key, nested

__all__ = ["Event", "Trace", "base_time_ns", "load", "ns_ratio", "round_ratio"]

_PERCENTILES = (50, 90, 99)


def load(path: PathArg, window: Sequence[float] | None = None) -> Trace:
    """Load a trace file: Chrome JSON (mxprof's, torch.profiler's, viztracer's, ...),
    gzip-compressed or not, or the Perfetto protobuf mxprof writes.

    ``window=(start, end)``, ns on the trace's ts axis (as ``Trace.filter``
    takes them): only the events that overlap it, ranges whole, and the
    stack samples inside it; of a file with an index (mxprof writes one in
    its trailer) only the blocks that may hold them are read, of one
    without only those events are decoded (``trace/window.py``, which says
    what differs from a whole load).

    The file is read once here, and checked whole; its events are read again
    only when something needs them one by one (iteration, ``filter``,
    ``tree``). ``key_averages`` and ``table`` of a file in mxprof's own shape
    (one event per line, as the core and ``merge`` write) come from that
    first reading: memory then grows with the threads and the distinct names,
    and 8 bytes per range for exact percentiles, not with whole events.

    A file the core wrote and a killed process cut short loads everything
    complete before the cut, with ``Trace.truncated`` set; see ``read_raw``
    for the forms accepted.

    Raises:
        TraceReadError: the path cannot be read (missing, a directory, no
            permission, a name too long, a NUL byte or lone surrogate in it);
            both a TraceFormatError and an OSError, ``errno`` says why.
        TraceFormatError: empty, not JSON, or JSON that is not a trace; a
            damaged gzip stream; cut short by another writer than the core
            (``mxprof repair`` keeps what is before the cut or the damage).
        ValueError: a window that is not two numbers, end >= start.

    Example:
        >>> trace = mxprof.load("trace.json")  # doctest: +SKIP
        >>> print(trace.filter(category="train").table(sort_by="self"))  # doctest: +SKIP
        >>> first_second = mxprof.load("trace.json", window=(0, 1e9))  # doctest: +SKIP
    """
    if window is not None:
        from .window import load_window  # it builds on this module

        return load_window(path, window)
    return Trace._read(path, keep_events=False)


def read_events(path: PathArg) -> Trace:
    """``load``, holding every event from the start (one reading instead of two).

    For whoever will go through the events anyway, as the report does.
    """
    return Trace._read(path, keep_events=True)


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
    if not -(2**63) <= value < 2**63:  # also NaN and the infinities: no time, as for ts
        return None
    return int(value)


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
        # The events as columns per thread (trace/_columns.py); None for a
        # file read without keeping them, until they are asked for.
        self._events: Events | None = _columns_of(events)
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        self.truncated = truncated
        self.process_names: dict[Id, str] = process_names if process_names is not None else {}
        self.thread_names: dict[ThreadKey, str] = thread_names if thread_names is not None else {}
        self.path = path
        self.unmatched = unmatched
        # (parent index, self ns) per event; computed on first use. A subset
        # carries its source's, so filtering never changes a range's self time.
        self._structure: tuple[Sequence[int], Sequence[int]] | None = None
        # Of a file read without keeping its events: their count and statistics.
        self._summary: _Summary | None = None
        # _groups() and _lengths() of the events, once worked out.
        self._by_name: dict[tuple[str, str], tuple[array[int], list[int]]] | None = None
        self._by_length: dict[tuple[str, str], array[int]] | None = None
        # Per thread (by id, of the Threads in _events): tree.by_key of its
        # ranges, once worked out; _groups() and the processes' durations and
        # totals (trace/processes.py) are made of these, so the ranges are
        # walked once for all three.
        self._per_thread: dict[int, dict[int, tuple[array[int], list[int]]]] | None = None
        # Stack samples (sample_rate; trace/samples.py).
        self.samples = Samples()

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
        converted = Converter()
        for raw in events:
            converted.add(raw)
        return cls._of(converted, metadata, truncated, path)

    @classmethod
    def _of(
        cls,
        converted: Converter,
        metadata: dict[str, Any] | None,
        truncated: bool,
        path: str | None,
    ) -> Trace:
        """The Trace of a finished conversion into lists (or into a summary, events=None)."""
        sinks = converted.finish()
        trace = cls(
            (),
            metadata=metadata,
            truncated=truncated,
            process_names=converted.process_names,
            thread_names=converted.thread_names,
            path=path,
            unmatched=converted.unmatched,
        )
        if all(isinstance(sink, (list, Thread)) for sink in sinks.values()):
            trace._events = in_columns(sinks)
        else:
            trace._events = None
        trace.samples = converted.samples()
        return trace

    @classmethod
    def _read(cls, path: PathArg, *, keep_events: bool) -> Trace:
        """Read path whole: its events kept, or only counted and summed up."""
        name = os.fspath(path)
        summary = None if keep_events else _Summary()
        truncated = False
        try:
            converted, metadata = read_lines(path, _columns() if summary is None else summary.sink)
        except _scan.NotLines:
            protobuf = read_protobuf(path, _columns() if summary is None else summary.sink)
            if protobuf is None:
                events, metadata, truncated = read_raw(path)
                return cls.from_raw(events, metadata=metadata, truncated=truncated, path=name)
            converted, metadata, truncated = protobuf
        trace = cls._of(converted, metadata, truncated, name)
        trace._summary = summary
        return trace

    @property
    def events(self) -> Events:
        """Every event, ordered by ``(str(pid), str(tid), ts, -dur)``, ties in file order.

        A sequence (len, indexing, iteration; equal to a list of the same
        events) whose ``Event`` objects are made as they are asked for: the
        trace holds its events as columns, about 20 bytes an event.
        """
        if self._events is None:
            # Read without keeping its events: read them now (the file is
            # mxprof's own shape, or it would have been read whole at once).
            assert self.path is not None
            try:
                converted, _ = read_lines(self.path, _columns())
                self._events = in_columns(converted.finish())
            except _scan.NotLines:  # a Perfetto trace, or changed since: read it whole
                protobuf = read_protobuf(self.path, _columns())
                if protobuf is not None:
                    self._events = in_columns(protobuf[0].finish())
                    return self._events
                raw, _, _ = read_raw(self.path)
                self._events = Trace.from_raw(raw).events
        return self._events

    @events.setter
    def events(self, events: Iterable[Event]) -> None:
        self._events = _columns_of(events)
        self._summary = None
        self._by_name = None
        self._by_length = None
        self._per_thread = None

    @property
    def base_time_ns(self) -> int | None:
        """Wall-clock time of ts 0 in ns since the epoch, when the file says."""
        return base_time_ns(self.metadata)

    def __getstate__(self) -> dict[str, Any]:
        # Sent between processes (``mxprof report --jobs``) without the
        # per-thread walk: it is keyed by the threads' ``id``, which names
        # other objects in the process that unpickles it; the copy walks again
        # when asked.  The statistics worked out from it travel.
        return {**self.__dict__, "_per_thread": None}

    def __len__(self) -> int:
        if self._events is None and self._summary is not None:
            return self._summary.count
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
        return f"Trace({self.path!r}, {len(self)} events{', truncated' * self.truncated})"

    def _parts(self) -> tuple[Sequence[int], Sequence[int]]:
        if self._structure is None:
            events = self.events
            runs = (t.spans(base) for t, base in zip(events.threads, events.offsets))
            self._structure = nested(len(events), runs)
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
        wanted = iter(keep)
        at = next(wanted, -1)
        kept = []
        for i, event in enumerate(self.events):
            if i == at:
                kept.append(event)
                at = next(wanted, -1)
        subset.events = kept
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
        return _rows(self._groups())

    def durations(
        self, keys: Iterable[tuple[str, str]] | None = None
    ) -> dict[tuple[str, str], list[int]]:
        """The ranges' durations in ns per (name, category), each list sorted.

        Args:
            keys: the (name, category) pairs wanted (default: every one);
                a pair with no range is left out.

        Example:
            >>> step = ("step", "train,frame")
            >>> trace.durations([step])[step][-1]  # doctest: +SKIP
            12378000
        """
        lengths = self._lengths()
        wanted = lengths if keys is None else [k for k in keys if k in lengths]
        return {key: sorted(lengths[key]) for key in wanted}

    def categories(self) -> set[str]:
        """The categories that hold ranges.

        Of a file ``load`` read in mxprof's own shape, from the statistics
        gathered then: no event is read again.

        Example:
            >>> sorted(mxprof.load("trace.json").categories())  # doctest: +SKIP
            ['mxprof', 'train', 'train,frame']
        """
        return {category for _, category in self._lengths()}

    def point_categories(self) -> set[str]:
        """The categories that hold events other than ranges (counter samples,
        instants).

        Of a file ``load`` read in mxprof's own shape, from what was gathered
        then: no event is read again.

        Example:
            >>> "Process Memory" in mxprof.load("run.json").point_categories()  # doctest: +SKIP
            True
        """
        summary = self._summary
        if self._events is None and summary is not None:
            return set(summary.points)
        return {e.category for e in self.events.points()}

    def _lengths(self) -> dict[tuple[str, str], array[int]]:
        """Durations per (name, category): the statistics' when worked out, else
        gathered alone (no nesting needed)."""
        groups = self._by_name
        summary = self._summary
        if groups is None and self._events is None and summary is not None and not summary.broken:
            groups = summary.groups
        if groups is not None:
            return {key: lengths for key, (lengths, _) in groups.items()}
        if self._by_length is None:
            by_key: dict[int, array[int]] = {}
            for thread in self.events.threads:
                for d, k in zip(thread.dur, thread.kind):
                    if d != NO_DUR:
                        k = k if k >= 0 else thread.extras[-k - 1][0]
                        lengths = by_key.get(k)
                        if lengths is None:
                            lengths = by_key[k] = array("q")
                        try:
                            lengths.append(d)
                        except OverflowError:  # past int64 ns (a damaged file): a list holds it
                            by_key[k] = [*lengths, d]  # type: ignore[assignment]
            self._by_length = _by_name(by_key, self.events.keys)
        return self._by_length

    def _groups(self) -> dict[tuple[str, str], tuple[array[int], list[int]]]:
        """(durations, [self total]) per (name, category) of ranges."""
        summary = self._summary
        if self._events is None and summary is not None and not summary.broken:
            return summary.groups
        if self._by_name is not None:
            return self._by_name
        if self._structure is not None:
            # A subset keeps its source's self times (``_structure``).
            groups = _by_name(self._subset_groups(self._structure[1]), self.events.keys)
        else:
            # The per-thread walks' groups joined by (name, category) (keys
            # that differ only by phase together); where several threads have
            # one, a copy is extended: each thread's own stays as it was.
            keys = self.events.keys
            groups = {}
            copied: set[tuple[str, str]] = set()
            for walked in self.per_thread().values():
                for k, (lengths, own) in walked.items():
                    name = (keys.names[k], keys.categories[k])
                    got = groups.get(name)
                    if got is None:
                        groups[name] = (lengths, [own[0]])
                        continue
                    if name not in copied:
                        copied.add(name)
                        got = groups[name] = (_copy(got[0]), got[1])
                    try:
                        got[0].extend(lengths)
                    except OverflowError:  # past int64 ns (a damaged file): a list holds them
                        got = groups[name] = ([*got[0], *lengths], got[1])
                    got[1][0] += own[0]
        self._by_name = groups
        return groups

    def per_thread(self) -> dict[int, dict[int, tuple[array[int], list[int]]]]:
        """Per thread of ``events`` (by ``id``): its ranges by key index,
        (durations, [self total]) each (``tree.by_key``), worked out once.

        The durations' arrays are shared with whoever asked: a reader may
        reorder one in place (sort it), never change its values.
        """
        if self._per_thread is None:
            self._per_thread = {
                id(t): by_key(t.ts, t.dur, t.kind, t.extras, NO_DUR) for t in self.events.threads
            }
        return self._per_thread

    def _subset_groups(self, selfs: Sequence[int]) -> dict[int, tuple[array[int], list[int]]]:
        """(durations, [self total]) per key index, the self times given per event."""
        out: dict[int, tuple[array[int], list[int]]] = {}
        events = self.events
        for thread, base in zip(events.threads, events.offsets):
            kinds, lengths, extras = thread.kind, thread.dur, thread.extras
            for i, _, _ in thread.spans(base):
                own = selfs[i]
                i -= base
                k = kinds[i]
                if k < 0:
                    k = extras[-k - 1][0]
                group = out.get(k)
                if group is None:
                    group = out[k] = (array("q"), [0])
                try:
                    group[0].append(lengths[i])
                except OverflowError:  # past int64 ns (a damaged file): a list holds it
                    group = out[k] = ([*group[0], lengths[i]], group[1])  # type: ignore[assignment]
                if own > 0:
                    group[1][0] += own
        return out

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


def _columns() -> Any:
    """A sink per thread for ``read_lines`` that keeps the events as columns."""
    keys = Keys()

    def sink(key: ThreadKey) -> Thread:
        return Thread(key[0], key[1], keys)

    return sink


def _columns_of(events: Iterable[Event]) -> Events:
    """Events as ``Trace.events`` holds them: per thread, ordered (see ``_columns``)."""
    if isinstance(events, Events):
        return events
    threads: dict[ThreadKey, list[Event]] = {}
    for event in events:
        threads.setdefault((event.pid, event.tid), []).append(event)
    return in_columns(threads)


def _copy(lengths: array[int]) -> array[int]:
    """A copy of a group's durations (an array, or a list past int64)."""
    return array("q", lengths) if isinstance(lengths, array) else list(lengths)


def _by_name(by_key: dict[int, Any], keys: Keys) -> dict[tuple[str, str], Any]:
    """Per-key-index groups (durations[, self total]) as per (name, category):
    keys that differ only by phase are put together."""
    out: dict[tuple[str, str], Any] = {}
    for k, group in by_key.items():
        name = (keys.names[k], keys.categories[k])
        got = out.get(name)
        if got is None:
            out[name] = group
        elif isinstance(group, tuple):
            got[0].extend(group[0])
            got[1][0] += group[1][0]
        else:
            got.extend(group)
    return out


def _rows(groups: dict[tuple[str, str], tuple[array[int], list[int]]]) -> KeyAverages:
    """Rows of (durations, [self total]) per (name, category)."""
    rows = []
    for (name, category), (durations, self_total) in sorted(groups.items()):
        ordered = sorted(durations)
        # Kept sorted (the same values): a later sort of them (``durations``,
        # the report's histograms, a process's durations sharing the array)
        # is then one linear pass.
        durations[:] = array("q", ordered) if isinstance(durations, array) else ordered
        count, total, least, most = len(ordered), sum(ordered), ordered[0], ordered[-1]
        p50, p90, p99 = (_nearest_rank(ordered, p) for p in _PERCENTILES)
        rows.append(Row(name, category, count, total, self_total[0], least, most, p50, p90, p99))
    return KeyAverages(rows).sorted("total")


class _Summary:
    """What ``key_averages`` needs of a file, gathered while it is read once.

    Self times are worked out as the events come, which needs each thread's
    ranges in the order they ended (mxprof's writers write a range when it
    ends), a range that contains another with the same end after it. A thread
    in another order sets ``broken``: then the events are read again and
    ``key_averages`` is computed from them.
    """

    def __init__(self) -> None:
        self.count = 0
        self.broken = False
        self.groups: dict[tuple[str, str], tuple[array[int], list[int]]] = {}
        self.points: set[str] = set()  # the categories of the events that are not ranges

    def sink(self, key: ThreadKey) -> _Running:
        return _Running(self)

    def take_lengths(self, key: tuple[str, str], lengths: Any, own: int) -> None:
        """Ranges of (name, category) summed elsewhere (``trace/_fastread.py``
        runs ``_Running``'s rule in C): their lengths (int64 bytes), own total."""
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = (array("q"), [0])
        group[0].frombytes(lengths)
        group[1][0] += own


class _Running:
    """One thread's ranges that no range seen so far contains: (start, length)."""

    __slots__ = ("summary", "starts", "lengths", "last_end")

    def __init__(self, summary: _Summary) -> None:
        self.summary = summary
        self.starts: array[int] = array("q")
        self.lengths: array[int] = array("q")
        self.last_end = -(1 << 63)

    def take_ranges(self, keep: int, starts: Any, lengths: Any, last_end: int) -> None:
        """The state ``append`` would leave, worked out elsewhere (``trace/_fastread.py``):
        the first ``keep`` ranges stay, followed by ``starts``/``lengths`` (int64 bytes)."""
        del self.starts[keep:]
        del self.lengths[keep:]
        self.starts.frombytes(starts)
        self.lengths.frombytes(lengths)
        self.last_end = last_end

    def append(self, event: Event) -> None:
        summary = self.summary
        summary.count += 1
        length = event.dur
        if length is None:
            summary.points.add(event.category)
            return
        if summary.broken:
            return
        start = event.ts
        end = start + length
        starts = self.starts
        if end < self.last_end or (
            # The range before ends here too and contains this one: it came
            # first, so it was taken for a range without this child.
            end == self.last_end and length > 0 and starts[-1] <= start and self.lengths[-1] > 0
        ):
            summary.broken = True
            return
        self.last_end = end
        children = 0
        if length > 0:  # zero-length ranges contain nothing
            lengths = self.lengths
            while starts and starts[-1] >= start:
                starts.pop()
                children += lengths.pop()
        key = (event.name, event.category)
        group = summary.groups.get(key)
        if group is None:
            group = summary.groups[key] = (array("q"), [0])
        try:
            group[0].append(length)
            starts.append(start)
            self.lengths.append(length)
        except OverflowError:  # past int64 ns (a damaged file): the events are read instead
            summary.broken = True
            return
        if length > children:
            group[1][0] += length - children


def read_protobuf(path: PathArg, sink: Any) -> tuple[Converter, dict[str, Any], bool] | None:
    """Read a Perfetto protobuf trace into sink(thread) per thread, streaming
    (``perfetto.load_perfetto``): (the conversion, metadata, whether the file
    was cut short); None when the file is not one (read it with ``read_raw``).

    Raises:
        TraceReadError: the path cannot be read.
        TraceFormatError: a packet breaks the wire format.
    """
    if is_database(path):
        return None
    with open_trace(path) as f:
        if not looks_like_perfetto(f.read(_PROTOBUF_HEAD)):
            return None
        f.seek(0)
        converted = Converter(sink)
        # The compiled path (native/offline/mxo_pftrace.c) where built: the same result.
        fast = _fastread.reader(converted)
        metadata, truncated = load_perfetto(f, shown(os.fspath(path)), converted, fast)
    return converted, metadata, truncated


_PROTOBUF_HEAD = 1 << 16  # bytes looked at to tell a Perfetto trace from JSON


def read_lines(
    path: PathArg, sink: Any, after_block: Callable[[], None] | None = None
) -> tuple[Converter, dict[str, Any]]:
    """Read a file in mxprof's one-event-per-line shape into sink(thread) per thread
    (a list of Events per thread where sink is None); ``after_block()``, when
    given, runs after each block's events went to their sinks (a streaming
    writer flushes there).

    Raises:
        _scan.NotLines: the file is not in that shape (or is cut short, or
            damaged): read it whole with ``read_raw``.
        TraceReadError: the path cannot be read.
    """
    if is_database(path):  # read as the general way reads it: by name or content
        raise _scan.NotLines
    converted = Converter(sink)
    # The compiled path (trace/_fastread.py) where built: the same result.
    fast = _fastread.reader(converted)
    with open_trace(path) as f:
        blocks = _scan.blocks(f)
        while True:
            try:
                text = next(blocks)
            except StopIteration as stop:
                metadata: dict[str, Any] = stop.value
                break
            if fast is not None and fast.take(text):
                if after_block is not None:
                    after_block()
                continue
            decoded = False
            if _scan.ASYNC.search(text) is None:
                try:
                    converted.add_block(DECODE_EVENTS(text))
                    decoded = True
                except msgspec.ValidationError:
                    pass  # a value the fast decoding does not take: read the run as dicts
                except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
                    # Damage, nesting too deep, bytes that are not UTF-8: the
                    # general reader reads the text with replacement characters
                    # or names what is wrong.
                    raise _scan.NotLines from None
            if not decoded:
                for raw in _scan.raw_events(text):
                    converted.add(raw)
            if after_block is not None:
                after_block()
    return converted, metadata
