"""A loaded trace's events as columns, one set per thread; ``Event`` objects made on demand.

An ``Event`` object held per event costs about 120 bytes (the struct, its
``ts`` int, its place in a list): 1.2 GB of a 10 M-event trace, twice over in
a report (the forked child touches every one). Here a thread's events are
three arrays, 20 bytes an event: ``ts`` and ``dur`` (int64 ns; ``NO_DUR`` for
an event that is not a range) and ``kind`` (int32): the index of its (name,
category, phase) in the trace's ``Keys``, or, for an event with arguments,
``-(j + 1)`` where ``extras[j]`` is (that index, its args).  An ``Event`` is
made when one is asked for (iteration, indexing) and not kept.

A thread's columns are in ``Trace.events``'s order, ``(ts, -dur)`` with ties
in the order added.  Events are placed as they come: mxprof writes a range
when it ends, so a parent comes after its children and goes back only past
them (a short move within the arrays).  A thread whose events come in
another order (a move past more than ``_MAX_MOVE`` events) is sorted once
at the end instead (``Thread.finish``).  A time past int64 (a damaged file)
turns that thread's ``ts`` and ``dur`` into lists, which hold any int.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Iterator, MutableSequence, Sequence
from itertools import compress, count, repeat
from operator import eq
from typing import Any, overload

from ._event import NO_ARGS, Event, Id

NO_DUR = -(1 << 63)  # the dur column's value for an event that is not a range
_MAX_MOVE = 4096  # events an out-of-order event moves back past, at most, before sorting


class Keys:
    """The (name, category, phase) of a trace's events, each once, by index."""

    __slots__ = ("index", "names", "categories", "phases")

    def __init__(self) -> None:
        self.index: dict[tuple[str, str, str], int] = {}
        self.names: list[str] = []
        self.categories: list[str] = []
        self.phases: list[str] = []

    def of(self, name: str, category: str, ph: str) -> int:
        key = (name, category, ph)
        k = self.index.get(key)
        if k is None:
            k = self.index[key] = len(self.names)
            self.names.append(name)
            self.categories.append(category)
            self.phases.append(ph)
        return k


class Thread:
    """One thread's events as columns (see the module docstring).

    It is a sink of ``Converter``: ``append(event)`` takes the thread's
    events in file order.
    """

    __slots__ = ("pid", "tid", "keys", "_index", "ts", "dur", "kind", "extras", "ranges", "_sorted")

    def __init__(self, pid: Id, tid: Id, keys: Keys) -> None:
        self.pid = pid
        self.tid = tid
        self.keys = keys
        self._index = keys.index
        self.ts: MutableSequence[int] = array("q")
        self.dur: MutableSequence[int] = array("q")
        self.kind: MutableSequence[int] = array("i")
        self.extras: list[tuple[int, dict[str, Any]]] = []
        self.ranges = 0  # events with a dur (counted by finish)
        self._sorted = True  # placed in order as they came (else: finish sorts)

    def __len__(self) -> int:
        return len(self.ts)

    def append(self, event: Event) -> None:
        """Add an event (the next of this thread in file order)."""
        self.put(event.ts, event.dur, event.name, event.category, event.ph, event.args)

    def put(
        self,
        ts: int,
        dur: int | None,
        name: str,
        category: str,
        ph: str,
        args: dict[str, Any] | None,
    ) -> None:
        """Add an event given as its fields (the next of this thread in file order).

        ``Converter.add_block`` hands the events it decodes here without
        finishing an ``Event``: this is the loading's inner loop.
        """
        k = self._index.get((name, category, ph))
        if k is None:
            k = self.keys.of(name, category, ph)
        if args is not NO_ARGS:  # (an empty dict of its own, or None, stays what it was)
            self.extras.append((k, args))  # type: ignore[arg-type]
            k = -len(self.extras)
        d = NO_DUR if dur is None else dur
        times = self.ts
        if times and (ts < times[-1] or (ts == times[-1] and d > 0 and d > _length(self.dur[-1]))):
            self._place(ts, d, k)
            return
        try:
            times.append(ts)
        except OverflowError:  # past int64 (a damaged file): lists hold any int
            self._widen()
            self.ts.append(ts)
        try:
            self.dur.append(d)
        except OverflowError:
            self._widen()
            self.dur.append(d)
        self.kind.append(k)

    def extend(
        self,
        ts: bytes | memoryview,
        dur: bytes | memoryview,
        kind: bytes | memoryview,
        order: Callable[[Any, Any, Any, int], bool],
    ) -> None:
        """Add events given as columns, the next of this thread in file order,
        as ``put`` would one by one: ``ts`` and ``dur`` int64 ns (``NO_DUR``
        for a point), ``kind`` int32 indexes into ``keys``, no args.

        ``order(ts, dur, kind, start)`` puts the columns' events from
        ``start`` on in place, their order being ``put``'s (the compiled
        reader's, ``_fastread.order``); False leaves them for ``finish``.
        """
        times, lengths, kinds = self.ts, self.dur, self.kind
        assert isinstance(kinds, array)  # (only ts and dur are ever widened)
        kinds.frombytes(kind)
        if not isinstance(times, array) or not isinstance(lengths, array):
            # Widened (a damaged file): lists, which finish sorts.
            for column, data in ((times, ts), (lengths, dur)):
                values = array("q")
                values.frombytes(data)
                column.extend(values)
            self._sorted = False
            return
        start = len(times)
        times.frombytes(ts)
        lengths.frombytes(dur)
        # Unsorted already (a long move back): finish sorts these with the rest.
        if self._sorted and not order(times, lengths, kinds, start):
            self._sorted = False

    def _place(self, ts: int, d: int, kind: int) -> None:
        """An event that goes before the last: back past the ones after it."""
        times = self.ts
        n = len(times)
        if self._sorted:
            at = bisect.bisect_right(times, ts)  # past the events that start before or at ts
            lengths = self.dur
            mine = _length(d)
            while at > 0 and times[at - 1] == ts and _length(lengths[at - 1]) < mine:
                at -= 1  # at one ts, longer first
            if n - at <= _MAX_MOVE:
                self._put(at, ts, d, kind)
                return
            self._sorted = False
        self._put(n, ts, d, kind)

    def _put(self, at: int, ts: int, d: int, kind: int) -> None:
        try:
            self.ts.insert(at, ts)
        except OverflowError:  # past int64 (a damaged file): lists hold any int
            self._widen()
            self.ts.insert(at, ts)
        try:
            self.dur.insert(at, d)
        except OverflowError:
            self._widen()
            self.dur.insert(at, d)
        self.kind.insert(at, kind)

    def _widen(self) -> None:
        if isinstance(self.ts, array):
            self.ts = list(self.ts)
            self.dur = list(self.dur)

    def finish(self) -> None:
        """Count the ranges; sort the columns if events came out of order (see
        the module docstring)."""
        self.ranges = len(self.dur) - self.dur.count(NO_DUR)
        if self._sorted:
            return
        ts, dur = self.ts, self.dur
        # One int key per event, (ts, longer first) in one number; stable: ties in file order.
        order = sorted(range(len(ts)), key=lambda i: (ts[i] << 64) - _length(dur[i]))
        self.ts = _taken(ts, order)
        self.dur = _taken(dur, order)
        self.kind = _taken(self.kind, order)
        self._sorted = True

    def event(self, i: int) -> Event:
        """The event at position i (0 <= i < len)."""
        return self._make(self.ts[i], self.dur[i], self.kind[i])

    def _make(self, ts: int, d: int, k: int) -> Event:
        keys = self.keys
        args = NO_ARGS
        if k < 0:
            k, args = self.extras[-k - 1]
        return Event(
            keys.names[k],
            keys.categories[k],
            keys.phases[k],
            ts,
            None if d == NO_DUR else d,
            self.pid,
            self.tid,
            args,
        )

    def __iter__(self) -> Iterator[Event]:
        names, categories, phases = self.keys.names, self.keys.categories, self.keys.phases
        pid, tid, extras = self.pid, self.tid, self.extras
        for ts, d, k in zip(self.ts, self.dur, self.kind):
            args = NO_ARGS
            if k < 0:
                k, args = extras[-k - 1]
            yield Event(
                names[k],
                categories[k],
                phases[k],
                ts,
                None if d == NO_DUR else d,
                pid,
                tid,
                args,
            )

    def spans(self, base: int = 0) -> Iterator[tuple[int, int, int]]:
        """(base + position, ts, dur) of each range, in order: ``tree.nest``'s input."""
        for i, (ts, d) in enumerate(zip(self.ts, self.dur), base):
            if d != NO_DUR:
                yield i, ts, d

    def range_columns(self) -> Iterator[tuple[int, int, int, int]]:
        """(position, ts, dur, key index) of each range, in order: no Event made."""
        for i, (ts, d, k) in enumerate(zip(self.ts, self.dur, self.kind)):
            if d != NO_DUR:
                yield i, ts, d, (k if k >= 0 else self.extras[-k - 1][0])

    def key(self, k: int) -> int:
        """The key index of a kind value."""
        return k if k >= 0 else self.extras[-k - 1][0]


def _length(d: int) -> int:
    return d if d > 0 else 0


def _taken(column: MutableSequence[int], order: list[int]) -> MutableSequence[int]:
    values = [column[i] for i in order]
    if isinstance(column, array):
        return array(column.typecode, values)
    return values


class Ranges(Sequence[Event]):
    """A thread's ranges (not its instants or counter samples), in ts order, as Events.

    Made one at a time when iterated or indexed; ``positions`` are the
    ranges' places in the thread's columns, for walks that read the columns.
    """

    __slots__ = ("thread", "_positions")

    def __init__(self, thread: Thread) -> None:
        self.thread = thread
        self._positions: Sequence[int] | None = None

    @property
    def positions(self) -> Sequence[int]:
        if self._positions is None:
            t = self.thread
            if t.ranges == len(t):
                self._positions = range(len(t))
            else:
                self._positions = array("q", (i for i, _, _, _ in t.range_columns()))
        return self._positions

    def __len__(self) -> int:
        return self.thread.ranges

    def __iter__(self) -> Iterator[Event]:
        t = self.thread
        if t.ranges == len(t):
            return iter(t)
        return (e for e in t if e.dur is not None)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        positions = self.positions
        if isinstance(index, slice):
            return [self.thread.event(i) for i in positions[index]]
        return self.thread.event(positions[index])

    def columns(self) -> Iterator[tuple[int, int, int]]:
        """(ts, dur, key index) of each range in order: no Event made."""
        for _, ts, d, k in self.thread.range_columns():
            yield ts, d, k


class Events(Sequence[Event]):
    """Every event of a trace's threads, in ``Trace.events``'s order, made when asked for.

    Compares equal to any sequence of the same events (a list included).
    """

    def __init__(self, threads: list[Thread], keys: Keys) -> None:
        self.threads = threads
        self.keys = keys
        self.offsets: list[int] = []
        n = 0
        for t in threads:
            self.offsets.append(n)
            n += len(t)
        self._len = n

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Event]:
        for t in self.threads:
            yield from t

    def points(self) -> Iterator[Event]:
        """The events that are not ranges (instants, counter samples), in order;
        no Event is made for a range."""
        for t in self.threads:
            if t.ranges < len(t):
                for i in compress(count(), map(eq, t.dur, repeat(NO_DUR))):
                    yield t.event(i)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            return [self[i] for i in range(start, stop, step)]
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError("event index out of range")
        k = bisect.bisect_right(self.offsets, i) - 1  # the thread holding event i
        return self.threads[k].event(i - self.offsets[k])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{self._len} events of {len(self.threads)} threads>"


def in_columns(threads: dict[tuple[Id, Id], Any]) -> Events:
    """The trace's Events of per-thread sinks (Threads, or lists of Events in
    file order), threads ordered by ``(str(pid), str(tid))``."""
    keys = next((s.keys for s in threads.values() if isinstance(s, Thread)), None) or Keys()
    ordered: list[Thread] = []
    for key in sorted(threads, key=lambda k: (str(k[0]), str(k[1]))):
        sink = threads[key]
        if not isinstance(sink, Thread):
            thread = Thread(key[0], key[1], keys)
            for event in sink:
                thread.append(event)
            sink = thread
        sink.finish()
        if len(sink):
            ordered.append(sink)
    return Events(ordered, keys)
