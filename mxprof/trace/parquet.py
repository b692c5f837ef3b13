"""Any trace mxprof reads as Parquet tables: ``mxprof export --format parquet``.

The tables are named and shaped after Perfetto's trace processor (``slice``,
``counter``, ``instant``, ``thread``, ``process``), with the columns a job
needs beside them (``rank``, ``role``, ``host``, ``step``, ``scope``), so
that SQL written for one reads the other with few changes.  Times are
integer ns on the axis ``mxprof merge`` would write for the same inputs
(``merge.timeline``: distributed inputs on the rank-0 worker's clock).

Layout of the output folder::

    DIR/manifest.json                what was converted (sources, sizes, times)
    DIR/slice/rank=R/*.parquet       ranges
    DIR/counter/rank=R/*.parquet     counter samples, one row per series
    DIR/instant/rank=R/*.parquet     instants (markers, allocations ...)
    DIR/thread.parquet, DIR/process.parquet

Columns:

- ``slice``: ``ts``, ``dur``, ``name``, ``category``, ``depth`` (ranges of the
  thread open at its start: 0 for an outermost range), ``thread`` (its
  name), ``utid``, ``upid``, ``pid``, ``tid`` (null where the file's id is not
  an integer), ``args`` (JSON text, null when none), ``step_number`` (set on
  the steps themselves: ``steps.number``), ``step`` (the step of its process
  open at ``ts``), ``scope`` (``args.scope`` where the event names one),
  ``rank``, ``role``, ``host``, ``file``;
- ``counter``: ``ts``, ``name`` (the counter's, ``"NAME KEY"`` for a series
  of a counter with several), ``category``, ``value`` and the thread and job
  columns (``scope``: the memory scope of a ``Scope Storage`` counter);
- ``instant``: as ``slice`` without ``dur`` and ``depth``;
- ``thread``: ``utid``, ``upid``, ``tid``, ``name``, ``pid``, job columns;
- ``process``: ``upid``, ``pid``, ``name``, ``rank``, ``role``, ``host``, ``file``.

``rank``, ``role`` and ``host`` are the process's identity as the process
model reads it (``processes.identities_of``, the one reading of
``distributedInfo`` and ``otherData.host``); a process with no rank of its
own takes its input's (a rank's own file), else the input's place among the
inputs from 0, as ``merge --ranks`` counts it.  ``step`` is the process's
steps as the process model picks them (``steps.chosen``: one group of
frames or ``ProfilerStep#N`` on one thread, the one with the most ranges);
``step_number`` is set on every frame and ``ProfilerStep#N``, whether or
not it is of that group.

Memory stays bounded: events are read block by block (files in mxprof's
one-event-per-line shape; others are read whole, one input at a time) and
written to temporary tables (Arrow IPC, ids for names and threads) as they
come: the compiled reader's rows as columns (``_fastread.RowBlock``), the
events it leaves, or all of them without it, as the same columns.  Each
input is converted on its own (``_convert_part``: a map any executor of
``trace.engine`` runs, its ids from 0), then the final tables are written
from the parts in the inputs' order, their ids offset, batch by batch:
``depth`` in one backwards pass (a thread's ranges come in the order they
ended, so backwards a parent comes before its children and a stack of
starts per thread is all it takes: ``native/offline/mxo_depth.c``, or
``_depths`` without the module; a thread in another order, as other tools
write, gets its depths from DuckDB under a memory limit instead), ``step``
by a sorted lookup in its process's steps (the one thing held whole: three
integers per step).

Needs pyarrow and duckdb: ``pip install "mxprof[sql]"``.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import shutil
import tempfile
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from typing import TYPE_CHECKING, Any

import msgspec

from .._version import __version__
from ..errors import OutputError, ProfilerError, TraceFormatError
from . import _fastread, _scan
from ._columns import NO_DUR
from ._convert import Converter
from ._event import NO_ARGS, Event
from .merge import timeline
from .model import read_lines
from .processes import SCOPE_STORAGE, identities_of
from .reader import PathArg, open_trace, read_raw, shown
from .steps import chosen, number
from .steps import group as steps_group

if TYPE_CHECKING:
    from concurrent.futures import Future

SCHEMA_VERSION = 1  # of the tables; a cache made with another is converted again
MANIFEST = "manifest.json"
TABLES = ("slice", "counter", "instant", "thread", "process")
PARTITIONED = ("slice", "counter", "instant")
_ROWS = 100_000  # rows per Parquet row group of the temporary tables, and per flush
_MEMORY_LIMIT = "400MB"  # DuckDB's, while it computes depth and step
EXTRA = 'pip install "mxprof[sql]"'


class MissingExtra(ProfilerError, ImportError):
    """pyarrow or duckdb is not installed; the message names the pip command."""


def need() -> tuple[Any, Any, Any]:
    """(pyarrow, pyarrow.parquet, duckdb), numpy checked too, or MissingExtra
    naming ``pip install``.

    Example:
        >>> pa, pq, duckdb = need()  # doctest: +SKIP
    """
    try:
        import duckdb
        import numpy  # noqa: F401 - the steps' lookup (pyarrow's own dependency until 16)
        import pyarrow  # type: ignore[import-untyped]
        import pyarrow.parquet  # type: ignore[import-untyped]
    except ImportError as e:
        raise MissingExtra(f"{e.name or 'pyarrow/duckdb'} is missing: {EXTRA}") from None
    return pyarrow, pyarrow.parquet, duckdb


def sources(paths: Sequence[PathArg]) -> list[dict[str, Any]]:
    """What a manifest says of its inputs: absolute path, size and mtime_ns of
    each (a cache is stale when one of them changed).

    Raises:
        TraceReadError: an input cannot be read.
    """
    out = []
    for p in paths:
        path = os.path.abspath(os.fspath(p))
        try:
            st = os.stat(path)
        except OSError:
            with open_trace(path):  # the reader's error, naming the problem
                pass
            raise
        out.append({"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out


def write_parquet(
    paths: Sequence[PathArg], output: PathArg, *, jobs: int | None = 1, engine: str = "local"
) -> dict[str, Any]:
    """Write the traces' events as Parquet tables into the folder output; return
    its manifest (``{"tables": {name: rows}, "sources": [...], ...}``).

    The folder is written whole or not at all (built beside it, then renamed);
    an existing folder is replaced only when it holds such tables already.

    Args:
        paths: traces (any form ``mxprof.load`` reads), placed on one clock as
            ``mxprof merge`` places them.
        output: the folder to write.
        jobs, engine: the executor that converts the inputs, one a task
            (``trace.engine.executor``; default: one, in this process).  The
            tables are the same whatever it is.

    Raises:
        MissingExtra: pyarrow or duckdb is not installed.
        TraceReadError, TraceFormatError: an input cannot be read.
        OutputError: output exists and is something else, or cannot be written.

    Example:
        >>> write_parquet(["rank0.json", "rank1.json"], "job.parquet")["tables"]  # doctest: +SKIP
        {'slice': 5999700, 'counter': 12, 'instant': 0, 'thread': 2, 'process': 2}
    """
    pa, pq, duckdb = need()
    if not paths:
        raise TraceFormatError("export: no input traces")
    out = os.path.abspath(os.fspath(output))
    if os.path.exists(out) and not (
        os.path.isdir(out) and (not os.listdir(out) or os.path.exists(os.path.join(out, MANIFEST)))
    ):
        raise OutputError(
            f"cannot write {shown(out)}: it exists and is not a folder of mxprof's Parquet "
            "tables (a folder with manifest.json)",
            out,
            17,
        )
    parent = os.path.dirname(out)
    try:
        os.makedirs(parent, exist_ok=True)
        work = tempfile.mkdtemp(prefix=".mxprof-parquet-", dir=parent)
        os.chmod(work, 0o755)  # mkdtemp's 0700 would stay on the renamed folder
    except OSError as e:
        raise OutputError(f"cannot write {shown(out)}: {e.strerror or e}", out, e.errno) from None
    try:
        manifest = _convert(paths, work, pa, pq, duckdb, jobs, engine)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(work, out)
    except TraceFormatError:  # an input (TraceReadError is an OSError too)
        raise
    except OSError as e:
        raise OutputError(f"cannot write {shown(out)}: {e.strerror or e}", out, e.errno) from None
    finally:
        if os.path.exists(work):
            shutil.rmtree(work, ignore_errors=True)
    return manifest


def _convert(
    paths: Sequence[PathArg],
    work: str,
    pa: Any,
    pq: Any,
    duckdb: Any,
    jobs: int | None,
    engine: str,
) -> dict[str, Any]:
    """Map: each input's rows to temporary tables of its own (``_convert_part``,
    its ids from 0), on the merged clock worked out here first; reduce: the
    final tables from them in the inputs' order, ids offset (``_Job``)."""
    from .engine import executor

    listed = sources(paths)
    names = [os.fspath(p) for p in paths]
    metadata = [_metadata(n) for n in names]
    mapping = timeline(list(zip(names, metadata)))
    raw = os.path.join(work, ".raw")
    os.mkdir(raw)
    tasks = [
        (name, k, os.path.join(raw, str(k)), meta, info, move)
        for k, (name, meta, (info, move)) in enumerate(zip(names, metadata, mapping))
    ]
    with executor(jobs, engine) as ex:
        parts = ex.map(_convert_part, tasks)
    job = _Job(raw, parts)
    counts = _finish(pa, pq, duckdb, work, job)
    shutil.rmtree(raw)
    manifest = {
        "format": "mxprof-parquet",
        "schema": SCHEMA_VERSION,
        "mxprof_version": __version__,
        "sources": listed,
        "tables": counts,
    }
    with open(os.path.join(work, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _metadata(path: str) -> dict[str, Any]:
    """An input's metadata, read from its two ends (files in mxprof's shape) or whole."""
    try:
        with open_trace(path) as f:
            return _scan.metadata(f)
    except _scan.NotLines:
        return read_raw(path)[1]


_ENCODE = msgspec.json.Encoder().encode


class _Rows:
    """The temporary tables: events buffered, then written as row groups."""

    def __init__(self, pa: Any, pq: Any, folder: str) -> None:
        self.pa, self.pq, self.folder = pa, pq, folder
        import numpy

        self.np = numpy
        # Events (the pure path, the runs of text the compiled one leaves) and
        # RowBlocks (the compiled one's rows) in file order, since the last flush.
        self.buffer: list[Event | _fastread.RowBlock] = []
        self.block_rows = 0  # the RowBlocks' rows past one each (rows: len(buffer) + this)
        # Every (name, category, phase) met, by id: its steps' group, its phase.
        self.keys: list[tuple[str, str, str]] = []
        self.key_ids: dict[tuple[str, str, str], int] = {}
        self.key_group: list[tuple[str, str] | None] = []
        self.key_step = array("b")  # 1 where key_group is set
        self.key_group_id = array("i")  # key_group's, numbered in group_ids
        self.group_ids: dict[tuple[str, str] | None, int] = {}
        self.key_name = array("i")  # the name's, numbered in names
        self.names: dict[str, int] = {}
        self.key_number = array("q")  # a step's number by its name (ProfilerStep#N), else -1
        self.key_phase = array("b")  # _X, _C or _POINT
        self.key_storage = array("b")  # 1 for a counter of a memory scope (its name is one)
        # The input's threads, by id: (pid, tid) as in the file.
        self.thread_keys: list[tuple[Any, Any]] = []
        self.thread_ids: dict[tuple[Any, Any], int] = {}
        # The compiled reader's ids of keys and threads, mapped onto those above.
        self.c_keys: list[tuple[str, str, str]] | None = None
        self.c_key_map = numpy.zeros(0, dtype=numpy.int32)
        self.c_thread_map = numpy.zeros(0, dtype=numpy.int32)
        self.utids: dict[tuple[int, Any, Any], int] = {}
        self.upids: dict[tuple[int, Any], int] = {}
        self.threads: list[dict[str, Any]] = []
        self.processes: list[dict[str, Any]] = []
        self.order: dict[tuple[int, Any, Any, str], int] = {}
        # Each process's groups of steps as they come, by (upid, tid, group
        # name, group category): (starts, ends, numbers) on the merged axis.
        self.step_ranges: dict[tuple[int, Any, str, str], tuple[array[int], ...]] = {}
        # Each process's (rank, role, host), by upid, known once its input is read.
        self.who: dict[int, tuple[int, str | None, str | None]] = {}
        self.files: list[str] = []  # each input's file name, by input
        string, i32, i64, f64 = pa.string(), pa.int32(), pa.int64(), pa.float64()
        # The temporary tables hold ids where the final ones hold what they
        # name: key (name and category, by _Rows.keys) and utid (the thread's
        # process, pid, tid and file), expanded by _Extra at the end.
        common = [("key", i32), ("utid", i64), ("scope", string)]
        self.schemas = {
            "slice": pa.schema(
                [("ts", i64), ("dur", i64)] + common + [("args", string), ("step_number", i64)]
            ),
            "counter": pa.schema([("ts", i64), ("name", string), ("value", f64)] + common),
            "instant": pa.schema([("ts", i64)] + common + [("args", string)]),
        }
        self.writers = {
            # Temporary: Arrow's own files (batches read back as written, no encoding).
            t: pa.ipc.new_file(os.path.join(folder, f"{t}.arrow"), s)
            for t, s in self.schemas.items()
        }
        self.counts = dict.fromkeys(self.schemas, 0)

    def add_input(
        self, k: int, path: str, meta: dict[str, Any], info: dict[str, Any] | None, move: Any
    ) -> None:
        """One input's events, moved onto the merged axis, into the tables."""
        self.k, self.path, self.move = k, path, move
        self.shift = move(0) if getattr(getattr(move, "clock", None), "constant", True) else None
        self.file = os.path.basename(path)
        self.files.append(self.file)
        self.thread_keys, self.thread_ids, self.c_keys = [], {}, None
        sink = _Sink(self)
        before = dict(self.counts)
        try:
            converted, _ = read_lines(path, lambda key: sink, self._flush_if_full)
        except _scan.NotLines:
            # Not in mxprof's shape after all (damage found on the way): read
            # whole, the general way, which names what is wrong.  What was
            # buffered goes; rows already written cannot be taken back.
            self.buffer.clear()
            self.block_rows = 0
            self.order = {key: n for key, n in self.order.items() if key[0] != k}
            if self.counts != before:
                raise TraceFormatError(
                    f"{path}: damaged past its first blocks (or changed while it was "
                    "read): mxprof.load names where; mxprof repair keeps what is before"
                ) from None
            events, _, _ = read_raw(path)
            converted = Converter(lambda key: sink)
            for raw in events:
                converted.add(raw)
        converted.finish()
        self._flush()
        active = [pid for (kk, pid) in self.upids if kk == k]
        pids = sorted({*active, *converted.process_names}, key=str)
        self._identify(k, meta, info, pids, active)
        for pid in pids:
            rank, role, host = self.who[self._upid(pid)]
            name = converted.process_names.get(pid)
            self.processes.append(
                {"upid": self._upid(pid), "pid": _int(pid), "name": name,
                 "rank": rank, "role": role, "host": host, "file": self.file}
            )  # fmt: skip
        keys = {(pid, tid) for (kk, pid, tid) in self.utids if kk == k}
        keys |= set(converted.thread_names)
        for pid, tid in sorted(keys, key=lambda t: (str(t[0]), str(t[1]))):
            rank, role, host = self.who[self._upid(pid)]
            self.threads.append(
                {"utid": self._utid(pid, tid), "upid": self._upid(pid), "tid": _int(tid),
                 "pid": _int(pid), "name": converted.thread_names.get((pid, tid)),
                 "rank": rank, "role": role, "host": host, "file": self.file}
            )  # fmt: skip

    def _identify(
        self,
        k: int,
        meta: dict[str, Any],
        info: dict[str, Any] | None,
        pids: list[Any],
        active: list[Any],
    ) -> None:
        """(rank, role, host) of input k's processes, into ``who``: the
        process model's identities (see the module docstring)."""
        found = identities_of(meta, pids, active)
        own = info.get("rank") if isinstance(info, dict) and "ranks" not in info else None
        fallback = own if type(own) is int else k
        for pid in pids:
            who = found.get(pid)
            rank = who.rank if who is not None and who.rank is not None else fallback
            role = (who.role or None) if who is not None else None
            self.who[self._upid(pid)] = (rank, role, who.host if who is not None else None)

    def _upid(self, pid: Any) -> int:
        key = (self.k, pid)
        found = self.upids.get(key)
        if found is None:
            found = self.upids[key] = len(self.upids)
        return found

    def _utid(self, pid: Any, tid: Any) -> int:
        key = (self.k, pid, tid)
        found = self.utids.get(key)
        if found is None:
            found = self.utids[key] = len(self.utids)
        return found

    def _flush_if_full(self) -> None:
        # Rows counted as events: a batch ends where the pure path's does.
        if len(self.buffer) + self.block_rows >= _ROWS:
            self._flush()

    def take_rows(self, block: _fastread.RowBlock) -> None:
        """A block's rows from the compiled reader, at their place among the events."""
        self.buffer.append(block)
        self.block_rows += len(block) - 1

    def _flush(self) -> None:
        """The buffered events as rows of the temporary tables: ranges, then
        counters, then instants (the order threads get their utids in)."""
        items = self.buffer
        if not items:
            return
        batch = self._batch(items)
        items.clear()  # the sink's list: emptied in place
        self.block_rows = 0
        np = self.np
        phase = np.frombuffer(self.key_phase, dtype=np.int8)[batch.key]
        ranges = np.flatnonzero(phase == _X)
        counters = np.flatnonzero(phase == _C)
        instants = np.flatnonzero(phase == _POINT)
        if len(ranges):
            self._write_slices(batch, ranges)
        if len(counters):
            self._write_counters(batch, counters)
        if len(instants):
            self._write_instants(batch, instants)

    def _key(self, name: str, category: str, ph: str) -> int:
        key = (name, category, ph)
        found = self.key_ids.get(key)
        if found is None:
            found = self.key_ids[key] = len(self.keys)
            self.keys.append(key)
            group = steps_group(name, category) if ph == "X" else None
            self.key_group.append(group)
            self.key_step.append(group is not None)
            self.key_group_id.append(self.group_ids.setdefault(group, len(self.group_ids)))
            self.key_name.append(self.names.setdefault(name, len(self.names)))
            self.key_number.append(number(name, NO_ARGS, -1) if group is not None else -1)
            self.key_phase.append(_X if ph == "X" else _C if ph == "C" else _POINT)
            self.key_storage.append(category == SCOPE_STORAGE)
        return found

    def _thread(self, pid: Any, tid: Any) -> int:
        key = (pid, tid)
        found = self.thread_ids.get(key)
        if found is None:
            found = self.thread_ids[key] = len(self.thread_keys)
            self.thread_keys.append(key)
        return found

    def _batch(self, items: list[Any]) -> _Batch:
        """The buffer's events and row blocks as one set of columns, in order."""
        np = self.np
        parts: list[_Batch] = []
        events: list[Event] = []
        for item in items:
            if type(item) is _fastread.RowBlock:
                if events:
                    parts.append(self._from_events(events))
                    events = []
                parts.append(self._from_block(item))
            else:
                events.append(item)
        if events:
            parts.append(self._from_events(events))
        if len(parts) == 1:
            return parts[0]
        offsets = np.cumsum([0] + [len(p.ts) for p in parts[:-1]])
        return _Batch(
            np.concatenate([p.ts for p in parts]),
            np.concatenate([p.dur for p in parts]),
            np.concatenate([p.key for p in parts]),
            np.concatenate([p.thread for p in parts]),
            np.concatenate([p.with_args + at for p, at in zip(parts, offsets)]),
            [d for p in parts for d in p.args],
        )

    def _from_events(self, events: list[Event]) -> _Batch:
        """Events (runs of text the compiled reader left, or the pure path) as columns."""
        np = self.np
        key, thread = self._key, self._thread
        with_args = [i for i, e in enumerate(events) if e.args]
        return _Batch(
            np.array([e.ts for e in events], dtype=np.int64),
            np.array([e.dur or 0 for e in events], dtype=np.int64),
            np.array([key(e.name, e.category, e.ph) for e in events], dtype=np.int32),
            np.array([thread(e.pid, e.tid) for e in events], dtype=np.int32),
            np.array(with_args, dtype=np.int64),
            [events[i].args for i in with_args],
        )

    def _from_block(self, block: _fastread.RowBlock) -> _Batch:
        """Rows of the compiled reader as columns: its ids of keys and threads
        mapped onto this input's, at most once per id."""
        np = self.np
        if block.keys is not self.c_keys:  # another file's reader: its own ids
            self.c_keys, self.c_key_map = block.keys, np.zeros(0, dtype=np.int32)
            self.c_thread_map = np.zeros(0, dtype=np.int32)
        known = len(self.c_key_map)
        if known < len(block.keys):
            more = [self._key(*k) for k in block.keys[known:]]
            self.c_key_map = np.concatenate([self.c_key_map, np.array(more, dtype=np.int32)])
        known = len(self.c_thread_map)
        if known < len(block.threads):
            more = [self._thread(*t) for t in block.threads[known:]]
            self.c_thread_map = np.concatenate([self.c_thread_map, np.array(more, dtype=np.int32)])
        with_args = np.flatnonzero(np.frombuffer(block.args_len, dtype=np.uintp))
        args = block.args(with_args.tolist())
        kept = [i for i, a in enumerate(args) if a]  # "{}": no args, as an Event's
        if len(kept) < len(args):
            with_args, args = with_args[kept], [args[i] for i in kept]
        ts = np.frombuffer(block.ts, dtype=np.int64)
        dur = np.frombuffer(block.dur, dtype=np.int64)
        return _Batch(
            ts,
            np.where(dur == NO_DUR, 0, dur),
            self.c_key_map[np.frombuffer(block.key, dtype=np.int32)],
            self.c_thread_map[np.frombuffer(block.thread, dtype=np.int32)],
            with_args.astype(np.int64),
            args,
        )

    def _times(self, batch: _Batch, rows: Any, ranges: bool) -> tuple[Any, Any]:
        """Starts and lengths on the merged axis (lengths: of ranges only): a
        constant shift at once, a drifting clock's mapping per event."""
        np = self.np
        ts = batch.ts[rows]
        if self.shift is not None:
            return ts + self.shift, batch.dur[rows] if ranges else None
        move = self.move
        starts = np.array([move(t) for t in ts.tolist()], dtype=np.int64)
        if not ranges:
            return starts, None
        ends = [move(t + d) for t, d in zip(ts.tolist(), batch.dur[rows].tolist())]
        return starts, np.array(ends, dtype=np.int64) - starts

    def _thread_columns(self, batch: _Batch, rows: Any) -> tuple[Any, Any]:
        """utid and upid of the rows: threads numbered in the order of their
        first rows (the pure reading's order), looked up once per thread."""
        np = self.np
        threads = batch.thread[rows]
        present = np.flatnonzero(np.bincount(threads, minlength=len(self.thread_keys)))
        if len(present) <= 64:  # the usual few threads: each one's first row
            first = [int(np.argmax(threads == t)) for t in present.tolist()]
        else:
            present, first = np.unique(threads, return_index=True)
        order = present[np.argsort(first, kind="stable")]
        keys = [self.thread_keys[t] for t in order.tolist()]
        utids = [self._utid(p, t) for p, t in keys]
        upids = [self._upid(p) for p, _ in keys]
        place = np.zeros(len(self.thread_keys), dtype=np.int64)
        place[order] = np.arange(len(order))
        at = place[threads]
        return np.array(utids, dtype=np.int64)[at], np.array(upids, dtype=np.int64)[at]

    def _args(self, batch: _Batch, rows: Any) -> tuple[Any, list[dict[str, Any]]]:
        """Which of the rows have args (a mask) and their args, in order."""
        np = self.np
        has = np.isin(rows, batch.with_args, assume_unique=True)
        if not has.any():
            return has, []
        index = np.searchsorted(batch.with_args, rows[has])
        return has, [batch.args[i] for i in index.tolist()]

    def _sparse(self, has: Any, values: list[Any]) -> Any:
        """A string column of len(has) rows: values (str, UTF-8 bytes or None)
        where has, null elsewhere; built from its buffers (no object a row)."""
        np, pa = self.np, self.pa
        n = len(has)
        kept = np.fromiter(map(operator.is_not, values, repeat(None)), bool, len(values))
        if not kept.all():
            values = list(compress(values, kept))
            has = has.copy()
            has[has] = kept
        if not values:
            return pa.nulls(n, pa.string())
        if type(values[0]) is str:
            values = list(map(str.encode, values))
        lengths = np.zeros(n, dtype=np.int64)
        lengths[has] = np.fromiter(map(len, values), np.int64, len(values))
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
        if offsets[-1] >= 2**31:  # past a string array's 32-bit offsets: by pieces
            index = np.zeros(n, dtype=np.int32)
            index[has] = np.arange(len(values), dtype=np.int32)
            return pa.array(values, pa.string()).take(pa.array(index, mask=~has))
        buffers = [np.packbits(has, bitorder="little"), offsets.astype(np.int32), b"".join(values)]
        return pa.Array.from_buffers(
            pa.string(), n, [pa.py_buffer(b) for b in buffers], null_count=n - len(values)
        )

    def _write(self, table: str, columns: dict[str, Any]) -> None:
        schema = self.schemas[table]
        batch = self.pa.table(
            {
                f.name: c
                if isinstance(c := columns[f.name], self.pa.Array)
                else self.pa.array(c, f.type)
                for f in schema
            }
        )
        # Batches of _ROWS at most, as the depth pass and its fallback read them.
        self.writers[table].write_table(batch, max_chunksize=_ROWS)
        self.counts[table] += batch.num_rows

    def _write_slices(self, batch: _Batch, rows: Any) -> None:
        np, pa = self.np, self.pa
        starts, lengths = self._times(batch, rows, ranges=True)
        columns: dict[str, Any] = {"ts": starts, "dur": lengths, "key": batch.key[rows]}
        columns["utid"], upids = self._thread_columns(batch, rows)
        has, args = self._args(batch, rows)
        columns["args"] = self._sparse(has, list(map(_ENCODE, args)))
        columns["scope"] = self._sparse(has, _scopes(args))
        keys = batch.key[rows]
        is_step = np.frombuffer(self.key_step, dtype=np.int8)[keys].astype(bool)
        numbers = np.zeros(len(rows), dtype=np.int64)
        if is_step.any():
            at = np.flatnonzero(is_step)
            # The steps' frame args: (place among the steps, value) where an int.
            with_args = np.flatnonzero(has[at])
            index = (np.cumsum(has) - 1)[at[with_args]].tolist()
            found = list(map(dict.get, map(args.__getitem__, index), repeat("frame")))
            # (an exact int: a bool is no frame number, as steps.number has it)
            ints = np.fromiter(map(operator.is_, map(type, found), repeat(int)), bool, len(found))
            frames = (with_args[ints], list(compress(found, ints)))
            numbers[at] = self._steps(
                batch.thread[rows[at]], keys[at], upids[at], starts[at],
                (starts + lengths)[at], frames,
            )  # fmt: skip
        columns["step_number"] = pa.array(numbers, pa.int64(), mask=~is_step)
        self._write("slice", columns)

    def _steps(
        self,
        threads: Any,
        keys: Any,
        upids: Any,
        starts: Any,
        ends: Any,
        frames: tuple[Any, list[Any]],
    ) -> Any:
        """The steps' numbers (``steps.number``: the ``frame`` arg, else the N
        of ``ProfilerStep#N``, else the range's place among its thread's of
        its name, counted on from earlier batches), their ranges added to
        ``step_ranges`` in row order, groups in the order first met."""
        np = self.np
        n = len(keys)
        # Each row's place among the rows of its (thread, name), from the counts so far.
        names = np.frombuffer(self.key_name, dtype=np.int32)[keys].astype(np.int64)
        found, first, inverse = np.unique(
            threads.astype(np.int64) * len(self.names) + names,
            return_index=True, return_inverse=True,
        )  # fmt: skip
        inverse = inverse.reshape(-1)
        counts = np.bincount(inverse, minlength=len(found))
        place = np.empty(n, dtype=np.int64)
        place[np.argsort(inverse, kind="stable")] = np.arange(n) - np.repeat(
            np.cumsum(counts) - counts, counts
        )
        base = np.zeros(len(found), dtype=np.int64)
        for g, row in enumerate(first.tolist()):
            pid, tid = self.thread_keys[threads[row]]
            key = (self.k, pid, tid, self.keys[keys[row]][0])
            base[g] = self.order.get(key, 0)
            self.order[key] = int(base[g] + counts[g])
        numbers = base[inverse] + place
        fixed = np.frombuffer(self.key_number, dtype=np.int64)[keys]  # ProfilerStep#N, or -1
        numbers = np.where(fixed >= 0, fixed, numbers)
        if len(frames[1]):  # the frame args that are ints, by their place among the steps
            numbers[frames[0]] = frames[1]
        # The ranges by (process, thread, group), each group's rows in order.
        groups = np.frombuffer(self.key_group_id, dtype=np.int32)[keys]
        combos, first, inverse = np.unique(
            np.stack([upids, threads.astype(np.int64), groups.astype(np.int64)], axis=1),
            axis=0, return_index=True, return_inverse=True,
        )  # fmt: skip
        inverse = inverse.reshape(-1)
        for c in np.argsort(first, kind="stable").tolist():
            upid, thread, _ = combos[c].tolist()
            group = self.key_group[keys[first[c]]]
            assert group is not None
            got = self.step_ranges.setdefault(
                (upid, self.thread_keys[thread][1], *group), (array("q"), array("q"), array("q"))
            )
            sel = inverse == c
            for values, into in zip((starts[sel], ends[sel], numbers[sel]), got):
                into.frombytes(values.astype(np.int64).tobytes())
        return numbers

    def _write_counters(self, batch: _Batch, rows: Any) -> None:
        """A row per series of each counter: per value when a counter has one
        value (as the core writes them), else one by one."""
        np = self.np
        has, args = self._args(batch, rows)
        keys = batch.key[rows]
        with_args = np.flatnonzero(has)
        if args and all(len(a) == 1 for a in args):
            found = list(chain.from_iterable(map(dict.values, args)))
            # _number's test by the value's exact type (maps of builtins: no frame a row)
            numeric = np.fromiter(
                map(_NUMERIC.__contains__, map(type, found)), dtype=bool, count=len(found)
            )
            kept = with_args[numeric]
            names: list[str | None] = [None] * len(kept)  # the counter's own: the key's
            values = np.fromiter(
                map(float, compress(found, numeric)), dtype=np.float64, count=len(kept)
            )
            storage = np.frombuffer(self.key_storage, dtype=np.int8)[keys[kept]].astype(bool)
            scopes = self._sparse(storage, [self.keys[k][0] for k in keys[kept][storage]])
        else:
            listed: list[int] = []  # a row per series: the event's place in rows
            names, numbers, scoped = [], [], []
            for i, a in zip(with_args.tolist(), args):
                name, category, _ = self.keys[keys[i]]
                series = [(k, v) for k, v in a.items() if _number(v)]
                scope = name if category == SCOPE_STORAGE else _scope(a)
                for key, value in series:
                    listed.append(i)
                    names.append(name if key == name or len(series) == 1 else f"{name} {key}")
                    numbers.append(float(value))
                    scoped.append(scope)
            kept, values, scopes = np.array(listed, dtype=np.int64), numbers, scoped
        if not len(kept):
            return
        chosen = rows[kept]
        starts, _ = self._times(batch, chosen, ranges=False)
        columns: dict[str, Any] = {"ts": starts, "name": names, "key": batch.key[chosen]}
        columns["utid"] = self._thread_columns(batch, chosen)[0]
        columns["value"] = values
        columns["scope"] = scopes
        self._write("counter", columns)

    def _write_instants(self, batch: _Batch, rows: Any) -> None:
        starts, _ = self._times(batch, rows, ranges=False)
        columns: dict[str, Any] = {"ts": starts, "key": batch.key[rows]}
        columns["utid"] = self._thread_columns(batch, rows)[0]
        has, args = self._args(batch, rows)
        columns["args"] = self._sparse(has, list(map(_ENCODE, args)))
        columns["scope"] = self._sparse(has, _scopes(args))
        self._write("instant", columns)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()

    def part(self) -> _Part:
        """What the reduce needs of this converter's one input (closed)."""
        upids = [0] * len(self.utids)
        for (k, pid, _), utid in self.utids.items():
            upids[utid] = self.upids[k, pid]
        return _Part(
            self.folder, dict(self.counts), self.keys, upids, self.threads, self.processes,
            self.step_ranges, self.who,
        )  # fmt: skip


def _convert_part(task: tuple[str, int, str, dict[str, Any], dict[str, Any] | None, Any]) -> _Part:
    """One input (path, its place k, a folder to make, its metadata, its
    distributedInfo, its time mapping) to temporary tables: the map of
    ``_convert``, run by any executor (in a worker: the folder must be one
    it can write, beside the output)."""
    path, k, folder, meta, info, move = task
    pa, pq, _ = need()
    os.makedirs(folder, exist_ok=True)  # (a task run again, its worker lost: written anew)
    rows = _Rows(pa, pq, folder)
    try:
        rows.add_input(k, path, meta, info, move)
    finally:
        rows.close()
    return rows.part()


@dataclass(frozen=True)
class _Part:
    """One input converted: its temporary tables' folder, their rows'
    counts, and, its ids counted from 0, its keys (by key id), each utid's
    upid, its thread and process rows, its steps and its processes' job."""

    folder: str
    counts: dict[str, int]
    keys: list[tuple[str, str, str]]
    upids: list[int]
    threads: list[dict[str, Any]]
    processes: list[dict[str, Any]]
    step_ranges: dict[tuple[int, Any, str, str], tuple[array[int], ...]]
    who: dict[int, tuple[int, str | None, str | None]]


class _Job:
    """The inputs' parts as one: ids offset by the earlier inputs' (the
    numbering one converter reading the inputs in turn would give)."""

    def __init__(self, folder: str, parts: list[_Part]) -> None:
        self.folder, self.parts = folder, parts
        self.utid_at: list[int] = []  # each part's first utid, upid and key id
        self.upid_at: list[int] = []
        self.key_at: list[int] = []
        self.keys: list[tuple[str, str, str]] = []
        self.upids: list[int] = []  # by utid
        self.threads: list[dict[str, Any]] = []
        self.processes: list[dict[str, Any]] = []
        self.step_ranges: dict[tuple[int, Any, str, str], tuple[array[int], ...]] = {}
        self.who: dict[int, tuple[int, str | None, str | None]] = {}
        self.counts = dict.fromkeys(TABLES[:3], 0)
        for part in parts:
            utid, upid = len(self.upids), len(self.who)
            self.utid_at.append(utid)
            self.upid_at.append(upid)
            self.key_at.append(len(self.keys))
            self.keys += part.keys
            self.upids += [u + upid for u in part.upids]
            self.threads += [{**t, "utid": t["utid"] + utid, "upid": t["upid"] + upid}
                             for t in part.threads]  # fmt: skip
            self.processes += [{**p, "upid": p["upid"] + upid} for p in part.processes]
            for key, found in part.step_ranges.items():
                self.step_ranges[(key[0] + upid, key[1], key[2], key[3])] = found
            self.who.update({u + upid: w for u, w in part.who.items()})
            for table, n in part.counts.items():
                self.counts[table] += n

    def batches(self, pa: Any, table: str, backwards: bool = False) -> Iterator[Any]:
        """The temporary table's batches in the inputs' order (or backwards:
        last batch first), ids offset onto the job's."""
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        order = list(range(len(self.parts)))
        for i in reversed(order) if backwards else order:
            with _temporary(pa, self.parts[i].folder, table) as source:
                found = range(source.num_record_batches)
                for k in reversed(found) if backwards else found:
                    batch = source.get_batch(k)
                    for name, at in (("utid", self.utid_at[i]), ("key", self.key_at[i])):
                        if at:
                            field = batch.schema.get_field_index(name)
                            column = batch.column(field)
                            column = pc.add(column, pa.scalar(at, column.type))
                            batch = batch.set_column(field, name, column)
                    yield batch

    def schema(self, pa: Any, table: str) -> Any:
        """The temporary table's schema."""
        with _temporary(pa, self.parts[0].folder, table) as source:
            return source.schema


class _Sink:
    """Every thread's events into one list: ``append`` is the list's own (C
    speed), ``take_rows`` the compiled reader's blocks of rows (_fastread)."""

    __slots__ = ("append", "take_rows")

    def __init__(self, rows: _Rows) -> None:
        self.append = rows.buffer.append
        self.take_rows = rows.take_rows


class _Batch:
    """Events as columns: ``ts`` and ``dur`` (file ns; 0 for a point),
    ``key`` (ids into ``_Rows.keys``), ``thread`` (into ``_Rows.thread_keys``),
    ``with_args`` (the rows with args, ascending) and their ``args``."""

    __slots__ = ("ts", "dur", "key", "thread", "with_args", "args")

    def __init__(
        self, ts: Any, dur: Any, key: Any, thread: Any, with_args: Any, args: list[dict[str, Any]]
    ) -> None:
        self.ts, self.dur, self.key, self.thread = ts, dur, key, thread
        self.with_args, self.args = with_args, args


# A key's phase, as _flush splits the rows: ranges, counters, the rest (instants).
_X, _C, _POINT = 0, 1, 2


def _int(value: Any) -> int | None:
    return value if type(value) is int and -(2**63) <= value < 2**63 else None


_NUMERIC = frozenset((int, float))  # what _number takes, as exact types (msgspec decodes no others)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scopes(args: list[dict[str, Any]]) -> list[str | None]:
    """``_scope`` of each (dicts, not empty)."""
    return [s if type(s) is str else None for s in map(dict.get, args, repeat("scope"))]


def _scope(args: dict[str, Any]) -> str | None:
    scope = args.get("scope") if args else None
    return scope if isinstance(scope, str) else None


# The fallback for slices whose threads are not in end order (files of other
# tools, ranges paired at the end): depth by DuckDB.  Each range is a +1 at
# its start and a -1 at its end; at one instant ends come first (back-to-back
# ranges do not nest), then zero-length ranges (they contain nothing), then
# starts, longer first (a parent before its child).  The running sum before a
# start is its depth.
_DEPTHS = """
WITH raw AS (SELECT row_number() OVER () - 1 AS seq, utid, ts, dur
             FROM read_parquet('{raw}/slice.parquet')),
marks AS (
    SELECT seq, utid, ts AS t, CASE WHEN dur > 0 THEN 2 ELSE 1 END AS o, -dur AS longer,
           CASE WHEN dur > 0 THEN 1 ELSE 0 END AS delta
    FROM raw
    UNION ALL
    SELECT seq, utid, ts + dur, 0, 0, -1 FROM raw WHERE dur > 0
),
running AS (
    SELECT seq, o, SUM(delta) OVER (PARTITION BY utid ORDER BY t, o, longer, seq
                                    ROWS UNBOUNDED PRECEDING) - delta AS depth
    FROM marks
)
SELECT seq, depth::INTEGER AS depth FROM running WHERE o > 0 ORDER BY seq
"""


class _Unordered(Exception):
    """A thread's ranges are not in the order they ended: depth the general way."""


def _finish(pa: Any, pq: Any, duckdb: Any, work: str, rows: _Job) -> dict[str, int]:
    """The final tables from the temporary ones: depth, step and thread names
    added, written by rank (hive style: ``rank=R/``).

    Slices are read back last row group first, each backwards: for threads
    whose ranges came in the order they ended (mxprof's writers write a
    range when it ends) that is parents before children, so a stack of
    starts per thread gives each range's depth in one pass in bounded memory.
    A thread in another order sends the slices to DuckDB for depth instead.
    """
    import numpy as np

    steps = {upid: _sorted_steps(np, *rows.step_ranges[key]) for upid, key in _chosen(rows).items()}
    # What a utid names, by utid: its thread's name, process, ids, file and job.
    threads = sorted(rows.threads, key=lambda t: int(t["utid"]))
    assert [t["utid"] for t in threads] == list(range(len(rows.upids)))
    upids = np.array(rows.upids, dtype=np.int64)
    who = [rows.who[upid] for upid in rows.upids]
    per_thread = {
        "thread": pa.array([t["name"] for t in threads], pa.string()),
        "upid": pa.array(upids),
        "pid": pa.array([t["pid"] for t in threads], pa.int64()),
        "tid": pa.array([t["tid"] for t in threads], pa.int64()),
        "file": pa.array([t["file"] for t in threads], pa.string()),
        "rank": pa.array([w[0] for w in who], pa.int64()),
        "role": pa.array([w[1] for w in who], pa.string()),
        "host": pa.array([w[2] for w in who], pa.string()),
    }
    keys = (
        pa.array([k[0] for k in rows.keys], pa.string()),
        pa.array([k[1] for k in rows.keys], pa.string()),
    )
    extra = _Extra(pa, np, steps, upids, per_thread, keys)
    try:
        _write_slices(pa, pq, work, rows, extra, depths=None)
    except _Unordered:
        shutil.rmtree(os.path.join(work, "slice"), ignore_errors=True)
        _write_slices(pa, pq, work, rows, extra, depths=_duckdb_depths(duckdb, rows))
    for table in ("counter", "instant"):
        with _Partitions(pq, work, table) as out:
            for batch in rows.batches(pa, table):
                out.write(extra.add(batch))
            out.finish(extra.add(rows.schema(pa, table).empty_table()))
    _write_threads(pa, pq, work, rows)
    counts = dict(rows.counts)
    counts["thread"] = len(rows.threads)
    counts["process"] = len(rows.processes)
    return counts


def _write_threads(pa: Any, pq: Any, work: str, rows: _Job) -> None:
    """The thread and process tables."""
    i64, string = pa.int64(), pa.string()
    job = [("rank", i64), ("role", string), ("host", string), ("file", string)]
    thread = pa.schema(
        [("utid", i64), ("upid", i64), ("tid", i64), ("pid", i64), ("name", string)] + job
    )
    process = pa.schema([("upid", i64), ("pid", i64), ("name", string)] + job)
    pq.write_table(pa.Table.from_pylist(rows.threads, thread), os.path.join(work, "thread.parquet"))
    pq.write_table(
        pa.Table.from_pylist(rows.processes, process), os.path.join(work, "process.parquet")
    )


def _chosen(rows: _Job) -> dict[int, tuple[int, Any, str, str]]:
    """Each process's steps: the group ``steps.chosen`` picks, given the
    groups in the order it expects (thread order, then first start)."""
    by_process: dict[int, list[tuple[int, Any, str, str]]] = {}
    for key in rows.step_ranges:
        by_process.setdefault(key[0], []).append(key)
    out = {}
    for upid, keys in by_process.items():
        keys.sort(key=lambda key: (str(key[1]), min(rows.step_ranges[key][0])))
        measures = {}
        for key in keys:
            starts, ends, _ = rows.step_ranges[key]
            measures[key] = (len(starts), sum(ends) - sum(starts))
        out[upid] = chosen(measures)
    return out


def _sorted_steps(np: Any, starts: Any, ends: Any, numbers: Any) -> tuple[Any, Any, Any]:
    a, b, n = (np.frombuffer(x, dtype=np.int64) for x in (starts, ends, numbers))
    order = np.argsort(a, kind="stable")
    return a[order], b[order], n[order]


class _Extra:
    """The final columns from the temporary ones: what a key names (name,
    category), what a utid names (``per_thread``: the thread's name, upid,
    pid, tid, file, rank, role and host, by utid), and the step."""

    def __init__(
        self,
        pa: Any,
        np: Any,
        steps: dict[int, Any],
        upids: Any,
        per_thread: dict[str, Any],
        keys: tuple[Any, Any],
    ) -> None:
        self.pa, self.np, self.steps, self.upids = pa, np, steps, upids
        self.per_thread, self.keys = per_thread, keys

    def step(self, upids: Any, ts: Any) -> Any:
        """The step of each (process, instant): the latest of the process's steps
        that began at or before it, if it has not ended (a step's own start
        counts, for zero-length steps too)."""
        np = self.np
        out = np.zeros(len(ts), dtype=np.int64)
        found = np.zeros(len(ts), dtype=bool)
        present = np.unique(upids)
        for upid in present.tolist():
            got = self.steps.get(upid)
            if got is None:
                continue
            starts, ends, numbers = got
            sel = upids == upid if len(present) > 1 else slice(None)
            at = ts[sel]
            k = np.searchsorted(starts, at, side="right") - 1
            before = k >= 0
            k = np.where(before, k, 0)
            inside = before & ((at < ends[k]) | (at == starts[k]))
            out[sel] = numbers[k]
            found[sel] = inside
        return self.pa.array(out, self.pa.int64(), mask=~found)

    def add(self, table: Any, depth: Any = None) -> Any:
        """A temporary table (or batch of one) as the final one: its ids
        expanded, ``depth`` (slices) and ``step`` added, in the final order."""
        import pyarrow.compute as pc

        pa, np = self.pa, self.np
        utids = _numbers(np, table.column("utid"))
        upids = self.upids[utids]
        key = _numbers(np, table.column("key"))
        columns = {n: table.column(n) for n in table.column_names if n != "key"}
        # Text as dictionaries over the rows' ids (the Parquet writer takes
        # them as they are; read back, they are plain strings again).
        by_key = _Coded(pa, np, key, len(self.keys[0]))
        names = by_key(self.keys[0])
        if "name" in columns:  # a counter's row names its series, or (null) the counter's own
            names = pc.coalesce(columns["name"], names.cast(pa.string()))
        columns["name"] = names
        columns["category"] = by_key(self.keys[1])
        by_thread = _Coded(pa, np, utids, len(self.upids))
        at = pa.array(utids)
        for name, values in self.per_thread.items():
            columns[name] = by_thread(values) if values.type == pa.string() else values.take(at)
        columns["step"] = self.step(upids, table.column("ts").to_numpy())
        if depth is not None:
            columns["depth"] = pa.array(depth, pa.int32())
        return pa.table({n: columns[n] for n in _ORDER if n in columns})


def _numbers(np: Any, column: Any) -> Any:
    """A column of integers (an array or chunked) as one numpy array."""
    if hasattr(column, "combine_chunks"):
        column = column.combine_chunks()
    return column.to_numpy()


class _Coded:
    """Columns by id (ids: the rows' ids, below n) as dictionary arrays of
    the values the rows use: ``coded(values)`` is values[ids], null where
    the value is null."""

    def __init__(self, pa: Any, np: Any, ids: Any, n: int) -> None:
        self.pa, self.np, self.ids = pa, np, ids
        self.used = np.bincount(ids, minlength=n).astype(bool)
        self.present = np.flatnonzero(self.used)
        place = np.zeros(n, dtype=np.int32)
        place[self.present] = np.arange(len(self.present), dtype=np.int32)
        self.indices = place[ids]

    def __call__(self, values: Any) -> Any:
        pa, np = self.pa, self.np
        if values.null_count == 0:
            dictionary = values.take(pa.array(self.present))
            return pa.DictionaryArray.from_arrays(pa.array(self.indices), dictionary)
        valid = self.used & ~values.is_null().to_numpy(zero_copy_only=False)
        present = np.flatnonzero(valid)
        place = np.zeros(len(values), dtype=np.int32)
        place[present] = np.arange(len(present), dtype=np.int32)
        indices = pa.array(place[self.ids], mask=~valid[self.ids])
        return pa.DictionaryArray.from_arrays(indices, values.take(pa.array(present)))


# The final columns, in this order (those a table has); rank goes in the path.
_ORDER = (
    "ts", "dur", "name", "category", "value", "depth", "thread", "utid", "upid", "pid", "tid",
    "args", "step_number", "step", "scope", "rank", "role", "host", "file",
)  # fmt: skip


@contextlib.contextmanager
def _temporary(pa: Any, raw: str, table: str) -> Iterator[Any]:
    """A temporary table's reader: its batches one at a time, by index."""
    with pa.OSFile(os.path.join(raw, f"{table}.arrow")) as f:
        yield pa.ipc.open_file(f)


def _write_slices(
    pa: Any, pq: Any, work: str, rows: _Job, extra: _Extra, depths: Any | None
) -> None:
    """The slice table, depth from the reverse pass (depths None) or given by row."""
    np = extra.np
    # The pass in C where the offline reader's module is built (and not
    # turned off), else in Python: the same depths (tests/test_parquet_fast.py).
    compiled = _fastread.Depths() if _fastread.available() else None
    stacks: dict[int, list[int]] = {}
    last_end: dict[int, int] = {}
    with _Partitions(pq, work, "slice") as out:
        end = 0 if depths is None else len(depths)  # the rows before the next batch read
        for batch in rows.batches(pa, "slice", backwards=True):
            end -= batch.num_rows
            if depths is not None:
                out.write(extra.add(batch, depths[end : end + batch.num_rows]))
                continue
            backwards = batch.take(pa.array(np.arange(batch.num_rows - 1, -1, -1)))
            utids, ts, durs = (
                np.ascontiguousarray(backwards.column(c).to_numpy(), dtype=np.int64)
                for c in ("utid", "ts", "dur")
            )
            found: Any
            if compiled is not None:
                found = np.zeros(batch.num_rows, dtype=np.int32)
                if not compiled.run(utids, ts, durs, found):
                    raise _Unordered
            else:
                found = _depths(utids.tolist(), ts.tolist(), durs.tolist(), stacks, last_end)
            out.write(extra.add(backwards, found))
        out.finish(extra.add(rows.schema(pa, "slice").empty_table(), []))


def _depths(
    utids: list[int],
    ts: list[int],
    durs: list[int],
    stacks: dict[int, list[int]],
    last_end: dict[int, int],
) -> list[int]:
    """Depths of ranges met latest-ended first, per thread.

    Every range still on a thread's stack ended no earlier than this one, so
    it contains this one exactly when it began no later: the stack holds
    starts only.  Zero-length ranges contain nothing and are not pushed.

    Raises:
        _Unordered: a thread's ranges did not come in the order they ended.
    """
    out = []
    current = -1
    stack: list[int] = []
    bound = 0
    for u, start, length in zip(utids, ts, durs):
        if u != current:
            if current >= 0:
                last_end[current] = bound
            current = u
            stack = stacks.setdefault(u, [])
            bound = last_end.get(u, 1 << 63)
        end = start + length
        if end > bound:
            raise _Unordered
        bound = end
        while stack and stack[-1] > start:
            stack.pop()
        out.append(len(stack))
        if length > 0:
            stack.append(start)
    if current >= 0:
        last_end[current] = bound
    return out


def _duckdb_depths(duckdb: Any, rows: _Job) -> Any:
    """Depth of every slice, in the temporary tables' row order, by DuckDB
    (from a Parquet copy of the three columns it needs, made batch by batch)."""
    pa, pq, _ = need()
    raw = rows.folder
    schema = pa.schema([("utid", pa.int64()), ("ts", pa.int64()), ("dur", pa.int64())])
    with pq.ParquetWriter(os.path.join(raw, "slice.parquet"), schema) as out:
        for batch in rows.batches(pa, "slice"):
            out.write_table(pa.Table.from_batches([batch.select(schema.names)]))
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"SET memory_limit = '{_MEMORY_LIMIT}'")
        con.execute(f"SET temp_directory = '{quoted(os.path.join(raw, 'spill'))}'")
        con.execute("SET enable_progress_bar = false")
        relation = con.sql(_DEPTHS.format(raw=quoted(raw)))
        table = (getattr(relation, "to_arrow_table", None) or relation.arrow)()
        return table.column("depth")
    finally:
        con.close()


class _Partitions:
    """One Parquet file per rank under folder (``rank=R/data.parquet``).

    The encoding runs on a thread of its own (pyarrow lets the GIL go
    meanwhile), one table at a time, while the caller makes the next: at most
    two tables are held.
    """

    def __init__(self, pq: Any, work: str, table: str) -> None:
        self.pq, self.folder = pq, os.path.join(work, table)
        self.writers: dict[int, Any] = {}
        # Imported here: concurrent.futures registers an exit hook, which a
        # command that never writes Parquet must not leave (tests/test_offline.py).
        from concurrent.futures import ThreadPoolExecutor

        self.thread = ThreadPoolExecutor(1, thread_name_prefix="mxprof-parquet")
        self.pending: Future[None] | None = None

    def __enter__(self) -> _Partitions:
        os.makedirs(self.folder, exist_ok=True)
        return self

    def _wait(self) -> None:
        """The write under way done (its error raised here)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def write(self, table: Any) -> None:
        import pyarrow.compute as pc

        ranks = table.column("rank")
        found = pc.unique(ranks).to_pylist()
        for rank in found:
            part = table if len(found) == 1 else table.filter(pc.equal(ranks, rank))
            part = part.drop_columns(["rank"])
            writer = self.writers.get(rank)
            if writer is None:
                folder = os.path.join(self.folder, f"rank={rank}")
                os.makedirs(folder, exist_ok=True)
                writer = self.writers[rank] = self.pq.ParquetWriter(
                    os.path.join(folder, "data.parquet"), part.schema, **_options(part.schema)
                )
            self._wait()
            self.pending = self.thread.submit(writer.write_table, part, row_group_size=_ROWS)

    def finish(self, empty: Any) -> None:
        """An empty table still has its columns: one empty file where none was written."""
        self._wait()
        if not self.writers:
            folder = os.path.join(self.folder, "rank=0")
            os.makedirs(folder, exist_ok=True)
            empty = empty.drop_columns(["rank"])
            path = os.path.join(folder, "data.parquet")
            self.pq.write_table(empty, path, **_options(empty.schema))

    def __exit__(self, *exc: object) -> None:
        try:
            self._wait()
        finally:
            self.thread.shutdown()
            for writer in self.writers.values():
                writer.close()


def _options(schema: Any) -> dict[str, Any]:
    """How the final tables are written: zstd; ``ts`` (near-sorted) as deltas;
    min/max statistics for the integer columns only (what DuckDB prunes row
    groups by; a string column's cost more to write than they save)."""
    names = schema.names
    return {
        "store_schema": False,  # (read back, the dictionaries of text are plain strings)
        "compression": "zstd",
        "use_dictionary": [n for n in names if n != "ts"],
        "column_encoding": {"ts": "DELTA_BINARY_PACKED"},
        "write_statistics": [f.name for f in schema if f.type == "int64" or f.type == "int32"],
    }


def quoted(path: str) -> str:
    """A path inside a single-quoted SQL string."""
    return path.replace("'", "''")
