"""Trace files written from Python (``merge``, ``repair``): the format follows the name.

The rule is the core's (``mxp_trace_format`` in native/src/mxp_format.c), in
Python so that writing or repairing a file needs no compiled core:
``.perfetto-trace`` and ``.pftrace`` are Perfetto protobuf (``write_perfetto``,
the way back from what ``perfetto.read_perfetto`` reads), ``.gz`` is
gzip-compressed Chrome JSON, any other name Chrome JSON.
"""

from __future__ import annotations

import gzip
import heapq
import io
import itertools
import json
import operator
import os
import pickle
import struct
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

from .._tracejson import dumps as trace_json
from ._protobuf import (
    BEGIN,
    CE_METADATA,
    CLOCK_MONOTONIC,
    CLOCK_REALTIME,
    CM_JSON,
    CM_NAME,
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
    FIXED64,
    GLOBAL_TRACK,
    ID_EVENT_CATEGORIES,
    ID_EVENT_NAMES,
    INSTANT,
    INTERNED_IID,
    INTERNED_NAME,
    PD_PROCESS_NAME,
    PK_CHROME_EVENTS,
    PK_CLOCK_SNAPSHOT,
    PK_DEFAULTS,
    PK_INTERNED_DATA,
    PK_SEQUENCE_FLAGS,
    PK_SEQUENCE_ID,
    PK_TRACK_DESCRIPTOR,
    PK_TRACK_EVENT,
    SEQ_INCREMENTAL_STATE_CLEARED,
    TD_COUNTER,
    TD_NAME,
    TD_PARENT_UUID,
    TD_PROCESS,
    TD_THREAD,
    TD_UUID,
    TE_CATEGORY_IIDS,
    TE_COUNTER_VALUE,
    TE_DEBUG_ANNOTATIONS,
    TE_NAME_IID,
    TE_TRACK_UUID,
    TE_TYPE,
    TED_TRACK_UUID,
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
    reads them from, in the compact encoding ``PerfettoWriter`` writes.

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
    part = PerfettoWriter(out, base_time_ns, max(0, -low)).part()
    for e in trace:
        part.put(e.pid, e.tid, e.ts, e.dur, e.name, e.category, e.ph, e.args)
    part.finish(trace.process_names, trace.thread_names)
    return out.getvalue()


# Events an input holds in memory before a sorted run of them goes to disk
# (about 250 bytes each), and how many a run is read back by in the merge.
RUN = 1 << 19
CHUNK = 1 << 12
SHARED_NAMES = 1 << 16  # names and categories shared as one str each, at most
FLUSH = 1 << 20  # bytes of packets gathered before a write
SEQUENCE_IDS = 100  # sequences take ids 2 to 101 in turn (one byte: the readers' fast path)
CLOCK_DELTA = 64  # a sequence's own clock, incremental (ids 64 to 127 are per sequence)
SEQ_NEEDS_INCREMENTAL_STATE = 2
# One event as sorted: (sequence, ts, rank, tie, file order, ph, name, category,
# dur, args). At one ts: range ends (rank 0, shorter first), points (1),
# range begins (2, longer first), then the ends of zero-length ranges (3).
_Record = tuple[int, int, int, int, int, str, str, str, Any, Any]


class PerfettoWriter:
    """A Perfetto protobuf trace written one part (``merge``: one input) at a time.

    The encoding is the core's compact one (native/src/mxp_perfetto.c): a
    packet sequence per thread, written whole, one after another; each
    starts afresh (its state cleared, its thread's track and an incremental
    clock as defaults) and its names and categories are interned; an event
    packet holds a time delta, the sequence id and its TrackEvent.  A
    sequence's events are in time order, so that begins and ends nest in
    file order on every track.  A part's events are sorted in runs of
    ``RUN`` kept in a temporary file and merged as they are written, so
    memory holds a run, not a part, whatever its size.

    Args:
        out: where the packets go.
        base_time_ns: the wall-clock time of ts 0 (None: unknown).
        base: added to every ts, so that none is negative (the trace's own
            clock is MONOTONIC, as in the core's files).
        folder: where the runs of a part too big for one are kept (default:
            the system's temporary folder).
        run: events sorted in memory at a time (default ``RUN``).
    """

    def __init__(
        self,
        out: IO[bytes],
        base_time_ns: int | None,
        base: int,
        *,
        folder: str | None = None,
        run: int | None = None,
    ) -> None:
        self.out = out
        self.base = base
        self.folder = folder
        self.run = RUN if run is None else max(1, run)
        self.next_uuid = 1
        self.sequences = 0
        body = bytearray()
        put_uint(body, PK_SEQUENCE_ID, 1)
        put_uint(body, PK_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED)
        snapshot = bytearray()
        for clock, value in ((CLOCK_MONOTONIC, base), (CLOCK_REALTIME, base_time_ns)):
            if value is not None:
                snapshot += _clock(clock, value, False)
        # Without a clock of its own the viewer takes BOOTTIME, which nothing
        # here converts to.
        put_uint(snapshot, 2, CLOCK_MONOTONIC)
        put_bytes(body, PK_CLOCK_SNAPSHOT, snapshot)
        head = bytearray()
        put_packet(head, body)
        out.write(head)

    def part(self) -> Part:
        """A new part: its events go in with ``put`` and out with ``finish``."""
        return Part(self)

    def uuid(self) -> int:
        self.next_uuid += 1
        return self.next_uuid - 1

    def metadata(self, doc: dict[str, Any]) -> None:
        """Chrome JSON metadata (``distributedInfo``, ``otherData`` ...) as a
        ChromeEventBundle's metadata, one JSON value a key, which
        ``perfetto.read_perfetto`` gives back as the trace's metadata."""
        bundle = bytearray()
        for key, value in doc.items():
            entry = bytearray()
            put_str(entry, CM_NAME, key)
            put_str(entry, CM_JSON, json.dumps(value, sort_keys=True))
            put_bytes(bundle, CE_METADATA, entry)
        body = bytearray()
        put_uint(body, PK_SEQUENCE_ID, 1)
        put_bytes(body, PK_CHROME_EVENTS, bundle)
        out = bytearray()
        put_packet(out, body)
        self.out.write(out)


class Part:
    """One part's events on their way into the file, sorted in bounded memory.

    ``put`` takes events in any order, times in ns on the trace's axis;
    ``finish`` writes the part's tracks, then each thread's sequence.
    """

    def __init__(self, writer: PerfettoWriter) -> None:
        self.writer = writer
        self.keys: dict[tuple[Any, Any], int] = {}  # (pid, tid) -> its sequence's index
        self.held: list[_Record] = []
        self.spill: IO[bytes] | None = None  # the sorted runs: (offset, chunks) each
        self.runs: list[tuple[int, int]] = []
        self.order = 0
        self.strings: dict[str, str] = {}

    def put(
        self, pid: Any, tid: Any, ts: int, dur: int | None, name: str, cat: str, ph: str, args: Any
    ) -> None:
        """One event (a range when dur is not None, else a point) of thread (pid, tid)."""
        key = (pid, tid)
        k = self.keys.get(key)
        if k is None:
            k = self.keys[key] = len(self.keys)
        n = self.order
        self.order = n + 1
        strings = self.strings
        if len(strings) < SHARED_NAMES:  # one str per name: smaller runs, in memory and on disk
            name = strings.setdefault(name, name)
            cat = strings.setdefault(cat, cat)
        held = self.held
        if dur is not None:
            held.append((k, ts, 2, -dur, n, ph, name, cat, dur, args or None))
        else:
            held.append((k, ts, 1, n, n, ph, name, cat, None, args or None))
        if len(held) >= self.writer.run:
            self._spill()

    def _spill(self) -> None:
        """The held events, sorted, as a run at the end of the temporary file."""
        self.held.sort()
        if self.spill is None:
            # Closed (and so removed) by finish.
            folder = self.writer.folder
            self.spill = tempfile.TemporaryFile(prefix="mxprof-merge-", dir=folder)  # noqa: SIM115
        start = self.spill.seek(0, 2)
        held = self.held
        chunks = 0
        for k in range(0, len(held), CHUNK):
            pickle.dump(held[k : k + CHUNK], self.spill, pickle.HIGHEST_PROTOCOL)
            chunks += 1
        self.runs.append((start, chunks))
        self.held = []

    def _run(self, start: int, chunks: int) -> Iterator[_Record]:
        spill = self.spill
        assert spill is not None
        at = start
        for _ in range(chunks):
            spill.seek(at)
            records = pickle.load(spill)
            at = spill.tell()
            yield from records

    def finish(self, process_names: dict[Any, str], thread_names: dict[Any, str]) -> int:
        """Write the part: its process and thread tracks, then its events, a
        sequence per thread; how many events it held.

        Args:
            process_names: names by pid (a process without one is named by
                its pid); every pid here gets a track.
            thread_names: names by (pid, tid); a thread with a name is one,
                also tid 0 (else tid 0 is no thread: events of a process).
        """
        count = self.order
        if self.runs:
            self._spill()
            records: Iterator[_Record] = heapq.merge(*(self._run(*r) for r in self.runs))
        else:
            self.held.sort()
            records = iter(self.held)
        encoder = _Encoder(self.writer, process_names, thread_names)
        for key in self.keys:
            encoder.process(key[0])
        for pid in process_names:
            encoder.process(pid)
        for key in thread_names:
            encoder.thread(*key)
        keys = list(self.keys)
        for k, group in itertools.groupby(records, key=operator.itemgetter(0)):
            encoder.sequence(keys[k], group)
        encoder.flush()
        self.held = []
        if self.spill is not None:
            self.spill.close()
            self.spill = None
        return count


class _Encoder:
    """One part's packets: its tracks and its sequences (see PerfettoWriter)."""

    def __init__(
        self, writer: PerfettoWriter, process_names: dict[Any, str], thread_names: dict[Any, str]
    ) -> None:
        self.writer = writer
        self.process_names = process_names
        self.thread_names = thread_names
        self.uuids: dict[Any, int] = {}
        self.chunk = bytearray()

    def flush(self) -> None:
        self.writer.out.write(self.chunk)
        self.chunk = bytearray()

    def track(self, key: Any, describe: Callable[[bytearray], None], seq: int = 1) -> int:
        uuid = self.uuids.get(key)
        if uuid is None:
            uuid = self.writer.uuid()
            if key is not None:
                self.uuids[key] = uuid
            td = bytearray()
            put_uint(td, TD_UUID, uuid)
            describe(td)
            body = bytearray()
            put_uint(body, PK_SEQUENCE_ID, seq)
            put_bytes(body, PK_TRACK_DESCRIPTOR, td)
            put_packet(self.chunk, body)
        return uuid

    def process(self, pid: Any) -> int:
        def describe(td: bytearray) -> None:
            desc = bytearray()
            put_uint(desc, DESC_PID, _int(pid))
            put_str(desc, PD_PROCESS_NAME, self.process_names.get(pid, str(pid)))
            put_bytes(td, TD_PROCESS, desc)

        return self.track(("p", pid), describe)

    def thread(self, pid: Any, tid: Any) -> int:
        parent = self.process(pid)

        def describe(td: bytearray) -> None:
            put_uint(td, TD_PARENT_UUID, parent)
            desc = bytearray()
            put_uint(desc, DESC_PID, _int(pid))
            put_uint(desc, THD_TID, _int(tid))
            put_str(desc, THD_THREAD_NAME, self.thread_names.get((pid, tid), f"thread {tid}"))
            put_bytes(td, TD_THREAD, desc)

        return self.track(("t", pid, tid), describe)

    def named(self, key: Any, pid: Any, name: str, counter: bool, seq: int) -> int:
        """A named track of pid's (key None: a new one each time)."""
        parent = self.process(pid)

        def describe(td: bytearray) -> None:
            put_uint(td, TD_PARENT_UUID, parent)
            put_str(td, TD_NAME, name)
            if counter:
                put_bytes(td, TD_COUNTER, b"")

        return self.track(key, describe, seq)

    def sequence(self, key: tuple[Any, Any], records: Iterator[_Record]) -> None:
        """One thread's events, sorted, as a packet sequence of their own."""
        pid, tid = key
        writer = self.writer
        base = writer.base
        seq = 2 + writer.sequences % SEQUENCE_IDS
        writer.sequences += 1
        threaded = tid != 0 or key in self.thread_names
        default = self.thread(pid, tid) if threaded else None
        chunk = self.chunk
        body = bytearray()
        put_uint(body, PK_SEQUENCE_ID, seq)
        put_uint(body, PK_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED)
        defaults = bytearray()
        put_uint(defaults, DEF_TIMESTAMP_CLOCK_ID, CLOCK_DELTA)
        if default is not None:
            on = bytearray()
            put_uint(on, TED_TRACK_UUID, default)
            put_bytes(defaults, DEF_TRACK_EVENT, on)
        put_bytes(body, PK_DEFAULTS, defaults)
        put_packet(chunk, body)
        body = bytearray()
        put_uint(body, PK_SEQUENCE_ID, seq)
        put_bytes(
            body,
            PK_CLOCK_SNAPSHOT,
            _clock(CLOCK_DELTA, base, True) + _clock(CLOCK_MONOTONIC, base, False),
        )
        put_packet(chunk, body)
        seq_field = bytearray()
        put_uint(seq_field, PK_SEQUENCE_ID, seq)
        seq_bytes = bytes(seq_field)
        names: dict[str, int] = {}
        cats: dict[str, int] = {}
        tails: dict[Any, bytes] = {}  # a packet after its timestamp, by what it says
        last = base

        def event(ts: int, kind: int, track: int | None, name: str, cat: str, value: Any) -> None:
            """One TrackEvent packet at ts; value: a counter's, or an event's args."""
            nonlocal last, chunk
            key = (kind, track, name, cat) if kind != COUNTER and not value else None
            tail = tails.get(key) if key is not None else None
            if tail is None:
                named = kind != END and kind != COUNTER
                te = bytearray((TE_TYPE << 3, kind))
                if track is not None:
                    put_uint(te, TE_TRACK_UUID, track)
                if kind == COUNTER:
                    put_uint(te, TE_COUNTER_VALUE, value)
                interned = bytearray()
                if named:
                    iid = names.get(name)
                    if iid is None:
                        iid = names[name] = len(names) + 1
                        interned += _interned(ID_EVENT_NAMES, iid, name)
                    cid = cats.get(cat)
                    if cid is None:
                        cid = cats[cat] = len(cats) + 1
                        interned += _interned(ID_EVENT_CATEGORIES, cid, cat)
                    put_uint(te, TE_NAME_IID, iid)
                    put_uint(te, TE_CATEGORY_IIDS, cid)
                    if value:
                        for k, v in value.items():
                            te += _annotationput_bytes(k, v)
                packet = bytearray(seq_bytes)
                if named:
                    put_uint(packet, PK_SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE)
                if interned:
                    put_bytes(packet, PK_INTERNED_DATA, interned)
                put_bytes(packet, PK_TRACK_EVENT, te)
                tail = bytes(packet)
                if key is not None and not interned and (track is None or kind == INSTANT):
                    tails[key] = tail  # not an own track's: one a range, no end to them
            at = base + ts
            delta = at - last
            last = at
            if delta < 0x80:
                stamp = bytes((0x40, delta))
            else:
                packed = bytearray(b"\x40")
                put_varint(packed, delta)
                stamp = bytes(packed)
            size = len(stamp) + len(tail)
            chunk.append(0x0A)
            if size < 0x80:
                chunk.append(size)
            else:
                put_varint(chunk, size)
            chunk += stamp
            chunk += tail
            if len(chunk) > FLUSH:
                self.flush()
                chunk = self.chunk

        ends: list[tuple[int, int, int, int, int | None]] = []  # (end, rank, tie, order, track)
        stack: list[tuple[int, int, int]] = []  # ranges open on the thread's track
        for _, ts, rank, tie, n, ph, name, cat, dur, args in records:
            while ends and ends[0][:4] < (ts, rank, tie, n):
                end = heapq.heappop(ends)
                event(end[0], END, end[4], "", "", None)
            if dur is not None:
                end_ts = ts + dur
                while stack and ts >= stack[-1][1] and (dur or stack[-1][2]):
                    stack.pop()  # ended before this began: contains nothing from here on
                if threaded and (not stack or end_ts <= stack[-1][1]):
                    track = None
                    stack.append((ts, end_ts, dur))
                else:  # overlaps a range open on its thread without nesting, or no
                    # thread (an async range): a track of its own
                    track = self.named(None, pid, name, False, seq)
                    chunk = self.chunk
                event(ts, BEGIN, track, name, cat, args)
                heapq.heappush(ends, (end_ts, 0 if dur else 3, dur, n, track))
            elif ph == "C":
                for counter, value in (args or {}).items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        uuid = self.named(("c", pid, counter), pid, counter, True, seq)
                        chunk = self.chunk
                        event(ts, COUNTER, uuid, counter, "", int(value))
            else:
                scope = args.get("scope") if args else None
                where = (
                    GLOBAL_TRACK
                    if scope == "global"
                    else self.process(pid)
                    if scope == "process" or not threaded
                    else None
                )
                chunk = self.chunk
                event(ts, INSTANT, where, name, cat, args)
        while ends:
            end = heapq.heappop(ends)
            event(end[0], END, end[4], "", "", None)


def _clock(clock: int, value: int, incremental: bool) -> bytearray:
    """A ClockSnapshot's Clock entry (field 1)."""
    one = bytearray()
    put_uint(one, 1, clock)
    put_uint(one, 2, value)
    if incremental:
        put_uint(one, 3, 1)
    out = bytearray()
    put_bytes(out, 1, one)
    return out


def _interned(table: int, iid: int, name: str) -> bytearray:
    """An InternedData entry (an event name or category)."""
    entry = bytearray()
    put_uint(entry, INTERNED_IID, iid)
    put_str(entry, INTERNED_NAME, name)
    out = bytearray()
    put_bytes(out, table, entry)
    return out


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
