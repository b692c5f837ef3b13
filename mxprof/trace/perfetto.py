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
  MONOTONIC base gives ``baseTimeNanoseconds``, and ``ts`` counts from that base.

Fields the core never writes (inline names, other clocks, extra tracks) are
read where cheap and otherwise skipped.  No protobuf library is needed.
``writer.write_perfetto`` is the way back, for ``merge``'s output.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from ..errors import TraceFormatError
from ._protobuf import (
    BEGIN,
    BYTES,
    CLOCK_MONOTONIC,
    CLOCK_REALTIME,
    COUNTER,
    DA_BOOL,
    DA_DOUBLE,
    DA_INT,
    DA_NAME,
    DA_STRING,
    DA_UINT,
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
    PK_CLOCK_SNAPSHOT,
    PK_INTERNED_DATA,
    PK_SEQUENCE_FLAGS,
    PK_TIMESTAMP,
    PK_TRACK_DESCRIPTOR,
    PK_TRACK_EVENT,
    SEQ_INCREMENTAL_STATE_CLEARED,
    TD_COUNTER,
    TD_NAME,
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
    THD_THREAD_NAME,
    THD_TID,
    VARINT,
)
from .samples import PerfettoSamples  # HOOK(samples)

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


class _Decoder:
    """Packets in file order to raw events, with the sequence's interned names."""

    def __init__(self) -> None:
        self.events: list[RawEvent] = []
        self.metadata: dict[str, Any] = {}
        self.names: dict[int, str] = {}
        self.categories: dict[int, str] = {}
        # uuid -> ("process" | "thread" | "counter" | "track", pid, tid, name)
        self.tracks: dict[int, tuple[str, int, int, str]] = {}
        self.async_cats: dict[int, str] = {}
        self.pid = 0  # the pid of the last process track: global events belong to it
        self.base: int | None = None  # MONOTONIC ns of ts 0
        self.samples = PerfettoSamples()  # HOOK(samples): stack samples

    def packet(self, data: bytes) -> None:
        ts: int | None = None
        event = perf = None
        for field, wire, value in _fields(data):
            if field == PK_SEQUENCE_FLAGS and _uint(value) & SEQ_INCREMENTAL_STATE_CLEARED:
                self.names.clear()
                self.categories.clear()
                self.samples.clear()  # HOOK(samples)
            elif field == PK_PERF_SAMPLE:  # HOOK(samples)
                perf = value
            elif field == PK_TIMESTAMP and wire == VARINT:
                ts = value
            elif field == PK_CLOCK_SNAPSHOT:
                self.clock_snapshot(value)
            elif field == PK_INTERNED_DATA:
                self.interned(value)
            elif field == PK_TRACK_DESCRIPTOR:
                self.track(value)
            elif field == PK_TRACK_EVENT:
                event = value
        if event is not None:
            self.track_event(event, ts)
        if perf is not None and ts is not None:  # HOOK(samples)
            entry = _entry(perf, repeated=0, numbers=(2, 3, 4))
            self.events += self.samples.sample(entry, self.us(ts), self.names, self.categories)

    def clock_snapshot(self, data: bytes) -> None:
        clocks = {}
        for field, _, value in _fields(data):
            if field == 1:
                clock = dict((f, v) for f, _, v in _fields(value))
                clocks[_uint(clock.get(1, 0))] = _uint(clock.get(2, 0))
        if self.base is None and CLOCK_MONOTONIC in clocks:
            self.base = clocks[CLOCK_MONOTONIC]
            if CLOCK_REALTIME in clocks:
                self.metadata["baseTimeNanoseconds"] = clocks[CLOCK_REALTIME]

    def interned(self, data: bytes) -> None:
        for field, _, value in _fields(data):
            table = {ID_EVENT_NAMES: self.names, ID_EVENT_CATEGORIES: self.categories}.get(field)
            if table is not None:
                entry = dict((f, v) for f, _, v in _fields(value))
                table[entry.get(INTERNED_IID, 0)] = _text(entry.get(INTERNED_NAME, b""))
            elif field in SAMPLE_INTERNED:  # HOOK(samples): frames and callstacks
                # function names (5): iid, text; frames (6), callstacks (7): numbers
                strings = (2,) if field == 5 else ()
                numbers = (1,) if field == 5 else (1, 2)
                entry = _entry(value, 2 if field == 7 else 0, numbers, strings)
                self.samples.interned(field, entry)

    def track(self, data: bytes) -> None:
        uuid, name, kind, pid, tid = 0, "", "track", self.pid, 0
        for field, _, value in _fields(data):
            if field == TD_UUID:
                uuid = _uint(value)
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
        if kind == "process":
            self.pid = pid
            meta = {"name": "process_name", "ph": "M", "pid": pid, "tid": 0}
            self.events.append({**meta, "args": {"name": name}})
        elif kind == "thread":
            meta = {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid}
            self.events.append({**meta, "args": {"name": name}})
        self.tracks[uuid] = (kind, pid, tid, name)

    def track_event(self, data: bytes, ts: int | None) -> None:
        kind = track = name_iid = 0
        name: str | None = None
        cat: str | None = None
        value: int | float = 0
        args: dict[str, Any] = {}
        for field, wire, v in _fields(data):
            if field == TE_TYPE:
                kind = _uint(v)
            elif field == TE_TRACK_UUID:
                track = _uint(v)
            elif field == TE_NAME_IID:
                name_iid = _uint(v)
            elif field == TE_NAME:
                name = _text(v)
            elif field == TE_CATEGORY_IIDS:
                cats = [self.categories.get(i, "") for i in _packed(wire, v)]
                cat = ",".join(([cat] if cat else []) + cats)
            elif field == TE_CATEGORIES:
                cat = ",".join(([cat] if cat else []) + [_text(v)])
            elif field == TE_COUNTER_VALUE:
                value = _signed(v)
            elif field == TE_DEBUG_ANNOTATIONS:
                args.update(_annotation(v))
        if ts is None:
            return
        if name is None:
            name = self.names.get(name_iid, "")
        where = self.tracks.get(track)
        pid = where[1] if where else self.pid
        tid = where[2] if where and where[0] == "thread" else 0
        out: RawEvent = {"name": name, "cat": cat or "", "ts": self.us(ts), "pid": pid, "tid": tid}
        if kind in (BEGIN, END):
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
        elif kind == INSTANT:
            scope = "t" if where and where[0] == "thread" else "p" if where else "g"
            out.update(ph="i", s=scope)
        elif kind == COUNTER:
            counter = where[3] if where else name
            out.update(ph="C", name=counter, args={counter: value})
            self.events.append(out)
            return
        else:
            return
        if "cut_short" in args:  # the JSON writer's true, written as uint 1
            args["cut_short"] = bool(args["cut_short"])
        if args:
            out["args"] = args
        self.events.append(out)

    def us(self, ts: int) -> float | int:
        """ns on the MONOTONIC clock to µs from the base, exact to the ns for ~52 days."""
        ns = ts - (self.base or 0)
        return ns // 1000 if ns % 1000 == 0 else ns / 1000


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
    try:
        blocks, cut = packets(data)
    except _Damaged as e:
        raise TraceFormatError(f"{where}: not a Perfetto trace: {e}") from None
    decoder = _Decoder()
    for i, block in enumerate(blocks):
        try:
            decoder.packet(block)
        except _Damaged as e:
            raise TraceFormatError(f"{where}: not a Perfetto trace: packet {i}: {e}") from None
    return decoder.events, decoder.metadata, cut
