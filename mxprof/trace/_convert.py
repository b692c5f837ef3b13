"""Raw trace events to ``Event`` objects: times in ns, B/E and b/e paired, per thread.

Two ways in, one result. ``add_block`` takes ``Event`` objects that msgspec
decoded straight from a file's text (times still in the file's µs) and puts
the common ones (X, C, i with numeric times, int or str ids) right in place;
every other event goes the general way, ``add``, which takes any raw event
dict. Both give a thread's events in file order, a paired range at the place
of its begin; ``threads()`` hands out the per-thread lists.

Times: ``ts`` is the file's µs times 1000 rounded from the exact value of the
number; a range's end is rounded the same way from ``ts + dur``, so that
ranges nested in the file stay nested. The fast path reads ``x * 1000.0``
when that lies within 0.001 of an integer below 2**52 (then the float's error
is far below 0.5 ns and the integer is the exact rounding), and the exact
rational path otherwise.
"""

from __future__ import annotations

import json
import math
from typing import Any, Protocol

from msgspec.structs import force_setattr

from ._event import NO_ARGS, Event, Id
from .reader import RawEvent
from .samples import CATEGORY as SAMPLE_CATEGORY
from .samples import DEFINITIONS as SAMPLE_DEFINITIONS
from .samples import Samples, split

ThreadKey = tuple[Id, Id]

RANGE_PHASES = frozenset("XBEbe")
# Phases kept besides ranges, and what they become ('I' is the old name of 'i').
POINT_PHASES = {"i": "i", "I": "i", "n": "n", "R": "R", "C": "C"}
_FAST_POINTS = frozenset("iCnR")
# A B or b event waiting for its end: (ts ns, file order, the event, the key
# it pairs under, its held place in its thread's list or -1).
_Pending = tuple[int, int, RawEvent, ThreadKey, int]
_EXACT_BELOW = float(1 << 52)
# The times a trace may hold, in µs: within ±2**63 ns, the range of the core's
# clock.  A time beyond it (1e308, a 5,000-digit integer) is no time, like NaN:
# the event is read as one without a time, never as an overflow later on.
MAX_TIME_US = float(1 << 63) / 1000.0
# Range lengths in ns shared as one int object per value below this (65 µs):
# the table holds at most this many (about 6 MB), whatever the trace.
SHARED = 1 << 16


class Sink(Protocol):
    """Where a thread's events go, in file order: a list, or a running summary."""

    def append(self, event: Any, /) -> None: ...


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
        if not (math.isfinite(value) and -MAX_TIME_US <= value <= MAX_TIME_US):
            return None
        num, den = value.as_integer_ratio()
        return num * 1000, den
    if isinstance(value, int) and not isinstance(value, bool):
        return (value * 1000, 1) if -MAX_TIME_US <= value <= MAX_TIME_US else None
    return None


def round_ratio(num: int, den: int) -> int:
    """num / den (den > 0) rounded to the nearest integer, halves up: a
    rounding that never decreases as num grows, so nesting survives it.

    Example:
        >>> round_ratio(*ns_ratio(0.0015)), round_ratio(5, 2)
        (2, 3)
    """
    return (2 * num + den) // (2 * den)


def span_ns(ts: object, dur: object) -> tuple[int, int] | None:
    """(start, end) in ns of a range at ts lasting dur µs (None: no valid ts).

    Example:
        >>> span_ns(1.5, 2), span_ns("x", 1)
        ((1500, 3500), None)
    """
    start = ns_ratio(ts)
    if start is None:
        return None
    length = ns_ratio(dur) or (0, 1)
    # Round the end, not the length, so that nesting survives rounding.
    end = round_ratio(start[0] * length[1] + length[0] * start[1], start[1] * length[1])
    return round_ratio(*start), end


def whole_ns(value: object) -> int | None:
    """A time in µs as integer ns when the float's product is exact enough to
    round (within 0.001 of an integer below 2**52), else None: then use
    ``ns_ratio``. ``Converter.add_block`` inlines the same rule per event.

    Example:
        >>> whole_ns(83.875), whole_ns(0.0015), whole_ns("1")
        (83875, None, None)
    """
    if type(value) is not float and type(value) is not int:
        return None
    v = value * 1000.0
    if not -_EXACT_BELOW < v < _EXACT_BELOW:  # also NaN and the infinities: no round()
        return None
    n = round(v)
    return n if -0.001 < v - n < 0.001 else None


def ident(value: object) -> Id:
    """A pid or tid as in the file, made hashable; a whole float becomes an int."""
    if type(value) is int or type(value) is str:
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return "" if value is None else json.dumps(value, sort_keys=True)


def text(value: object) -> str:
    if type(value) is str:
        return value
    return "" if value is None else str(value)


def thread_of(raw: RawEvent) -> ThreadKey:
    return (ident(raw.get("pid", 0)), ident(raw.get("tid", 0)))


class Converter:
    """Turns raw events into Events: pairs B/E per thread and b/e per async id.

    ``sink(key)`` makes the place a new thread's events go (default: a list).
    """

    def __init__(self, sink: Any = None) -> None:
        self._sink = sink if sink is not None else _new_list
        self.sinks: dict[ThreadKey, Sink] = {}
        self.paired: list[_Pending] = []
        self.process_names: dict[Id, str] = {}
        self.thread_names: dict[ThreadKey, str] = {}
        self.unmatched = 0
        self.seq = 0
        # Stack samples and the metadata defining their ids, as raw events:
        # resolved together at the end (trace/samples.py).
        self.sample_events: list[RawEvent] = []
        self._strings: dict[str, str] = {}
        self._ids: dict[Any, Any] = {}
        self._lengths: dict[int, int] = {}  # range lengths below SHARED: one int object each

    def sink(self, key: ThreadKey) -> Sink:
        found = self.sinks.get(key)
        if found is None:
            found = self.sinks[key] = self._sink(key)
        return found

    # ---- the fast way: Events decoded from the text, times in µs ----

    def add_block(self, events: list[Event]) -> None:
        """Events msgspec decoded from a run of the file's text, in file order.

        The decoding checked the types (numeric times, int or str ids, dict
        args); the common phases are finished here, the rest go to ``add``.
        """
        # The rounding is whole_ns's, inlined: a call per event costs as much.
        fs = force_setattr
        strings = self._strings
        ids = self._ids
        lengths = self._lengths
        exact = _EXACT_BELOW
        last_pid: Any = None
        last_tid: Any = None
        sink: Any = None
        put: Any = None
        for e in events:
            ph = e.ph
            ts = e.ts
            # The range checks come before round(): it overflows on an infinity.
            if ph == "X" and ts is not None:
                v = ts * 1000.0
                dur = e.dur
                w = 0.0 if dur is None else dur * 1000.0
                if -exact < v < exact and -exact < w < exact:
                    start = round(v)
                    length = round(w)
                    exact_times = -0.001 < v - start < 0.001 and -0.001 < w - length < 0.001
                else:
                    exact_times = False
                if exact_times:
                    if length <= 0:
                        length = 0
                    elif 256 < length < SHARED and put is None:  # (to 256, ints are shared)
                        # Short ranges repeat their lengths: one int per length, not
                        # per range (32 bytes each); the table is bounded by SHARED.
                        length = lengths.setdefault(length, length)
                else:
                    span = span_ns(ts, 0 if dur is None else dur)
                    if span is None:  # no valid time: the general way drops it
                        continue
                    start, end = span
                    length = end - start if end > start else 0
                ph = "X"
            elif ph in _FAST_POINTS and ts is not None:
                if ph == "i" and e.category == SAMPLE_CATEGORY:
                    self.sample_events.append(_as_raw(e))
                    continue
                v = ts * 1000.0
                start = round(v) if -exact < v < exact else 0
                if not (-exact < v < exact and -0.001 < v - start < 0.001):
                    ratio = ns_ratio(ts)
                    if ratio is None:  # no valid time: the general way drops it
                        continue
                    start = round_ratio(*ratio)
                length = None
                ph = POINT_PHASES[ph]
            else:
                self.add(_as_raw(e))
                last_pid = None  # add may have made a new thread's sink
                continue
            pid = e.pid
            tid = e.tid
            if last_pid is None or tid != last_tid or pid != last_pid:
                key = (pid, tid)
                found = ids.get(key)
                if found is None:
                    sink = self.sink(key)
                    found = ids[key] = (pid, tid, sink, getattr(sink, "put", None))
                last_pid, last_tid, sink, put = found
            if put is not None:  # a sink that takes the values (trace/_columns.py)
                args = e.args
                put(start, length, e.name, e.category, ph, NO_ARGS if args is None else args)
                continue
            # msgspec decodes a str of its own for every event's ph: one shared
            # instead (50 bytes an event, 0.5 GB of 10 M events); and names too.
            fs(e, "ph", ph)
            fs(e, "ts", start)
            fs(e, "dur", length)
            name = e.name
            fs(e, "name", strings.setdefault(name, name))
            category = e.category
            fs(e, "category", strings.setdefault(category, category))
            fs(e, "pid", last_pid)
            fs(e, "tid", last_tid)
            if e.args is None:
                fs(e, "args", NO_ARGS)
            sink.append(e)

    # ---- the general way: any raw event dict ----

    def add(self, raw: RawEvent) -> None:
        """One raw event (a dict as in the file), the next in file order."""
        seq = self.seq
        self.seq += 1
        ph = raw.get("ph")
        if (ph == "M" and raw.get("name") in SAMPLE_DEFINITIONS) or (
            ph == "i" and raw.get("cat") == SAMPLE_CATEGORY
        ):
            self.sample_events.append(raw)
            return
        if ph == "M":
            self._metadata(raw)
            return
        if type(ph) is not str or (ph not in RANGE_PHASES and ph not in POINT_PHASES):
            return
        if ph == "X":
            span = span_ns(raw.get("ts"), raw.get("dur", 0))
            if span is not None:
                start, end = span
                self._put(_event(raw, "X", start, max(end - start, 0)))
            return
        ts = ns_ratio(raw.get("ts"))
        if ts is None:
            return
        start = round_ratio(*ts)
        if ph in RANGE_PHASES:
            key = thread_of(raw) if ph in "BE" else (ident(raw.get("pid", 0)), "")
            place = -1
            if ph in "Bb":  # a place held in its thread's events until its end is found
                sink = self.sink(thread_of(raw))
                if isinstance(sink, list):
                    place = len(sink)
                    sink.append(None)
            self.paired.append((start, seq, raw, key, place))
            return
        self._put(_event(raw, POINT_PHASES[ph], start, None))

    def _put(self, event: Any) -> None:
        self.sink((event.pid, event.tid)).append(event)

    def _metadata(self, raw: RawEvent) -> None:
        args = raw.get("args")
        name = args.get("name") if isinstance(args, dict) else None
        if not isinstance(name, str):
            return
        pid = ident(raw.get("pid", 0))
        if raw.get("name") == "process_name":
            self.process_names[pid] = name
        elif raw.get("name") == "thread_name":
            self.thread_names[(pid, ident(raw.get("tid", 0)))] = name

    def samples(self) -> Samples:
        """The stack samples met so far, their ids resolved."""
        return split(self.sample_events)[1]

    def finish(self) -> dict[ThreadKey, Sink]:
        """Pair the B/E and b/e events; every thread's events, in file order."""
        # Pair in time order, ties in file order, as chrome://tracing does.
        self.paired.sort(key=lambda item: (item[0], item[1]))
        threads: dict[ThreadKey, list[_Pending]] = {}
        flows: dict[tuple[Id, str, str], list[_Pending]] = {}
        for item in self.paired:
            ts, _seq, raw, key, _place = item
            ph = raw["ph"]
            if ph in ("B", "E"):
                stack = threads.setdefault(key, [])
                if ph == "B":
                    stack.append(item)
                elif stack:
                    self._close(stack.pop(), ts, raw)
                else:
                    self.unmatched += 1
            else:
                async_id = json.dumps(raw.get("id", raw.get("id2")), sort_keys=True)
                flow = (key[0], text(raw.get("cat")), async_id)
                stack = flows.setdefault(flow, [])
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
        self.paired = []
        for sink in self.sinks.values():
            if isinstance(sink, list) and None in sink:
                sink[:] = [e for e in sink if e is not None]
        return self.sinks

    def _close(self, begin: _Pending, end_ts: int, end: RawEvent) -> None:
        start, _seq, raw, _key, place = begin
        args = raw.get("args")
        end_args = end.get("args")
        if isinstance(end_args, dict) and end_args:
            # The end's args add to the begin's, as in the Trace Event Format.
            args = {**(args if isinstance(args, dict) else {}), **end_args}
            raw = {**raw, "args": args}
        event = _event(raw, "X", start, max(end_ts - start, 0))
        sink = self.sink((event.pid, event.tid))
        if place >= 0 and isinstance(sink, list):
            sink[place] = event
        else:
            sink.append(event)


def _new_list(key: ThreadKey) -> list[Event]:
    return []


def _event(raw: RawEvent, ph: str, ts: int, dur: int | None) -> Event:
    args = raw.get("args")
    pid, tid = thread_of(raw)
    return Event(
        text(raw.get("name")),
        text(raw.get("cat")),
        ph,
        ts,
        dur,
        pid,
        tid,
        args if isinstance(args, dict) else NO_ARGS if args is None else {},
    )


def _as_raw(event: Any) -> RawEvent:
    """A decoded Event that the fast way does not take, as the raw dict it came from."""
    raw: RawEvent = {"ph": event.ph, "name": event.name, "cat": event.category}
    for field in ("ts", "dur", "pid", "tid", "args"):
        raw[field] = getattr(event, field)
    return raw
