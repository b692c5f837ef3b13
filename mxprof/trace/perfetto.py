"""Read and write the Perfetto protobuf traces mxprof writes, as Chrome-style event dicts.

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
``write_perfetto`` is the way back, for ``merge``'s output.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from ..errors import TraceFormatError

RawEvent = dict[str, Any]

# Wire types.
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
# TracePacket (trace_packet.proto).
_PK_CLOCK_SNAPSHOT, _PK_TIMESTAMP, _PK_SEQUENCE_ID, _PK_TRACK_EVENT = 6, 8, 10, 11
_PK_INTERNED_DATA, _PK_SEQUENCE_FLAGS, _PK_CLOCK_ID, _PK_TRACK_DESCRIPTOR = 12, 13, 58, 60
_SEQ_INCREMENTAL_STATE_CLEARED = 1
_CLOCK_REALTIME, _CLOCK_MONOTONIC = 1, 3
# TrackDescriptor, ProcessDescriptor, ThreadDescriptor.
_TD_UUID, _TD_NAME, _TD_PROCESS, _TD_THREAD, _TD_PARENT_UUID, _TD_COUNTER = 1, 2, 3, 4, 5, 8
_DESC_PID, _THD_TID, _THD_THREAD_NAME, _PD_PROCESS_NAME = 1, 2, 5, 6
# TrackEvent and DebugAnnotation.
_TE_CATEGORY_IIDS, _TE_DEBUG_ANNOTATIONS, _TE_TYPE, _TE_NAME_IID = 3, 4, 9, 10
_TE_TRACK_UUID, _TE_CATEGORIES, _TE_NAME, _TE_COUNTER_VALUE = 11, 22, 23, 30
_BEGIN, _END, _INSTANT, _COUNTER = 1, 2, 3, 4
_DA_BOOL, _DA_UINT, _DA_INT, _DA_DOUBLE, _DA_STRING, _DA_NAME = 2, 3, 4, 5, 6, 10
# InternedData.
_ID_EVENT_CATEGORIES, _ID_EVENT_NAMES, _INTERNED_IID, _INTERNED_NAME = 1, 2, 1, 2

_GLOBAL_TRACK = 0


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
    """(field number, wire type, value) of one message: an int, or bytes for wire type 2."""
    end = len(data) if end is None else end
    while pos < end:
        key, pos = _varint(data, pos, end)
        field, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(data, pos, end)
        elif wire == _BYTES:
            size, pos = _varint(data, pos, end)
            if pos + size > end:
                raise _Damaged("a field that runs past its message")
            value, pos = data[pos : pos + size], pos + size
        elif wire in (_FIXED64, _FIXED32):
            width = 8 if wire == _FIXED64 else 4
            if pos + width > end:
                raise _Damaged("a field that runs past its message")
            value, pos = int.from_bytes(data[pos : pos + width], "little"), pos + width
        else:
            raise _Damaged(f"wire type {wire} (field {field})")
        if field == 0:
            raise _Damaged("field number 0")
        yield field, wire, value


def _signed(value: int) -> int:
    """An int64 field's value: varints carry negative numbers as 64-bit two's complement."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(value: Any) -> str:
    if not isinstance(value, bytes):
        raise _Damaged("a string field that is not length-delimited")
    return value.decode("utf-8", errors="replace")


def _packed(wire: int, value: Any) -> list[int]:
    """A repeated integer field's values, packed or not."""
    if wire != _BYTES:
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

    def packet(self, data: bytes) -> None:
        ts: int | None = None
        event = None
        for field, wire, value in _fields(data):
            if field == _PK_SEQUENCE_FLAGS and value & _SEQ_INCREMENTAL_STATE_CLEARED:
                self.names.clear()
                self.categories.clear()
            elif field == _PK_TIMESTAMP and wire == _VARINT:
                ts = value
            elif field == _PK_CLOCK_SNAPSHOT:
                self.clock_snapshot(value)
            elif field == _PK_INTERNED_DATA:
                self.interned(value)
            elif field == _PK_TRACK_DESCRIPTOR:
                self.track(value)
            elif field == _PK_TRACK_EVENT:
                event = value
        if event is not None:
            self.track_event(event, ts)

    def clock_snapshot(self, data: bytes) -> None:
        clocks = {}
        for field, _, value in _fields(data):
            if field == 1:
                clock = dict((f, v) for f, _, v in _fields(value))
                clocks[clock.get(1)] = clock.get(2, 0)
        if self.base is None and _CLOCK_MONOTONIC in clocks:
            self.base = clocks[_CLOCK_MONOTONIC]
            if _CLOCK_REALTIME in clocks:
                self.metadata["baseTimeNanoseconds"] = clocks[_CLOCK_REALTIME]

    def interned(self, data: bytes) -> None:
        for field, _, value in _fields(data):
            table = {_ID_EVENT_NAMES: self.names, _ID_EVENT_CATEGORIES: self.categories}.get(field)
            if table is not None:
                entry = dict((f, v) for f, _, v in _fields(value))
                table[entry.get(_INTERNED_IID, 0)] = _text(entry.get(_INTERNED_NAME, b""))

    def track(self, data: bytes) -> None:
        uuid, name, kind, pid, tid = 0, "", "track", self.pid, 0
        for field, _, value in _fields(data):
            if field == _TD_UUID:
                uuid = value
            elif field == _TD_NAME:
                name = _text(value)
            elif field == _TD_COUNTER:
                kind = "counter"
            elif field in (_TD_PROCESS, _TD_THREAD):
                kind = "process" if field == _TD_PROCESS else "thread"
                for f, _, v in _fields(value):
                    if f == _DESC_PID:
                        pid = _signed(v)
                    elif f == _THD_TID and kind == "thread":
                        tid = _signed(v)
                    elif (f, kind) in ((_THD_THREAD_NAME, "thread"), (_PD_PROCESS_NAME, "process")):
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
            if field == _TE_TYPE:
                kind = v
            elif field == _TE_TRACK_UUID:
                track = v
            elif field == _TE_NAME_IID:
                name_iid = v
            elif field == _TE_NAME:
                name = _text(v)
            elif field == _TE_CATEGORY_IIDS:
                cats = [self.categories.get(i, "") for i in _packed(wire, v)]
                cat = ",".join(([cat] if cat else []) + cats)
            elif field == _TE_CATEGORIES:
                cat = ",".join(([cat] if cat else []) + [_text(v)])
            elif field == _TE_COUNTER_VALUE:
                value = _signed(v)
            elif field == _TE_DEBUG_ANNOTATIONS:
                args.update(_annotation(v))
        if ts is None:
            return
        if name is None:
            name = self.names.get(name_iid, "")
        where = self.tracks.get(track)
        pid = where[1] if where else self.pid
        tid = where[2] if where and where[0] == "thread" else 0
        out: RawEvent = {"name": name, "cat": cat or "", "ts": self.us(ts), "pid": pid, "tid": tid}
        if kind in (_BEGIN, _END):
            if where is not None and where[0] != "thread":
                out.update(ph="b" if kind == _BEGIN else "e", id=track)
                if kind == _BEGIN:
                    self.async_cats[track] = out["cat"]
                out["cat"] = self.async_cats.get(track, out["cat"])  # pairs b/e
            else:
                out["ph"] = "B" if kind == _BEGIN else "E"
            if kind == _END:
                del out["name"]  # an end closes the innermost open begin
                if not args:
                    self.events.append(out)
                    return
        elif kind == _INSTANT:
            scope = "t" if where and where[0] == "thread" else "p" if where else "g"
            out.update(ph="i", s=scope)
        elif kind == _COUNTER:
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
        if field == _DA_NAME:
            name = _text(v)
        elif field == _DA_BOOL:
            value_ = bool(v)
        elif field == _DA_UINT:
            value_ = v
        elif field == _DA_INT:
            value_ = _signed(v)
        elif field == _DA_DOUBLE:
            value_ = struct.unpack("<d", v.to_bytes(8, "little"))[0]
        elif field == _DA_STRING:
            value_ = _text(v)
    return {name: value_} if name else {}


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


# ---- writing ----


def _put_varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)


def _uint(out: bytearray, field: int, value: int) -> None:
    _put_varint(out, field << 3)
    _put_varint(out, value)


def _bytes(out: bytearray, field: int, value: bytes | bytearray) -> None:
    _put_varint(out, field << 3 | _BYTES)
    _put_varint(out, len(value))
    out += value


def _str(out: bytearray, field: int, value: str) -> None:
    _bytes(out, field, value.encode("utf-8", errors="surrogatepass"))


def _packet(out: bytearray, body: bytearray) -> None:
    _bytes(out, 1, body)


def write_perfetto(events: list[RawEvent], base_time_ns: int | None) -> bytes:
    """Chrome-style events (``read_raw``'s form) as a Perfetto protobuf trace.

    Ranges, instants, counters and names go to the same tracks ``read_perfetto``
    reads them from, with inline names and categories (no interning).  A range
    that overlaps a range open on its thread without nesting in it, as async
    ranges do, goes to a track of its own.

    Example:
        >>> data = write_perfetto([{"ph": "X", "name": "a", "ts": 1, "dur": 2,
        ...                         "pid": 1, "tid": 1}], None)
        >>> [(e["ph"], e["ts"]) for e in read_perfetto(data, "x")[0] if e["ph"] != "M"]
        [('B', 1), ('E', 3)]
    """
    from .model import Trace  # pairs B/E and b/e as load does

    trace = Trace.from_raw(events)
    out = bytearray()
    uuids: dict[Any, int] = {}
    timed: list[tuple[int, int, int, bytearray]] = []  # (ts ns, rank, order, TrackEvent)
    low = min((e.ts for e in trace), default=0)
    base = max(0, -low)

    def track(key: Any, describe: Any) -> int:
        if key not in uuids:
            uuids[key] = len(uuids) + 1
            td = bytearray()
            _uint(td, _TD_UUID, uuids[key])
            describe(td)
            body = bytearray()
            _uint(body, _PK_SEQUENCE_ID, 1)
            _bytes(body, _PK_TRACK_DESCRIPTOR, td)
            _packet(out, body)
        return uuids[key]

    def process(pid: Any) -> int:
        def describe(td: bytearray) -> None:
            desc = bytearray()
            _uint(desc, _DESC_PID, _int(pid))
            _str(desc, _PD_PROCESS_NAME, trace.process_names.get(pid, str(pid)))
            _bytes(td, _TD_PROCESS, desc)

        return track(("p", pid), describe)

    def thread(pid: Any, tid: Any) -> int:
        parent = process(pid)

        def describe(td: bytearray) -> None:
            _uint(td, _TD_PARENT_UUID, parent)
            desc = bytearray()
            _uint(desc, _DESC_PID, _int(pid))
            _uint(desc, _THD_TID, _int(tid))
            _str(desc, _THD_THREAD_NAME, trace.thread_names.get((pid, tid), f"thread {tid}"))
            _bytes(td, _TD_THREAD, desc)

        return track(("t", pid, tid), describe)

    def named(key: Any, pid: Any, name: str, counter: bool) -> int:
        parent = process(pid)

        def describe(td: bytearray) -> None:
            _uint(td, _TD_PARENT_UUID, parent)
            _str(td, _TD_NAME, name)
            if counter:
                _bytes(td, _TD_COUNTER, b"")

        return track(key, describe)

    def event(ts: int, rank: int, kind: int, uuid: int, e: Any, args: Any) -> None:
        """One TrackEvent; args: its annotations, or a counter's value."""
        te = bytearray()
        _uint(te, _TE_TYPE, kind)
        _uint(te, _TE_TRACK_UUID, uuid)
        if kind != _END:
            _str(te, _TE_NAME, e.name)
            if e.category:
                _str(te, _TE_CATEGORIES, e.category)
        if kind == _COUNTER:
            _uint(te, _TE_COUNTER_VALUE, args)
        else:
            for key, value in args.items():
                te += _annotation_bytes(key, value)
        timed.append((ts, rank, len(timed), te))

    def threaded(e: Any) -> bool:
        """Whether e belongs to a thread (tid 0 without a name: a track of no thread)."""
        return e.tid != 0 or (e.pid, e.tid) in trace.thread_names

    open_ranges: dict[Any, list[Any]] = {}
    for e in trace:  # per thread by ts, longer first: parents before children
        if e.dur is not None:
            stack = open_ranges.setdefault((e.pid, e.tid), [])
            while stack and e.ts >= stack[-1].end and (e.dur or stack[-1].dur):
                stack.pop()  # ended before e began: contains nothing from here on
            if not threaded(e):  # read from a Perfetto track of no thread: one of its own
                uuid = named(("a", len(uuids)), e.pid, e.name, False)
            elif not stack or e.end <= stack[-1].end:
                uuid = thread(e.pid, e.tid)
                stack.append(e)
            else:  # overlaps a range open on its thread without nesting: a track of its own
                uuid = named(("a", len(uuids)), e.pid, e.name, False)
            # At one ts: ends, then instants, then begins (longer first); of two
            # ends the shorter range's first; a zero-length range after all that.
            event(e.ts, 2, _BEGIN, uuid, e, e.args)
            timed[-1] = (e.ts, 2, -e.dur, timed[-1][3])
            event(e.end, 0, _END, uuid, e, {})
            timed[-1] = (e.end, 3 if e.dur == 0 else 0, e.dur, timed[-1][3])
        elif e.ph == "C":
            for key, value in e.args.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    uuid = named(("c", e.pid, key), e.pid, key, True)
                    event(e.ts, 1, _COUNTER, uuid, e, int(value))
        else:
            scope = e.args.get("scope")
            uuid = (
                _GLOBAL_TRACK
                if scope == "global"
                else process(e.pid)
                if scope == "process" or not threaded(e)
                else thread(e.pid, e.tid)
            )
            event(e.ts, 1, _INSTANT, uuid, e, e.args)
    body = bytearray()
    _uint(body, _PK_SEQUENCE_ID, 1)
    _uint(body, _PK_SEQUENCE_FLAGS, _SEQ_INCREMENTAL_STATE_CLEARED)
    snapshot = bytearray()
    for clock, value in ((_CLOCK_MONOTONIC, base), (_CLOCK_REALTIME, base_time_ns)):
        if value is not None:
            one = bytearray()
            _uint(one, 1, clock)
            _uint(one, 2, value)
            _bytes(snapshot, 1, one)
    # The trace's own clock is MONOTONIC, as in the core's files: without it
    # the viewer takes BOOTTIME, which nothing here converts to.
    _uint(snapshot, 2, _CLOCK_MONOTONIC)
    _bytes(body, _PK_CLOCK_SNAPSHOT, snapshot)
    head = bytearray()
    _packet(head, body)
    for ts, _, _, te in sorted(timed, key=lambda t: t[:3]):  # stable: file order on ties
        body = bytearray()
        _uint(body, _PK_SEQUENCE_ID, 1)
        _uint(body, _PK_TIMESTAMP, ts + base)
        _uint(body, _PK_CLOCK_ID, _CLOCK_MONOTONIC)
        _bytes(body, _PK_TRACK_EVENT, te)
        _packet(out, body)
    return bytes(head + out)


def _int(value: Any) -> int:
    return value if isinstance(value, int) else abs(hash(value)) % (1 << 31)


def _annotation_bytes(name: str, value: Any) -> bytearray:
    da = bytearray()
    _str(da, _DA_NAME, name)
    if isinstance(value, bool):
        _uint(da, _DA_BOOL, int(value))
    elif isinstance(value, int) and value >= 0:
        _uint(da, _DA_UINT, value)
    elif isinstance(value, int):
        _uint(da, _DA_INT, value)
    elif isinstance(value, float):
        import struct

        _put_varint(da, _DA_DOUBLE << 3 | _FIXED64)
        da += struct.pack("<d", value)
    else:
        _str(da, _DA_STRING, value if isinstance(value, str) else repr(value))
    out = bytearray()
    _bytes(out, _TE_DEBUG_ANNOTATIONS, da)
    return out
