"""Read the Perfetto protobuf traces mxprof writes, as Chrome-style event dicts.

A Perfetto trace is ``Trace { repeated TracePacket packet = 1; }``: a run of
(0x0A, varint length, packet) blocks.  ``read_perfetto`` decodes the fields
the core's writer uses (``native/src/mxp_perfetto.c`` lists them) and turns
them into the raw events ``read_raw`` gives for JSON, so that everything
downstream (``Trace.from_raw``, ``merge``) treats both formats alike:

- a slice on a thread track becomes a ``B``/``E`` pair on that (pid, tid);
  one on an async track (a range that ended on another thread) a ``b``/``e``
  pair whose id is the track, on tid 0;
- an instant becomes ``ph: "i"`` with its debug annotations as ``args``; on
  the global track (uuid 0) it has ``s: "g"``, on the process track ``"p"``
  (both on tid 0), on a thread track ``"t"``;
- a counter sample becomes ``ph: "C"`` named after its track, on tid 0, with
  category ``""`` (a Perfetto counter track carries no category);
- thread and process descriptors become ``thread_name`` / ``process_name``
  metadata events; the clock snapshot's REALTIME clock at the trace's
  MONOTONIC base gives ``baseTimeNanoseconds``, and ``ts`` counts from that base;
- a ChromeEventBundle's metadata (``merge`` writes ``distributedInfo`` and
  ``otherData`` there, as JSON values) become the metadata's keys.

Fields the core never writes (inline names, other clocks, extra tracks) are
read where cheap and otherwise skipped.  No protobuf library is needed.
``writer.write_perfetto`` is the way back, for ``merge``'s output.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import TraceFormatError
from ._event import NO_ARGS, Event
from ._protobuf import (
    BEGIN,
    BYTES,
    CE_METADATA,
    CLOCK_MONOTONIC,
    CLOCK_REALTIME,
    CM_BOOL,
    CM_INT,
    CM_JSON,
    CM_NAME,
    CM_STRING,
    COUNTER,
    DA_BOOL,
    DA_DOUBLE,
    DA_INT,
    DA_NAME,
    DA_STRING,
    DA_UINT,
    DEF_TIMESTAMP_CLOCK_ID,
    DEF_TRACK_EVENT,
    DESC_PID,
    END,
    FIXED32,
    FIXED64,
    ID_EVENT_CATEGORIES,
    ID_EVENT_NAMES,
    INSTANT,
    INTERNED_IID,
    INTERNED_NAME,
    PD_PROCESS_NAME,
    PK_CHROME_EVENTS,
    PK_CLOCK_ID,
    PK_CLOCK_SNAPSHOT,
    PK_DEFAULTS,
    PK_INTERNED_DATA,
    PK_SEQUENCE_FLAGS,
    PK_SEQUENCE_ID,
    PK_TIMESTAMP,
    PK_TRACK_DESCRIPTOR,
    PK_TRACK_EVENT,
    SEQ_INCREMENTAL_STATE_CLEARED,
    TD_COUNTER,
    TD_NAME,
    TD_PARENT_UUID,
    TD_PROCESS,
    TD_THREAD,
    TD_UUID,
    TE_CATEGORIES,
    TE_CATEGORY_IIDS,
    TE_COUNTER_VALUE,
    TE_DEBUG_ANNOTATIONS,
    TE_NAME,
    TE_NAME_IID,
    TE_TRACK_UUID,
    TE_TYPE,
    TED_TRACK_UUID,
    THD_THREAD_NAME,
    THD_TID,
    VARINT,
)
from .samples import PerfettoSamples  # HOOK(samples)

if TYPE_CHECKING:
    from ._convert import Converter
    from ._fastread import Reader

RawEvent = dict[str, Any]


class _Damaged(Exception):
    """The bytes break the wire format; the message says where."""


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise _Damaged("a varint longer than 10 bytes")
    raise _Damaged("a field that runs past its message")


def _fields(data: bytes, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one message: an int, or bytes for wire type 2.

    Raises:
        _Damaged: the wire format breaks, or data is not bytes (a field read as
            a message that was written as a number).
    """
    if type(data) is not bytes:
        raise _Damaged("a message field that is not length-delimited")
    end = len(data) if end is None else end
    while pos < end:
        key, pos = _varint(data, pos, end)
        field, wire = key >> 3, key & 7
        value: int | bytes
        if wire == VARINT:
            value, pos = _varint(data, pos, end)
        elif wire == BYTES:
            size, pos = _varint(data, pos, end)
            if pos + size > end:
                raise _Damaged("a field that runs past its message")
            value, pos = data[pos : pos + size], pos + size
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if pos + width > end:
                raise _Damaged("a field that runs past its message")
            value, pos = int.from_bytes(data[pos : pos + width], "little"), pos + width
        else:
            raise _Damaged(f"wire type {wire} (field {field})")
        if field == 0:
            raise _Damaged("field number 0")
        yield field, wire, value


def _uint(value: Any) -> int:
    """A number field's value; _Damaged when the field was written as bytes."""
    if type(value) is not int:
        raise _Damaged("a number field that is length-delimited")
    return value


def _signed(value: Any) -> int:
    """An int64 field's value: varints carry negative numbers as 64-bit two's complement."""
    bits = _uint(value) & ((1 << 64) - 1)
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def _text(value: Any) -> str:
    if not isinstance(value, bytes):
        raise _Damaged("a string field that is not length-delimited")
    return value.decode("utf-8", errors="replace")


def _packed(wire: int, value: Any) -> list[int]:
    """A repeated integer field's values, packed or not."""
    if wire != BYTES:
        return [value]
    out, pos = [], 0
    while pos < len(value):
        item, pos = _varint(value, pos, len(value))
        out.append(item)
    return out


def packets(data: bytes) -> tuple[list[bytes], bool]:
    """Each whole top-level packet, and whether the data ends inside one.

    Example:
        >>> packets(b"\\x0a\\x02\\x50\\x01\\x0a\\x05\\x50")
        ([b'P\\x01'], True)
    """
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        if data[pos] != 0x0A:
            raise _Damaged(f"byte {pos}: 0x{data[pos]:02x} where a packet (0x0a) begins")
        try:
            size, start = _varint(data, pos + 1, len(data))
        except _Damaged:
            return out, True
        if start + size > len(data):
            return out, True
        out.append(data[start : start + size])
        pos = start + size
    return out, False


class _Sequence:
    """One packet sequence's incremental state: interned names, defaults, clocks."""

    __slots__ = ("names", "categories", "clock", "track", "deltas", "offsets", "gen")

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.categories: dict[int, str] = {}
        self.gen = 0  # counts changes to names and categories (the compiled path's cache)
        self.clock: int | None = None  # TracePacketDefaults.timestamp_clock_id
        self.track: int | None = None  # TrackEventDefaults.track_uuid
        # Incremental clocks: clock id -> the clock's last value.
        self.deltas: dict[int, int] = {}
        # The sequence's own clocks (ids 64 to 127) -> MONOTONIC minus them.
        self.offsets: dict[int, int] = {}

    def clear(self) -> None:
        self.names.clear()
        self.categories.clear()
        self.clock = self.track = None
        self.gen += 1


class _Decoder:
    """Packets in file order to events, with each sequence's state.

    Two outputs, one decoding.  With a ``Converter`` (``load``), a slice's
    begin and end are paired on their track, in file order (the writers put
    a track's begins and ends in nesting order), and the range goes straight
    to its thread's sink (``Thread.put``: the columns of trace/_columns.py)
    when it ends, as a JSON trace has its ``X`` events; instants and
    counters likewise.  Without one (``read_perfetto``), every event becomes
    the raw dict ``read_raw`` gives for JSON, ``B``/``E`` as in the file.

    Timestamps: a packet's clock is its ``timestamp_clock_id``, else its
    sequence's default, else MONOTONIC; an incremental clock adds the
    packet's value to the clock's last; a sequence's own clock (ids 64 to
    127) maps to MONOTONIC by its ClockSnapshot.  ``ts`` counts ns from the
    first MONOTONIC snapshot (the trace's base).
    """

    def __init__(self, converter: Converter | None, reader: Reader | None = None) -> None:
        self.converter = converter
        self.events: list[RawEvent] = []  # the raw output (converter None)
        self.metadata: dict[str, Any] = {}
        self.sequences: dict[int, _Sequence] = {}
        # uuid -> ("process" | "thread" | "counter" | "track", pid, tid, name)
        self.tracks: dict[int, tuple[str, int, int, str]] = {}
        self.async_cats: dict[int, str] = {}
        self.pid = 0  # the pid of the last process track: global events belong to it
        self.layout = 0  # counts changes to tracks, pid and base (the compiled path's)
        self.base: int | None = None  # MONOTONIC ns of ts 0
        self.samples = PerfettoSamples()  # HOOK(samples): stack samples
        self.sample_sequences: set[int] = set()  # sequences that interned frames
        # Open slices per track: (ts ns, name, category, args); pids and tids per track.
        self.open: dict[int, list[tuple[int, str, str, Any]]] = {}
        self.sinks: dict[tuple[int, int], Any] = {}  # (pid, tid) -> put or sink.append
        self.unmatched = 0
        self.count = 0  # packets decoded
        # The compiled path (load only, where built: reader, _fastread's for
        # converter): it holds the open slices instead.
        self.compiled = None if reader is None or converter is None else _Compiled(reader)

    # ---- the hot loop ----

    def run(self, data: bytes, pos: int) -> int:
        """Decode the whole packets of data from pos; where the first
        incomplete one begins (``count``: packets decoded so far).

        Raises:
            _Damaged: the wire format breaks (the message says where).
        """
        end = len(data)
        seqs = self.sequences
        last_seq = -1
        state = _Sequence()
        raw = self.converter is None
        opened = self.open
        # The fast path (load only): the current sequence's default clock
        # when it is incremental and its events have a default track, else -1.
        fast = -1
        deltas: dict[int, int] = {}
        names: dict[int, str] = {}
        cats: dict[int, str] = {}
        stack: list[tuple[int, str, str, Any]] = []
        emit: Any = None
        append: Any = None  # the sink's append when it takes Events (no put)
        pid = tid = 0  # the fast track's thread
        shift = 0
        now = 0  # the fast clock's value (written back to deltas when the fast path ends)
        end_tail = begin_head = b""
        count = self.count
        compiled = self.compiled
        try:
            while pos < end:
                if data[pos] != 0x0A:
                    raise _Damaged(f"byte {pos}: 0x{data[pos]:02x} where a packet (0x0a) begins")
                n = data[pos + 1] if pos + 1 < end else 0x80
                if n < 0x80:
                    p = pos + 2
                else:
                    try:
                        n, p = _varint(data, pos + 1, end)
                    except _Damaged:
                        break  # cut inside the length
                stop = p + n
                if stop > end:
                    break
                if fast >= 0 and n >= 8 and data[p] == 0x40:
                    # The compact encoding's begins and ends on the thread's
                    # track, told by their last bytes: an end is (delta)
                    # 50 seq 5A 02 48 02; a begin (delta) 50 seq 68 02 5A 06
                    # 48 01 50 name_iid 18 category_iid (iids below 128).
                    # Anything else, or any surprise, goes the general way.
                    if data[stop - 6 : stop] == end_tail and stack:
                        m = n - 7  # the delta's bytes
                        v = data[p + 1]
                        if m == 1 and v < 0x80:
                            pass
                        elif m == 2 and v >= 0x80 and data[p + 2] < 0x80:
                            v = (v & 0x7F) | data[p + 2] << 7
                        else:
                            v, q = _varint(data, p + 1, stop)
                            v = v if q == stop - 6 else -1
                        if v >= 0:
                            now += v
                            start, name, cat, args = stack.pop()
                            ts = now + shift
                            dur = ts - start if ts > start else 0
                            if append is None:
                                emit(start, dur, name, cat, "X", args or NO_ARGS)
                            else:  # a summary: the Event it takes, without a call between
                                append(Event(name, cat, "X", start, dur, pid, tid, args or NO_ARGS))
                            count += 1
                            pos = stop
                            continue
                    elif (
                        n >= 14
                        and data[stop - 12 : stop - 3] == begin_head
                        and data[stop - 2] == 0x18
                        and data[stop - 3] < 0x80
                        and data[stop - 1] < 0x80
                    ):
                        m = n - 13
                        v = data[p + 1]
                        if m == 1 and v < 0x80:
                            pass
                        elif m == 2 and v >= 0x80 and data[p + 2] < 0x80:
                            v = (v & 0x7F) | data[p + 2] << 7
                        else:
                            v, q = _varint(data, p + 1, stop)
                            v = v if q == stop - 12 else -1
                        named = names.get(data[stop - 3])
                        category = cats.get(data[stop - 1])
                        if v >= 0 and named is not None and category is not None:
                            now += v
                            stack.append((now + shift, named, category, None))
                            count += 1
                            pos = stop
                            continue
                if fast >= 0:  # the general way: the clock's value where it reads it
                    deltas[fast] = now
                    fast = -1
                # The packet's fields: numbers kept, messages as (start, stop).
                ts = seq = flags = 0
                has_ts = False
                clock = -1
                event = -1
                event_end = 0
                other: list[tuple[int, int, int]] | None = None
                while p < stop:
                    key = data[p]
                    p += 1
                    if key >= 0x80:
                        key, p = _varint(data, p - 1, stop)
                    wire = key & 7
                    if wire == 0:
                        v = data[p]
                        if v < 0x80:
                            p += 1
                        else:
                            v, p = _varint(data, p, stop)
                        if key == 0x40:
                            ts, has_ts = v, True
                        elif key == 0x50:
                            seq = v
                        elif key == 0x68:
                            flags = v
                        elif key == 0x1D0:  # timestamp_clock_id (58)
                            clock = v
                        elif key >> 3 == 0:
                            raise _Damaged("field number 0")
                        elif key >> 3 in _PACKET_MESSAGES:
                            raise _Damaged("a message field that is not length-delimited")
                    elif wire == 2:
                        v = data[p]
                        if v < 0x80:
                            p += 1
                        else:
                            v, p = _varint(data, p, stop)
                        if key == 0x5A:
                            event, event_end = p, p + v
                        else:
                            if key >> 3 == 0:
                                raise _Damaged("field number 0")
                            if key >> 3 in _PACKET_NUMBERS:
                                raise _Damaged("a number field that is length-delimited")
                            if other is None:
                                other = []
                            other.append((key >> 3, p, p + v))
                        p += v
                    elif wire == 1:
                        p += 8
                    elif wire == 5:
                        p += 4
                    else:
                        raise _Damaged(f"wire type {wire} (field {key >> 3})")
                if p != stop:
                    raise _Damaged("a field that runs past its message")
                count += 1
                pos = stop
                if seq != last_seq:
                    found = seqs.get(seq)
                    if found is None:
                        found = seqs[seq] = _Sequence()
                    state, last_seq = found, seq
                if flags & SEQ_INCREMENTAL_STATE_CLEARED:
                    state.clear()
                    if seq in self.sample_sequences:
                        self.samples.clear()  # HOOK(samples)
                perf = None if other is None else self.fields(data, other, state, seq)
                if has_ts:
                    if clock < 0:
                        clock = state.clock if state.clock is not None else CLOCK_MONOTONIC
                    if clock in state.deltas:
                        ts = state.deltas[clock] = state.deltas[clock] + ts
                    if clock != CLOCK_MONOTONIC:
                        ts += state.offsets.get(clock, 0)
                    ts -= self.base or 0
                if event >= 0:
                    if not has_ts:
                        continue
                    self.track_event(data, event, event_end, ts, state, raw, opened)
                elif perf is not None and has_ts:  # HOOK(samples)
                    entry = _entry(perf, repeated=0, numbers=(2, 3, 4))
                    events = self.samples.sample(entry, _us(ts), state.names, state.categories)
                    self.put_raw(events)
                # Whether the next packets of this sequence may take the fast path.
                fast = -1
                if compiled is not None and state.track is not None:
                    clock = state.clock if state.clock is not None else CLOCK_MONOTONIC
                    if clock in state.deltas:  # the compiled path takes what it can
                        pos, count = compiled.run(self, data, pos, count, last_seq, state, clock)
                elif not raw and last_seq < 0x80 and state.track is not None:
                    clock = state.clock if state.clock is not None else CLOCK_MONOTONIC
                    if clock in state.deltas:
                        fast = clock
                        deltas, names, cats = state.deltas, state.names, state.categories
                        now = deltas[clock]
                        end_tail = bytes((0x50, last_seq, 0x5A, 2, 0x48, END))
                        begin_head = bytes((0x50, last_seq, 0x68, 2, 0x5A, 6, 0x48, BEGIN, 0x50))
                        stack = opened.setdefault(state.track, [])
                        where = self.tracks.get(state.track)
                        pid = where[1] if where else self.pid
                        tid = where[2] if where and where[0] == "thread" else 0
                        emit = self.sink_put(pid, tid)
                        append = getattr(emit, "sink_append", None)
                        shift = -(self.base or 0)
                        if clock != CLOCK_MONOTONIC:
                            shift += state.offsets.get(clock, 0)
        except IndexError:
            self.count = count  # the damaged packet's index
            raise _Damaged("a field that runs past its message") from None
        except _Damaged:
            self.count = count
            raise
        if fast >= 0:
            deltas[fast] = now
        self.count = count
        return pos

    def track_event(
        self,
        data: bytes,
        p: int,
        stop: int,
        ts: int,
        state: _Sequence,
        raw: bool,
        opened: dict[int, list[tuple[int, str, str, Any]]],
    ) -> None:
        """One TrackEvent at data[p:stop], at ts ns from the base."""
        kind = 0
        track = state.track
        name_iid = 0
        name: str | None = None
        cat: str | None = None
        value: int = 0
        args: dict[str, Any] | None = None
        while p < stop:
            key = data[p]
            p += 1
            if key >= 0x80:
                key, p = _varint(data, p - 1, stop)
            wire = key & 7
            if wire == 0:
                v = data[p]
                if v < 0x80:
                    p += 1
                else:
                    v, p = _varint(data, p, stop)
                if key == 0x48:
                    kind = v
                elif key == 0x50:
                    name_iid = v
                elif key == 0x18:
                    c = state.categories.get(v, "")
                    cat = f"{cat},{c}" if cat else c
                elif key == 0x58:
                    track = v
                elif key == 0xF0:  # counter_value (30)
                    value = _signed(v)
                elif key >> 3 == 0:
                    raise _Damaged("field number 0")
                elif key >> 3 in _EVENT_MESSAGES:
                    raise _Damaged("a message field that is not length-delimited")
            elif wire == 2:
                v = data[p]
                if v < 0x80:
                    p += 1
                else:
                    v, p = _varint(data, p, stop)
                field = key >> 3
                body = data[p : p + v]
                p += v
                if field == TE_NAME:
                    name = _text(body)
                elif field == TE_CATEGORIES:
                    c = _text(body)
                    cat = f"{cat},{c}" if cat else c
                elif field == TE_CATEGORY_IIDS:  # packed
                    for i in _packed(BYTES, body):
                        c = state.categories.get(i, "")
                        cat = f"{cat},{c}" if cat else c
                elif field == TE_DEBUG_ANNOTATIONS:
                    if args is None:
                        args = {}
                    args.update(_annotation(body))
                elif field == 0:
                    raise _Damaged("field number 0")
                elif field in _EVENT_NUMBERS:
                    raise _Damaged("a number field that is length-delimited")
            elif wire == 1:
                p += 8
            elif wire == 5:
                p += 4
            else:
                raise _Damaged(f"wire type {wire} (field {key >> 3})")
        if p != stop:
            raise _Damaged("a field that runs past its message")
        if track is None:
            track = 0
        if kind == END and not raw:
            if self.compiled is not None:
                popped = self.compiled.pop(track)
            else:
                stack = opened.get(track)
                popped = stack.pop() if stack else None
            if popped is None:
                self.unmatched += 1
                return
            start, name, cat, begin_args = popped
            if args:  # the end's args add to the begin's, as for JSON's E
                begin_args = {**(begin_args or {}), **args}
            where = self.tracks.get(track)
            pid = where[1] if where else self.pid
            tid = where[2] if where and where[0] == "thread" else 0
            self.put(pid, tid, start, ts - start if ts > start else 0, name, cat, "X", begin_args)
            return
        if name is None and kind != END:
            name = state.names.get(name_iid, "")
        if kind == BEGIN and not raw:
            if args is not None and "cut_short" in args:
                args["cut_short"] = bool(args["cut_short"])
            if self.compiled is not None:
                self.compiled.push(track, ts, name or "", cat or "", args)
                return
            stack = opened.get(track)
            if stack is None:
                stack = opened[track] = []
            stack.append((ts, name or "", cat or "", args))
            return
        where = self.tracks.get(track)
        pid = where[1] if where else self.pid
        tid = where[2] if where and where[0] == "thread" else 0
        if kind == INSTANT:
            if not raw:
                self.put(pid, tid, ts, None, name or "", cat or "", "i", args)
                return
            out: RawEvent = {"name": name, "cat": cat or "", "ts": _us(ts), "pid": pid, "tid": tid}
            scope = "t" if where and where[0] == "thread" else "p" if where else "g"
            out.update(ph="i", s=scope)
        elif kind == COUNTER:
            counter = where[3] if where else name or ""
            if not raw:
                self.put(pid, 0, ts, None, counter, "", "C", {counter: value})
                return
            out = {"name": counter, "cat": "", "ts": _us(ts), "pid": pid, "tid": 0}
            out.update(ph="C", args={counter: value})
            self.events.append(out)
            return
        elif kind in (BEGIN, END):  # raw only
            out = {"name": name, "cat": cat or "", "ts": _us(ts), "pid": pid, "tid": tid}
            if where is not None and where[0] != "thread":
                out.update(ph="b" if kind == BEGIN else "e", id=track)
                if kind == BEGIN:
                    self.async_cats[track] = out["cat"]
                out["cat"] = self.async_cats.get(track, out["cat"])  # pairs b/e
            else:
                out["ph"] = "B" if kind == BEGIN else "E"
            if kind == END:
                del out["name"]  # an end closes the innermost open begin
                if not args:
                    self.events.append(out)
                    return
        else:
            return
        if args is not None and "cut_short" in args:  # the JSON writer's true, written as 1
            args["cut_short"] = bool(args["cut_short"])
        if args:
            out["args"] = args
        self.events.append(out)

    def put(
        self,
        pid: int,
        tid: int,
        ts: int,
        dur: int | None,
        name: str,
        cat: str,
        ph: str,
        args: dict[str, Any] | None,
    ) -> None:
        """An event to its thread's sink in the converter (times in ns)."""
        put = self.sink_put(pid, tid)  # (the sinks are made in the pure path's order)
        if self.compiled is not None:
            # After the compiled path's ranges, in file order: in its rows,
            # or (times out of its range) once they went.
            if self.compiled.put(pid, tid, ts, dur, name, cat, ph, args):
                return
            self.compiled.flush()
        put(ts, dur, name, cat, ph, args or NO_ARGS)

    def sink_put(self, pid: int, tid: int) -> Any:
        """put(ts, dur, name, category, ph, args) of the thread's sink."""
        key = (pid, tid)
        put = self.sinks.get(key)
        if put is None:
            assert self.converter is not None
            sink = self.converter.sink(key)
            put = self.sinks[key] = getattr(sink, "put", None) or _appender(sink, pid, tid)
        return put

    def put_raw(self, events: list[RawEvent]) -> None:
        """Raw events (names, samples): to the output, or through the converter."""
        if self.converter is None:
            self.events += events
        else:  # (names and samples: the converter keeps them apart from the sinks)
            for e in events:
                self.converter.add(e)

    # ---- the rest: descriptors, interned data, clocks, samples ----

    def fields(
        self, data: bytes, other: list[tuple[int, int, int]], state: _Sequence, seq: int
    ) -> bytes | None:
        """A packet's messages besides its TrackEvent; a PerfSample's bytes."""
        perf = None
        for field, start, stop in other:
            value = data[start:stop]
            if field == PK_PERF_SAMPLE:  # HOOK(samples)
                perf = value
            elif field == PK_CLOCK_SNAPSHOT:
                self.clock_snapshot(value, state)
            elif field == PK_INTERNED_DATA:
                self.interned(value, state, seq)
            elif field == PK_TRACK_DESCRIPTOR:
                self.track(value)
            elif field == PK_CHROME_EVENTS:
                self.chrome_metadata(value)
            elif field == PK_DEFAULTS:
                for f, _, v in _fields(value):
                    if f == DEF_TIMESTAMP_CLOCK_ID:
                        state.clock = _uint(v)
                    elif f == DEF_TRACK_EVENT:
                        for g, _, w in _fields(v):
                            if g == TED_TRACK_UUID:
                                state.track = _uint(w)
        return perf

    def clock_snapshot(self, data: bytes, state: _Sequence) -> None:
        clocks = {}
        incremental = set()
        for field, _, value in _fields(data):
            if field == 1:
                clock = {f: v for f, _, v in _fields(value)}
                clocks[_uint(clock.get(1, 0))] = _uint(clock.get(2, 0))
                if clock.get(3):
                    incremental.add(_uint(clock.get(1, 0)))
        if self.base is None and CLOCK_MONOTONIC in clocks:
            self.base = clocks[CLOCK_MONOTONIC]
            if CLOCK_REALTIME in clocks:
                self.metadata["baseTimeNanoseconds"] = clocks[CLOCK_REALTIME]
        mono = clocks.get(CLOCK_MONOTONIC)
        for number, value in clocks.items():
            if number in incremental:
                state.deltas[number] = value  # the next timestamp counts from here
            if 64 <= number < 128 and mono is not None:
                state.offsets[number] = mono - value
        self.layout += 1

    def chrome_metadata(self, data: bytes) -> None:
        """A ChromeEventBundle's metadata (what ``writer.PerfettoWriter.metadata``
        writes: Chrome JSON's top-level keys) into the trace's metadata."""
        for field, _, value in _fields(data):
            if field != CE_METADATA:
                continue
            entry = {f: v for f, _, v in _fields(value)}
            name = _text(entry.get(CM_NAME, b""))
            if CM_JSON in entry:
                try:
                    self.metadata[name] = json.loads(_text(entry[CM_JSON]))
                except ValueError:
                    raise _Damaged(f"metadata {name!r}: not JSON") from None
            elif CM_STRING in entry:
                self.metadata[name] = _text(entry[CM_STRING])
            elif CM_INT in entry:
                self.metadata[name] = _signed(entry[CM_INT])
            elif CM_BOOL in entry:
                self.metadata[name] = bool(_uint(entry[CM_BOOL]))

    def interned(self, data: bytes, state: _Sequence, seq: int) -> None:
        for field, _, value in _fields(data):
            table = {ID_EVENT_NAMES: state.names, ID_EVENT_CATEGORIES: state.categories}.get(field)
            if table is not None:
                state.gen += 1
                entry = dict((f, v) for f, _, v in _fields(value))
                table[entry.get(INTERNED_IID, 0)] = _text(entry.get(INTERNED_NAME, b""))
            elif field in SAMPLE_INTERNED:  # HOOK(samples): frames and callstacks
                self.sample_sequences.add(seq)
                # function names (5): iid, text; frames (6), callstacks (7): numbers
                strings = (2,) if field == 5 else ()
                numbers = (1,) if field == 5 else (1, 2)
                entry = _entry(value, 2 if field == 7 else 0, numbers, strings)
                self.samples.interned(field, entry)

    def track(self, data: bytes) -> None:
        uuid, name, kind, pid, tid = 0, "", "track", self.pid, 0
        parent = None
        for field, _, value in _fields(data):
            if field == TD_UUID:
                uuid = _uint(value)
            elif field == TD_PARENT_UUID:
                parent = self.tracks.get(_uint(value))
            elif field == TD_NAME:
                name = _text(value)
            elif field == TD_COUNTER:
                kind = "counter"
            elif field in (TD_PROCESS, TD_THREAD):
                kind = "process" if field == TD_PROCESS else "thread"
                for f, _, v in _fields(value):
                    if f == DESC_PID:
                        pid = _signed(v)
                    elif f == THD_TID and kind == "thread":
                        tid = _signed(v)
                    elif (f, kind) in ((THD_THREAD_NAME, "thread"), (PD_PROCESS_NAME, "process")):
                        name = _text(v)
        if kind in ("track", "counter") and parent is not None:
            pid = parent[1]  # a named track belongs to its parent's process
        if kind == "process":
            self.pid = pid
            meta = {"name": "process_name", "ph": "M", "pid": pid, "tid": 0}
            self.put_raw([{**meta, "args": {"name": name}}])
        elif kind == "thread":
            meta = {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid}
            self.put_raw([{**meta, "args": {"name": name}}])
        self.tracks[uuid] = (kind, pid, tid, name)
        self.layout += 1


class _Compiled:
    """The compiled fast path of ``_Decoder`` (``load`` only): the slice begins
    and ends and the counter samples of the core's compact encoding, decoded
    and paired in C (native/offline/mxo_pftrace.h says which packets it
    takes; it leaves every other one to the decoder, which alone judges
    damage).

    The open slices of every track are kept in C, the decoder pushing and
    popping the ones it decodes (``push``/``pop``), so a slice may begin on
    one side and end on the other.  Finished ranges and samples become rows
    of the C reader's columns; the events the decoder decodes itself join
    the same rows (``put``; their args held in ``Reader.held``), so one
    stream in file order goes to the threads' sinks, in batches
    (``_fastread.Reader.flush_rows``: columns at once for a ``Thread``, the
    summary's rule in C for ``key_averages``, one by one for other sinks).
    The sinks are made where the pure decoding makes them (merge numbers
    pids in that order), so everything comes out as the pure decoding gives it.
    """

    def __init__(self, reader: Reader) -> None:
        ffi, lib = reader.ffi, reader.lib
        self.lib = lib
        self.reader = reader
        self.r = reader.state
        pf = lib.mxo_pf_new()
        if pf == ffi.NULL:
            raise MemoryError("mxprof: out of memory reading a trace")
        self.pf = ffi.gc(pf, lib.mxo_pf_free)
        self.stacks: dict[int, int] = {}  # track uuid -> its stack's handle in C
        self.protos: list[tuple[str, str, str]] = []  # (name, category, ph) per proto id
        self.proto_ids: dict[tuple[str, str, str], int] = {}
        self.args: list[dict[str, Any]] = []  # the args of the rows Python put
        reader.held = self.args
        # Begins C does not hold (args, or a time out of its range), by -ref - 1.
        self.begins: dict[int, tuple[int, str, str, Any]] = {}
        self.next_begin = 0
        # (sequence, gen, layout) of the C's cache of iids and counter tracks
        self.tag: tuple[Any, ...] | None = None
        self.view: tuple[Any, ...] | None = None  # what run last set the C to (see run)
        self.thread = (0, 0)  # the view's (pid, tid)
        self.pos = ffi.new("size_t *")
        self.ts = ffi.new("int64_t *")
        self.ref = ffi.new("int64_t *")

    def _check(self, rc: int) -> int:
        if rc < 0:
            raise MemoryError("mxprof: out of memory reading a trace")
        return rc

    def stack(self, track: int) -> int:
        handle = self.stacks.get(track)
        if handle is None:
            handle = self.stacks[track] = self._check(self.lib.mxo_pf_stack_new(self.pf))
        return handle

    def proto(self, name: str, cat: str, ph: str = "X") -> int:
        """The C's id of a (name, category, phase)."""
        key = (name, cat, ph)
        p = self.proto_ids.get(key)
        if p is None:
            n, c = name.encode("utf-8"), cat.encode("utf-8")
            p = self.proto_ids[key] = self._check(
                self.lib.mxo_pf_proto(self.pf, n, len(n), c, len(c), ph.encode("ascii"))
            )
            self.protos.append(key)
        return p

    def put(
        self,
        pid: int,
        tid: int,
        ts: int,
        dur: int | None,
        name: str,
        cat: str,
        ph: str,
        args: dict[str, Any] | None,
    ) -> bool:
        """An event the decoder decoded, to the rows after the C's (``_Decoder.put``);
        False where its numbers are out of the rows' range (the caller puts it)."""
        if dur is None:
            dur = _NO_DUR
        elif not 0 <= dur < _TS_LIMIT:
            return False
        if not (-_TS_LIMIT < ts < _TS_LIMIT and -_I64 <= pid < _I64 and -_I64 <= tid < _I64):
            return False
        held = 0
        if args:
            self.args.append(args)
            held = len(self.args)
        proto = self.proto_ids.get((name, cat, ph))
        if proto is None:
            proto = self.proto(name, cat, ph)
        rc = self.lib.mxo_pf_put(self.r, self.pf, pid, tid, ts, dur, proto, held)
        if rc:
            self._check(rc)
            self.reader.flush_rows()  # _FULL: rows (and args) held in bounded memory
        return True

    def push(self, track: int, ts: int, name: str, cat: str, args: dict[str, Any] | None) -> None:
        """A slice begun on track (decoded by the decoder)."""
        if args is None and -_TS_LIMIT < ts < _TS_LIMIT:
            ref = self.proto(name, cat)
        else:
            self.begins[self.next_begin] = (ts, name, cat, args)
            ref = -1 - self.next_begin
            self.next_begin += 1
            ts = 0
        self._check(self.lib.mxo_pf_push(self.pf, self.stack(track), ts, ref))

    def pop(self, track: int) -> tuple[int, str, str, Any] | None:
        """The innermost slice open on track (ts, name, category, args), or None."""
        handle = self.stacks.get(track)
        if handle is None or not self._check(
            self.lib.mxo_pf_pop(self.pf, handle, self.ts, self.ref)
        ):
            return None
        ref = self.ref[0]
        if ref < 0:
            return self.begins.pop(-1 - ref)
        name, cat, _ = self.protos[ref]
        return self.ts[0], name, cat, None

    def open(self) -> int:
        """Slices still open, on every track."""
        return int(self.pf.open)

    def flush(self) -> None:
        """The ranges paired in C so far to their sinks."""
        if self.r.n:
            self.reader.flush_rows()

    def run(
        self,
        decoder: _Decoder,
        data: bytes,
        pos: int,
        count: int,
        seq: int,
        state: _Sequence,
        clock: int,
    ) -> tuple[int, int]:
        """The packets from pos that C takes, on sequence seq (whose default
        track and incremental clock are state's): where it stopped, and the
        packets decoded (count on)."""
        lib, pf = self.lib, self.pf
        # The C's view of the sequence, set again only when it changed.
        view = (seq, state.gen, state.track, clock, decoder.layout)
        if view != self.view:
            self.view = None
            track = state.track
            assert track is not None
            where = decoder.tracks.get(track)
            pid = where[1] if where else decoder.pid
            tid = where[2] if where and where[0] == "thread" else 0
            self.thread = (pid, tid)
            if seq < 0x80:  # the pure decoding's fast path makes the sink here
                decoder.sink_put(pid, tid)
            shift = -(decoder.base or 0)
            if clock != CLOCK_MONOTONIC:
                shift += state.offsets.get(clock, 0)
            if not (
                -_SAFE <= shift <= _SAFE
                and 0 <= seq < 1 << 64
                and -_I64 <= pid < _I64
                and -_I64 <= tid < _I64
            ):
                return pos, count
            pf.seq = seq
            pf.shift = shift
            pf.stack = self.stack(track)
            self._check(lib.mxo_pf_thread(self.r, pf, pid, tid))
            if self.tag != view[:2] + view[4:]:  # the cache holds another sequence's names
                lib.mxo_pf_uncache(pf)  # (or counter tracks of another layout)
                self.tag = view[:2] + view[4:]
            self.view = view
        now = state.deltas[clock]
        if not -_SAFE <= now <= _SAFE:
            return pos, count
        pf.now = now
        pf.count = count
        self.pos[0] = pos
        ranges = pf.ranges  # (the sink of the sequence's thread: see below)
        while True:
            rc = self._check(lib.mxo_pf_run(self.r, pf, data, len(data), self.pos))
            if rc == _STOP:
                break
            if rc == _MISS:  # a begin's names, as track_event reads them
                name_iid, cat_iid = pf.miss_name, pf.miss_cat
                name = state.names.get(name_iid, "")
                proto = self.proto(name, state.categories.get(cat_iid, ""))
                self._check(lib.mxo_pf_cache(pf, name_iid, cat_iid, proto))
            elif rc == _MISS_TRACK:  # a counter's track, as track_event reads it
                if pf.ranges > ranges:  # (the sinks in the pure decoding's order)
                    decoder.sink_put(*self.thread)
                track = pf.miss_track
                where = decoder.tracks.get(track)
                pid = where[1] if where else decoder.pid
                counter = where[3] if where else state.names.get(0, "")
                decoder.sink_put(pid, 0)  # where the pure decoding puts the sample
                proto = self.proto(counter, "", "C")
                self._check(lib.mxo_pf_cache_track(self.r, pf, track, proto, pid, 0))
            else:  # _FULL
                if pf.ranges > ranges:
                    decoder.sink_put(*self.thread)
                self.reader.flush_rows()
        if pf.ranges > ranges:  # the pure decoding makes the sink at its first range
            decoder.sink_put(*self.thread)
        state.deltas[clock] = pf.now
        return self.pos[0], pf.count


_STOP, _MISS, _MISS_TRACK = 0, 1, 3  # mxo_pf_run's answers (mxo_pftrace.h), and MXO_PF_FULL
_NO_DUR = -(1 << 63)  # MXO_NO_DUR: a point's dur
_I64 = 1 << 63  # pids and tids: int64
_SAFE = 1 << 61  # MXO_PF_SAFE: |now| and |shift| the compiled path takes
_TS_LIMIT = 1 << 62  # MXO_PF_TS_LIMIT: a begin's |ts| it holds


# Fields whose wire type is fixed: one written otherwise breaks the format.
_PACKET_MESSAGES = frozenset(
    (
        PK_CLOCK_SNAPSHOT,
        PK_TRACK_EVENT,
        PK_INTERNED_DATA,
        PK_DEFAULTS,
        PK_TRACK_DESCRIPTOR,
        PK_CHROME_EVENTS,
        66,
    )
)
_PACKET_NUMBERS = frozenset((PK_TIMESTAMP, PK_SEQUENCE_ID, PK_SEQUENCE_FLAGS, PK_CLOCK_ID))
_EVENT_MESSAGES = frozenset((TE_DEBUG_ANNOTATIONS, TE_NAME, TE_CATEGORIES))
_EVENT_NUMBERS = frozenset((TE_TYPE, TE_TRACK_UUID, TE_NAME_IID, TE_COUNTER_VALUE))


def _us(ns: int) -> float | int:
    """ns from the base to µs, exact to the ns for ~52 days."""
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


def _appender(sink: Any, pid: int, tid: int) -> Any:
    """A sink without ``put`` (a running summary) given the fields as Events."""

    def put(ts: int, dur: int | None, name: str, cat: str, ph: str, args: Any) -> None:
        sink.append(Event(name, cat, ph, ts, dur, pid, tid, args))

    put.sink_append = sink.append  # type: ignore[attr-defined]  # for the fast path
    return put


def _annotation(data: bytes) -> dict[str, Any]:
    name = ""
    value_: Any = None
    for field, _, v in _fields(data):
        if field == DA_NAME:
            name = _text(v)
        elif field == DA_BOOL:
            value_ = bool(v)
        elif field == DA_UINT:
            value_ = _uint(v)
        elif field == DA_INT:
            value_ = _signed(v)
        elif field == DA_DOUBLE:
            bits = _uint(v) & ((1 << 64) - 1)
            value_ = struct.unpack("<d", bits.to_bytes(8, "little"))[0]
        elif field == DA_STRING:
            value_ = _text(v)
    return {name: value_} if name else {}


# HOOK(samples): TracePacket.perf_sample; InternedData function_names,
# frames, callstacks (mxprof/trace/samples.py reads them).
PK_PERF_SAMPLE = 66
SAMPLE_INTERNED = (5, 6, 7)


def _entry(
    data: bytes, repeated: int, numbers: tuple[int, ...] = (), strings: tuple[int, ...] = ()
) -> dict[int, list[Any]]:
    """A message's fields by number, each a list; field repeated may be packed.

    The fields in numbers must hold numbers and those in strings bytes (else
    _Damaged): the reader of the entry takes them as such.
    """
    out: dict[int, list[Any]] = {}
    for f, wire, v in _fields(data):
        values = _packed(wire, v) if f == repeated else [v]
        if f in numbers:
            values = [_uint(x) for x in values]
        elif f in strings and type(v) is not bytes:
            raise _Damaged("a string field that is not length-delimited")
        out.setdefault(f, []).extend(values)
    return out


def looks_like_perfetto(data: bytes) -> bool:
    """Whether data starts like a protobuf trace rather than JSON text.

    A packet's tag is 0x0a, a newline to JSON; JSON then goes on with
    whitespace and '{' or '['.
    """
    return data[:1] == b"\n" and data.lstrip(b" \t\r\n")[:1] not in (b"{", b"[", b"")


def read_perfetto(data: bytes, where: str) -> tuple[list[RawEvent], dict[str, Any], bool]:
    """``read_raw``'s answer for a Perfetto protobuf trace's bytes.

    Whole packets before a cut load; a packet that breaks the wire format
    raises ``TraceFormatError`` naming the file and the packet.

    Example:
        >>> read_perfetto(b"", "empty.pftrace")
        ([], {}, False)
    """
    decoder = _Decoder(None)
    try:
        pos = decoder.run(data, 0)
    except _Damaged as e:
        message = f"{where}: not a Perfetto trace: packet {decoder.count}: {e}"
        raise TraceFormatError(message) from None
    return decoder.events, decoder.metadata, pos < len(data)


PIECE = 8 << 20  # bytes of the file read at a time


def load_perfetto(
    f: BinaryIO, where: str, converter: Converter, reader: Reader | None = None
) -> tuple[dict[str, Any], bool]:
    """Read a Perfetto trace from f into converter's sinks (``load``'s way);
    with reader (``_fastread.reader(converter)``), by the compiled path where it can.

    The file is read a piece at a time (memory holds a piece, not the file);
    ranges go to their threads' sinks paired, as ``X`` events (see
    ``_Decoder``).  Returns the metadata and whether the file was cut
    inside a packet (whole packets before the cut load); a slice still
    open at the end is counted in ``converter.unmatched``.

    Raises:
        TraceFormatError: a packet breaks the wire format (named by its
            index in the file).
    """
    decoder = _Decoder(converter, reader)
    rest = b""
    while True:
        piece = f.read(PIECE)
        data = rest + piece if rest else piece
        try:
            pos = decoder.run(data, 0)
        except _Damaged as e:
            message = f"{where}: not a Perfetto trace: packet {decoder.count}: {e}"
            raise TraceFormatError(message) from None
        rest = data[pos:]
        if not piece:
            break
    open_slices = sum(len(s) for s in decoder.open.values())
    if decoder.compiled is not None:
        decoder.compiled.flush()
        open_slices += decoder.compiled.open()
    converter.unmatched += decoder.unmatched + open_slices
    return decoder.metadata, bool(rest)
