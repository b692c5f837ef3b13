"""Trace files written from Python (``merge``, ``repair``): the format follows the name.

The rule is the core's (``mxp_trace_format`` in native/src/mxp_format.c), in
Python so that writing or repairing a file needs no compiled core:
``.perfetto-trace`` and ``.pftrace`` are Perfetto protobuf (``write_perfetto``,
the way back from what ``perfetto.read_perfetto`` reads), ``.gz`` is
gzip-compressed Chrome JSON, any other name Chrome JSON.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
from typing import IO, Any

from .._tracejson import dumps as trace_json
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
    FIXED64,
    GLOBAL_TRACK,
    INSTANT,
    PD_PROCESS_NAME,
    PK_CLOCK_ID,
    PK_CLOCK_SNAPSHOT,
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
    TE_COUNTER_VALUE,
    TE_DEBUG_ANNOTATIONS,
    TE_NAME,
    TE_TRACK_UUID,
    TE_TYPE,
    THD_THREAD_NAME,
    THD_TID,
    put_bytes,
    put_packet,
    put_str,
    put_uint,
    put_varint,
)
from .model import Trace
from .reader import RawEvent

JSON = "json"
JSON_GZ = "json.gz"
PERFETTO = "perfetto"

PERFETTO_SUFFIXES = (".perfetto-trace", ".pftrace")


def file_format(path: str | os.PathLike[str]) -> str:
    """The format a trace file named path is in: ``PERFETTO``, ``JSON_GZ`` or ``JSON``.

    Example:
        >>> file_format("run.pftrace"), file_format("run.json.gz"), file_format("run.trace")
        ('perfetto', 'json.gz', 'json')
    """
    name = os.fspath(path)
    if name.endswith(PERFETTO_SUFFIXES):
        return PERFETTO
    if name.endswith(".gz"):
        return JSON_GZ
    return JSON


def encode(doc: dict[str, Any], fmt: str) -> bytes:
    """doc (Chrome JSON's object form) as the bytes of a file in format fmt.

    Perfetto keeps the events and ``baseTimeNanoseconds`` (the format has no
    place for the rest of the metadata).

    Example:
        >>> encode({"traceEvents": []}, file_format("empty.json"))
        b'{"traceEvents": []}'
    """
    if fmt == PERFETTO:
        return write_perfetto(doc["traceEvents"], doc.get("baseTimeNanoseconds"))
    payload = trace_json(doc).encode("utf-8")
    return gzip.compress(payload, 6) if fmt == JSON_GZ else payload


def write_perfetto(events: list[RawEvent], base_time_ns: int | None) -> bytes:
    """Chrome-style events (``read_raw``'s form) as a Perfetto protobuf trace.

    Ranges, instants, counters and names go to the same tracks ``read_perfetto``
    reads them from, with inline names and categories (no interning).  A range
    that overlaps a range open on its thread without nesting in it, as async
    ranges do, goes to a track of its own.

    Example:
        >>> from mxprof.trace.perfetto import read_perfetto
        >>> data = write_perfetto([{"ph": "X", "name": "a", "ts": 1, "dur": 2,
        ...                         "pid": 1, "tid": 1}], None)
        >>> [(e["ph"], e["ts"]) for e in read_perfetto(data, "x")[0] if e["ph"] != "M"]
        [('B', 1), ('E', 3)]
    """
    trace = Trace.from_raw(events)  # pairs B/E and b/e as load does
    low = min((e.ts for e in trace), default=0)
    out = io.BytesIO()
    writer = PerfettoWriter(out, base_time_ns, max(0, -low))
    writer.add(trace)
    return out.getvalue()


class PerfettoWriter:
    """A Perfetto protobuf trace written one Trace after another (``merge``).

    Each Trace's events are sorted by time within it; the traces follow one
    another, each with its own tracks (their pids must differ).

    Args:
        out: where the packets go.
        base_time_ns: the wall-clock time of ts 0 (None: unknown).
        base: added to every ts, so that none is negative (the trace's own
            clock is MONOTONIC, as in the core's files).
    """

    def __init__(self, out: IO[bytes], base_time_ns: int | None, base: int) -> None:
        self.out = out
        self.base = base
        self.uuids: dict[Any, int] = {}
        body = bytearray()
        put_uint(body, PK_SEQUENCE_ID, 1)
        put_uint(body, PK_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED)
        snapshot = bytearray()
        for clock, value in ((CLOCK_MONOTONIC, base), (CLOCK_REALTIME, base_time_ns)):
            if value is not None:
                one = bytearray()
                put_uint(one, 1, clock)
                put_uint(one, 2, value)
                put_bytes(snapshot, 1, one)
        # Without a clock of its own the viewer takes BOOTTIME, which nothing
        # here converts to.
        put_uint(snapshot, 2, CLOCK_MONOTONIC)
        put_bytes(body, PK_CLOCK_SNAPSHOT, snapshot)
        head = bytearray()
        put_packet(head, body)
        out.write(head)

    def add(self, trace: Trace) -> None:
        """Every event of trace, on the tracks of its processes and threads."""
        out = bytearray()
        uuids = self.uuids
        # (ts ns, rank at one ts, order, file order, the packet after its timestamp)
        timed: list[tuple[int, int, int, int, bytes]] = []
        base = self.base

        def track(key: Any, describe: Any) -> int:
            if key not in uuids:
                uuids[key] = len(uuids) + 1
                td = bytearray()
                put_uint(td, TD_UUID, uuids[key])
                describe(td)
                body = bytearray()
                put_uint(body, PK_SEQUENCE_ID, 1)
                put_bytes(body, PK_TRACK_DESCRIPTOR, td)
                put_packet(out, body)
            return uuids[key]

        def process(pid: Any) -> int:
            def describe(td: bytearray) -> None:
                desc = bytearray()
                put_uint(desc, DESC_PID, _int(pid))
                put_str(desc, PD_PROCESS_NAME, trace.process_names.get(pid, str(pid)))
                put_bytes(td, TD_PROCESS, desc)

            return track(("p", pid), describe)

        def thread(pid: Any, tid: Any) -> int:
            parent = process(pid)

            def describe(td: bytearray) -> None:
                put_uint(td, TD_PARENT_UUID, parent)
                desc = bytearray()
                put_uint(desc, DESC_PID, _int(pid))
                put_uint(desc, THD_TID, _int(tid))
                put_str(desc, THD_THREAD_NAME, trace.thread_names.get((pid, tid), f"thread {tid}"))
                put_bytes(td, TD_THREAD, desc)

            return track(("t", pid, tid), describe)

        def named(key: Any, pid: Any, name: str, counter: bool) -> int:
            parent = process(pid)

            def describe(td: bytearray) -> None:
                put_uint(td, TD_PARENT_UUID, parent)
                put_str(td, TD_NAME, name)
                if counter:
                    put_bytes(td, TD_COUNTER, b"")

            return track(key, describe)

        tails: dict[Any, bytes] = {}  # a TrackEvent's packet after its timestamp, by content

        def event(kind: int, uuid: int, e: Any, args: Any) -> bytes:
            """One TrackEvent, as the end of its packet; args: its annotations, or a
            counter's value. Packets that differ only in their time share one."""
            key = (
                (kind, uuid)
                if kind == END
                else (kind, uuid, e.name, e.category)
                if kind != COUNTER and not args
                else None
            )
            tail = tails.get(key) if key is not None else None
            if tail is not None:
                return tail
            te = bytearray()
            put_uint(te, TE_TYPE, kind)
            put_uint(te, TE_TRACK_UUID, uuid)
            if kind != END:
                put_str(te, TE_NAME, e.name)
                if e.category:
                    put_str(te, TE_CATEGORIES, e.category)
            if kind == COUNTER:
                put_uint(te, TE_COUNTER_VALUE, args)
            elif args:
                for name, value in args.items():
                    te += _annotationput_bytes(name, value)
            packed = bytearray()
            put_uint(packed, PK_CLOCK_ID, CLOCK_MONOTONIC)
            put_bytes(packed, PK_TRACK_EVENT, te)
            tail = bytes(packed)
            if key is not None:
                tails[key] = tail
            return tail

        def threaded(e: Any) -> bool:
            """Whether e belongs to a thread (tid 0 without a name: a track of no thread)."""
            return e.tid != 0 or (e.pid, e.tid) in trace.thread_names

        open_ranges: dict[Any, list[Any]] = {}
        stack: list[Any] = []
        last: Any = None  # the (pid, tid) of the last range, its uuid and whether threaded
        on_thread = True
        thread_uuid = 0
        for e in trace:  # per thread by ts, longer first: parents before children
            dur = e.dur
            if dur is not None:
                if last is None or e.tid != last[1] or e.pid != last[0]:
                    last = (e.pid, e.tid)
                    stack = open_ranges.setdefault(last, [])
                    on_thread = threaded(e)
                    thread_uuid = thread(e.pid, e.tid) if on_thread else 0
                ts = e.ts
                end = ts + dur
                while stack and ts >= stack[-1][1] and (dur or stack[-1][2]):
                    stack.pop()  # ended before e began: contains nothing from here on
                if not on_thread:  # read from a Perfetto track of no thread: one of its own
                    uuid = named(("a", len(uuids)), e.pid, e.name, False)
                elif not stack or end <= stack[-1][1]:
                    uuid = thread_uuid
                    stack.append((ts, end, dur))
                else:  # overlaps a range open on its thread without nesting: a track of its own
                    uuid = named(("a", len(uuids)), e.pid, e.name, False)
                # At one ts: ends, then instants, then begins (longer first); of two
                # ends the shorter range's first; a zero-length range after all that.
                n = len(timed)
                timed.append((ts, 2, -dur, n, event(BEGIN, uuid, e, e.args)))
                timed.append((end, 3 if dur == 0 else 0, dur, n + 1, event(END, uuid, e, None)))
            elif e.ph == "C":
                for key, value in e.args.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        uuid = named(("c", e.pid, key), e.pid, key, True)
                        n = len(timed)
                        timed.append((e.ts, 1, n, n, event(COUNTER, uuid, e, int(value))))
            else:
                scope = e.args.get("scope")
                uuid = (
                    GLOBAL_TRACK
                    if scope == "global"
                    else process(e.pid)
                    if scope == "process" or not threaded(e)
                    else thread(e.pid, e.tid)
                )
                n = len(timed)
                timed.append((e.ts, 1, n, n, event(INSTANT, uuid, e, e.args)))
        self.out.write(out)
        timed.sort()  # (ts, rank, order, file order): the last makes each key unique
        head = bytearray()
        put_uint(head, PK_SEQUENCE_ID, 1)
        put_varint(head, PK_TIMESTAMP << 3)
        prefix = bytes(head)
        packet_tag = bytes([1 << 3 | BYTES])  # TracePacket, field 1 of Trace
        high: dict[int, bytes] = {}  # varint bytes of ts >> 21, the part that seldom changes
        chunk = bytearray()
        for ts, _, _, _, tail in timed:
            value = ts + base
            if value >= 1 << 21:
                top = value >> 21
                rest = high.get(top)
                if rest is None:
                    packed = bytearray()
                    put_varint(packed, top)
                    rest = high[top] = bytes(packed)
                stamp = (
                    prefix
                    + bytes((value & 127 | 128, value >> 7 & 127 | 128, value >> 14 & 127 | 128))
                    + rest
                )
            else:
                packed = bytearray(prefix)
                put_varint(packed, value)
                stamp = bytes(packed)
            size = len(stamp) + len(tail)
            chunk += packet_tag
            if size < 128:
                chunk.append(size)
            else:
                put_varint(chunk, size)
            chunk += stamp
            chunk += tail
            if len(chunk) > 1 << 20:
                self.out.write(chunk)
                chunk = bytearray()
        self.out.write(chunk)


def _int(value: Any) -> int:
    return value if isinstance(value, int) else abs(hash(value)) % (1 << 31)


def _annotationput_bytes(name: str, value: Any) -> bytearray:
    da = bytearray()
    put_str(da, DA_NAME, name)
    if isinstance(value, bool):
        put_uint(da, DA_BOOL, int(value))
    elif isinstance(value, int) and value >= 0:
        put_uint(da, DA_UINT, value)
    elif isinstance(value, int):
        put_uint(da, DA_INT, value)
    elif isinstance(value, float):
        put_varint(da, DA_DOUBLE << 3 | FIXED64)
        da += struct.pack("<d", value)
    else:
        put_str(da, DA_STRING, value if isinstance(value, str) else repr(value))
    out = bytearray()
    put_bytes(out, TE_DEBUG_ANNOTATIONS, da)
    return out
