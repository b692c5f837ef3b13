"""The compiled fast path of ``model.read_lines``: a block of events parsed in C.

``mxprof.trace._fastjson`` (native/offline/, built by cffi like the core but
a module of its own: the offline tier never imports the live core) parses
the events of a block that are in the exact shape mxprof's core writes into
rows: times in integer ns, names interned once per distinct (name,
category, phase), threads by (pid, tid).  Every other event is left in its
"run" of text, which is decoded here as the pure path decodes a block
(msgspec, or ``_scan.raw_events`` where the pure path reads dicts) and
handed to ``Converter.add_block`` / ``Converter.add`` at its place, so
each thread's events, the keys' order and the pairing are what the pure
path makes.  A ``Thread`` sink takes a run of rows as columns at once (its
order restored in C); a sink every thread shares with ``take_rows``
(parquet.py's) takes them as a ``RowBlock`` of machine arrays, in file
order; other sinks get the rows one at a time, in file order.

The block is taken only once all its runs decoded; otherwise ``take``
returns False before anything was added and the caller reads the block the
pure way, which alone judges damage.  Without the module (no compiler at
install), or with ``MXPROF_PURE_READER=1``, ``reader()`` is None and the pure
path runs: the results are identical either way (tests/test_fastjson.py).
"""

from __future__ import annotations

import os
from array import array
from typing import Any

import msgspec

from . import _scan
from ._columns import Thread
from ._convert import Converter
from ._event import DECODE_EVENTS, NO_ARGS, Event

try:
    from ._fastjson import ffi, lib
except ImportError:  # built without a compiler: the pure path alone
    ffi = lib = None

ENV = "MXPROF_PURE_READER"
# args as an Event's are decoded (msgspec): the rows' flat objects, several at once.
_DECODE_ARGS = msgspec.json.Decoder(list[dict[str, Any]]).decode
_WS = b" \t\r\n"  # JSON's whitespace: a run's comma is found past it


def available() -> bool:
    """Whether the compiled path is built and not turned off by MXPROF_PURE_READER."""
    return lib is not None and os.environ.get(ENV, "") in ("", "0")


def reader(converted: Converter) -> Reader | None:
    """A fast reader for one ``read_lines`` call, or None: read the pure way."""
    return Reader(converted) if available() else None


def order(thread_ts: Any, thread_dur: Any, thread_kind: Any, start: int) -> bool:
    """Put a thread's events from ``start`` on in place (``Thread.extend``'s
    ``order``); False when it could not (out of memory: sort at the end)."""
    n = len(thread_ts)
    if n == start:
        return True
    ts = ffi.from_buffer("int64_t[]", thread_ts, require_writable=True)
    dur = ffi.from_buffer("int64_t[]", thread_dur, require_writable=True)
    kind = ffi.from_buffer("int32_t[]", thread_kind, require_writable=True)
    try:
        return bool(lib.mxo_order(ts, dur, kind, n, start) == 0)
    finally:
        ffi.release(ts)
        ffi.release(dur)
        ffi.release(kind)


class Depths:
    """The depth pass of the Parquet form in C (native/offline/mxo_depth.h):
    ranges met latest-ended first per thread, its state kept across calls."""

    def __init__(self) -> None:
        self._d = ffi.gc(lib.mxo_depths_new(), lib.mxo_depths_free)
        if self._d == ffi.NULL:
            raise MemoryError

    def run(self, thread: Any, ts: Any, dur: Any, out: Any) -> bool:
        """Depths of the ranges (int64 buffers of thread ids, starts, lengths)
        into out (an int32 buffer as long); False when a thread's ranges did
        not come latest-ended first (then this pass is spent).

        Raises:
            ValueError: the buffers differ in length, or a thread id is negative.
            MemoryError: out of memory.
        """
        n = len(out)
        if not len(thread) == len(ts) == len(dur) == n:
            raise ValueError("mxprof: depth columns of different lengths")
        args = [
            ffi.from_buffer("int64_t[]", thread),
            ffi.from_buffer("int64_t[]", ts),
            ffi.from_buffer("int64_t[]", dur),
            ffi.from_buffer("int32_t[]", out, require_writable=True),
        ]
        try:
            rc = lib.mxo_depths_run(self._d, *args[:3], n, args[3])
        finally:
            for a in args:
                ffi.release(a)
        if rc == lib.MXO_ERR_MEMORY:
            raise MemoryError("mxprof: out of memory computing depths")
        if rc == lib.MXO_ERR_ARG:
            raise ValueError("mxprof: a negative thread id in the depth pass")
        return bool(rc == 0)


class Reader:
    """The C parser's state for one file: its keys' and threads' ids."""

    def __init__(self, converted: Converter) -> None:
        self.converted = converted
        self.ffi, self.lib = ffi, lib  # (for perfetto.py's compiled path)
        self._r = ffi.gc(lib.mxo_new(), lib.mxo_free)
        if self._r == ffi.NULL:
            raise MemoryError
        self._keys: Any = None  # the trace's Keys, from the first Thread sink
        self._key_text: list[tuple[str, str, str]] = []  # per C key id
        self._globals = 0  # the C keys whose trace index is set
        self._sinks: list[Any] = []  # per C thread id
        self._ids: list[tuple[int, int]] = []
        self._mode: str | None = None  # the sinks' kind: _COLUMNS, _SUMMARY or _EVENTS
        self._pairs: list[tuple[str, str]] = []  # _SUMMARY: (name, category) per id
        self._pair_ids: dict[tuple[str, str], int] = {}
        self._text = b""  # the block being read
        # The args of rows another parser made (MXO_HELD_ARGS), by index; None: JSON's.
        self.held: list[dict[str, Any]] | None = None

    def take(self, text: bytes) -> bool:
        """Add a block's events (``_scan.blocks``' form) to the conversion;
        False, with nothing added, where the block is to be read the pure way.

        Where the pure path reads the block as dicts (``_scan.ASYNC`` matches
        it), the runs are read so too (the rows come out the same either way).
        """
        r = self._r
        if lib.mxo_parse(r, ffi.from_buffer(text), len(text)) == 0 and self._decoded(text):
            return True
        # Declined: the keys its rows made go (the pure reading makes its own).
        if lib.mxo_forget(r, self._globals) != 0:
            raise MemoryError("mxprof: out of memory reading a trace")
        return False

    @property
    def state(self) -> Any:
        """The C reader (``mxo_reader *``), for another parser that fills its
        rows (``perfetto.py``'s compiled path, native/offline/mxo_pftrace.c)."""
        return self._r

    def flush_rows(self) -> None:
        """The rows another parser put in the C reader (in file order, their
        args in ``held``) to their threads' sinks, as a block's rows go; then
        none are left."""
        n = self._r.n
        if n:
            self._rows(0, n)
            self._r.n = 0
            if self.held:
                self.held.clear()

    def _decoded(self, text: bytes) -> bool:
        """take, the block parsed: its runs decoded, then everything added."""
        r = self._r
        self._text = text
        runs = [self._run(text, i) for i in range(r.n_runs)]
        # _scan.ASYNC of the whole block, searched only where it can match.
        raw = bool(r.async_args) or any(_scan.ASYNC.search(run) for run in runs)
        decoded: list[Any] = []
        if not raw:
            try:
                decoded = [DECODE_EVENTS(run) for run in runs]
            except msgspec.ValidationError:
                raw = True  # the pure path reads this block as dicts
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
                return False
        if raw:
            try:
                decoded = [_scan.raw_events(run) for run in runs]
            except _scan.NotLines:
                return False
        if any(not events for events in decoded):  # "[]": a comma with nothing before it
            return False
        at = 0
        converted = self.converted
        for i, events in enumerate(decoded):
            self._rows(at, r.run_at[i])
            at = r.run_at[i]
            if raw:
                for event in events:
                    converted.add(event)
            else:
                converted.add_block(events)
        self._rows(at, r.n)
        return True

    def _run(self, text: bytes, i: int) -> bytes:
        """Run i of the last block as a JSON array (its separating comma dropped)."""
        r = self._r
        piece = text[r.run_begin[i] : r.run_end[i]]
        if r.run_end[i] < len(text) - 1:  # a row follows: the run ends with its comma
            piece = piece.rstrip(_WS)
            if not piece.endswith(b","):
                return b"["  # not JSON: the block is read the pure way
            piece = piece[:-1]
        return b"[" + piece + b"]"

    def _rows(self, begin: int, end: int) -> None:
        """The rows [begin, end) of the last block to their threads' sinks."""
        if begin == end:
            return
        r = self._r
        for t in range(len(self._sinks), r.n_threads):
            self._sinks.append(None)
            self._ids.append((r.thread_pid[t], r.thread_tid[t]))
        if self._mode is None:  # the first sink (mxo_group's first group's) tells the mode
            t = r.thread[begin]
            self._sinks[t] = self.converted.sink(self._ids[t])
            self._mode = _mode(self._sinks[t])
            if self._mode is _COLUMNS:
                self._keys = self._sinks[t].keys
        if self._mode is _ROWS and self.held is None:  # (a .pftrace's go one by one)
            self._block(begin, end)
            return
        if lib.mxo_group(r, self._text, len(self._text), begin, end) != 0:
            raise MemoryError("mxprof: out of memory reading a trace")
        sinks = self._sinks
        for g in range(r.n_groups):  # in the order of their first rows, as the pure path
            t = r.g_thread[g]
            if sinks[t] is None:
                sinks[t] = self.converted.sink(self._ids[t])
        self._name_keys()
        self._keys_for(end)
        if lib.mxo_globalize(r) != 0:
            raise MemoryError("mxprof: a key without its index (a bug in mxprof)")
        if self._mode is _COLUMNS:
            whole = self._columns()
        elif self._mode is _SUMMARY:
            whole = self._summary()
        else:
            whole = False
        if not whole:
            self._one_by_one(begin, end)

    def _block(self, begin: int, end: int) -> None:
        """The rows [begin, end) to the one sink every thread shares, as columns."""
        r = self._r
        sinks = self._sinks
        shared = next(s for s in sinks if s is not None)
        for t, sink in enumerate(sinks):
            if sink is None:  # threads in the order the parser first met them
                sink = sinks[t] = self.converted.sink(self._ids[t])
            if sink is not shared:
                raise TypeError("mxprof: a sink with take_rows must be every thread's")
        self._name_keys()
        self._keys_for(end)
        n = end - begin
        shared.take_rows(
            RowBlock(
                ffi.buffer(r.ts + begin, n * 8)[:],
                ffi.buffer(r.dur + begin, n * 8)[:],
                ffi.buffer(r.key + begin, n * 4)[:],
                ffi.buffer(r.thread + begin, n * 4)[:],
                ffi.buffer(r.args + begin, n * ffi.sizeof("size_t"))[:],
                ffi.buffer(r.args_len + begin, n * ffi.sizeof("size_t"))[:],
                self._text,
                self._key_text,
                self._ids,
            )
        )

    def _columns(self) -> bool:
        """mxo_group's groups to their Threads as columns; False if a sink is not one."""
        r = self._r
        whole = True
        keys = self._keys
        for g in range(r.n_groups):
            sink = self._sinks[r.g_thread[g]]
            if _mode(sink) is not _COLUMNS or sink.keys is not keys:
                whole = False
                continue
            first, count = r.g_begin[g], r.g_count[g]
            kinds: Any = ffi.buffer(r.g_kind + first, count * 4)
            with_args = r.g_with_args[g]
            if with_args:  # the args' dicts to extras, as Thread.put keeps them
                kinds = _array("i", kinds)
                extras = sink.extras
                at = ffi.unpack(r.g_apos + r.g_abegin[g], with_args)
                names = self._keys.names
                for j, args in zip(at, self._args(g, with_args)):
                    if type(args) is int:  # a counter's value
                        args = {names[kinds[j]]: args}
                    extras.append((kinds[j], args))
                    kinds[j] = -len(extras)
                kinds = kinds.tobytes()
            sink.extend(
                ffi.buffer(r.g_ts + first, count * 8),
                ffi.buffer(r.g_dur + first, count * 8),
                kinds,
                order,
            )
        return whole

    def _args(self, g: int, n: int) -> list[Any]:
        """The args of group g's n rows that have some, in order: a dict, or a
        counter's value (an int: its args are {its name: value})."""
        r = self._r
        held = self.held
        if held is None:  # a JSON block's: the rows' text
            return _DECODE_ARGS(ffi.buffer(r.g_atext + r.g_atext_begin[g], r.g_atext_len[g]))
        first = r.g_abegin[g]
        return [
            held[a] if form == _HELD else _signed(a)
            for a, form in zip(ffi.unpack(r.g_aheld + first, n), ffi.unpack(r.g_alen + first, n))
        ]

    def _summary(self) -> bool:
        """mxo_group's groups through their summary sinks' rule (``model._Running``),
        in C; False if a sink is not one."""
        r = self._r
        whole = True
        summary: Any = None
        keep = ffi.new("size_t *")
        last_end = ffi.new("int64_t *")
        texts = self._key_text
        for g in range(r.n_groups):
            sink = self._sinks[r.g_thread[g]]
            if _mode(sink) is not _SUMMARY:
                whole = False
                continue
            summary = sink.summary
            last_end[0] = sink.last_end
            starts = ffi.from_buffer("int64_t[]", sink.starts)
            lengths = ffi.from_buffer("int64_t[]", sink.lengths)
            try:
                rc = lib.mxo_running(
                    r, g, starts, lengths, len(sink.starts), keep, last_end, summary.broken
                )
            finally:
                ffi.release(starts)
                ffi.release(lengths)
            if rc < 0:
                raise MemoryError("mxprof: out of memory reading a trace")
            sink.take_ranges(
                keep[0],
                ffi.buffer(r.s_starts, r.s_n * 8),
                ffi.buffer(r.s_lengths, r.s_n * 8),
                last_end[0],
            )
            summary.count += r.g_count[g]
            if rc == 1:
                summary.broken = True
            for i in range(r.s_n_points):
                summary.points.add(texts[r.s_points[i]][1])
            r.s_n_points = 0
        if lib.mxo_collect(r) != 0:
            raise MemoryError("mxprof: out of memory reading a trace")
        if summary is not None:
            pairs = self._pairs
            for c in range(r.n_c):
                first, count = r.c_begin[c], r.c_count[c]
                own = r.c_own[c]
                if r.c_own_overflow[c]:  # past int64: Python's ints hold the sum
                    own = sum(_array("q", ffi.buffer(r.c_own_each + first, count * 8)))
                summary.take_lengths(pairs[r.c_id[c]], ffi.buffer(r.c_len + first, count * 8), own)
        return whole

    def _one_by_one(self, begin: int, end: int) -> None:
        """Rows of other sinks (a list, one sink for every thread), in file order."""
        r = self._r
        n = end - begin
        sinks, ids, texts, mode = self._sinks, self._ids, self._key_text, self._mode
        keys = self._keys
        text = self._text
        for ts, d, k, t, a, a_len in zip(
            ffi.unpack(r.ts + begin, n),
            ffi.unpack(r.dur + begin, n),
            ffi.unpack(r.key + begin, n),
            ffi.unpack(r.thread + begin, n),
            ffi.unpack(r.args + begin, n),
            ffi.unpack(r.args_len + begin, n),
        ):
            sink = sinks[t]
            kind = _mode(sink)
            if kind is mode and (kind is _SUMMARY or (kind is _COLUMNS and sink.keys is keys)):
                continue  # taken at once
            name, category, ph = texts[k]
            length = d if ph == "X" else None
            if not a_len:
                args = NO_ARGS
            elif a_len == _HELD and self.held is not None:
                args = self.held[a]
            elif a_len == _COUNTER and self.held is not None:
                args = {name: _signed(a)}
            else:
                args = _DECODE_ARGS(b"[" + text[a : a + a_len] + b"]")[0]
            put = getattr(sink, "put", None)
            if put is not None:
                put(ts, length, name, category, ph, args)
            else:
                pid, tid = ids[t]
                sink.append(Event(name, category, ph, ts, length, pid, tid, args))

    def _name_keys(self) -> None:
        """The text of every C key made so far."""
        r = self._r
        name_p = ffi.new("const char **")
        cat_p = ffi.new("const char **")
        name_n = ffi.new("size_t *")
        cat_n = ffi.new("size_t *")
        ph_p = ffi.new("char *")
        for k in range(len(self._key_text), r.n_keys):
            lib.mxo_key_text(r, k, name_p, name_n, cat_p, cat_n, ph_p)
            # (UTF-8: a .pftrace's names; the JSON rows' are ASCII.  Empty:
            # the texts' arena may not be there yet.)
            name = ffi.unpack(name_p[0], name_n[0]).decode("utf-8") if name_n[0] else ""
            category = ffi.unpack(cat_p[0], cat_n[0]).decode("utf-8") if cat_n[0] else ""
            self._key_text.append((name, category, ph_p[0].decode("ascii")))

    def _keys_for(self, end: int) -> None:
        """Give the keys first met before row ``end`` their ids in the sinks'
        terms, in the order they were met (the pure path's order of ``Keys.of``):
        a Thread's key index, or a summary's (name, category) id."""
        r = self._r
        while self._globals < r.n_keys and r.key_first[self._globals] < end:
            k = self._globals
            name, category, ph = self._key_text[k]
            if self._mode is _COLUMNS:
                index = self._keys.of(name, category, ph)
            elif self._mode is _SUMMARY:
                pair = (name, category)
                index = self._pair_ids.setdefault(pair, len(self._pairs))
                if index == len(self._pairs):
                    self._pairs.append(pair)
            else:
                index = 0  # rows go one by one, by their names
            lib.mxo_set_key(r, k, index)
            self._globals += 1


class RowBlock:
    """Rows of a block in file order, as machine arrays (bytes), for a sink
    with ``take_rows`` (one sink for every thread: parquet.py's).

    ``ts`` and ``dur`` int64 ns (``dur``: ``NO_DUR`` for a point), ``key``
    int32 ids into ``keys`` ((name, category, phase) per id), ``thread``
    int32 ids into ``threads`` ((pid, tid) per id; both lists are the file's
    reader's and only grow while it reads), ``args_at`` and ``args_len``
    size_t: each row's args object in ``text`` (length 0: none).  The rows
    are exactly the events the pure path would hand the sink at their place
    (same times, names, ids and args).
    """

    __slots__ = ("ts", "dur", "key", "thread", "args_at", "args_len", "text", "keys", "threads")

    def __init__(
        self,
        ts: bytes,
        dur: bytes,
        key: bytes,
        thread: bytes,
        args_at: bytes,
        args_len: bytes,
        text: bytes,
        keys: list[tuple[str, str, str]],
        threads: list[tuple[int, int]],
    ) -> None:
        self.ts, self.dur, self.key, self.thread = ts, dur, key, thread
        self.args_at, self.args_len, self.text = args_at, args_len, text
        self.keys, self.threads = keys, threads

    def __len__(self) -> int:
        return len(self.ts) // 8

    def args(self, rows: Any) -> list[dict[str, Any]]:
        """The args of the given rows (each with args), decoded as the pure path does."""
        if not len(rows):
            return []
        # size_t: struct's "N" (typeshed's overloads of cast do not list it)
        at = memoryview(self.args_at).cast("N")  # type: ignore[call-overload]
        length = memoryview(self.args_len).cast("N")  # type: ignore[call-overload]
        starts = [at[i] for i in rows]
        ends = [at[i] + length[i] for i in rows]
        # (maps of builtins: no Python frame per row)
        pieces = map(self.text.__getitem__, map(slice, starts, ends))
        return _DECODE_ARGS(b"[" + b",".join(pieces) + b"]")


_HELD = -1 if lib is None else lib.MXO_HELD_ARGS  # a row's args_len: its args in Reader.held
_COUNTER = -1 if lib is None else lib.MXO_COUNTER_ARGS  # ...: a counter's, args its value


def _signed(bits: int) -> int:
    """A counter's value from its 64 bits (a varint's two's complement)."""
    return bits - (1 << 64) if bits >= 1 << 63 else bits


_ROWS = "rows"  # one sink for every thread, taking RowBlocks
_COLUMNS = "columns"  # Thread sinks: rows as columns at once
_SUMMARY = "summary"  # model._Running sinks: the rule run in C
_EVENTS = "events"  # anything else: rows one at a time


def _array(typecode: str, data: Any) -> array[int]:
    """An array of the machine values in data (bytes-like)."""
    out = array(typecode)
    out.frombytes(data)
    return out


def _mode(sink: Any) -> str:
    if hasattr(sink, "take_rows"):
        return _ROWS
    if type(sink) is Thread and isinstance(sink.ts, array):
        return _COLUMNS
    if hasattr(sink, "take_ranges"):
        return _SUMMARY
    return _EVENTS
