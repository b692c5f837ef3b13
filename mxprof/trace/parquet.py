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
written to temporary Parquet row groups as they come.  The final tables are
written from those, row group by row group: ``depth`` in one backwards pass
(a thread's ranges come in the order they ended, so backwards a parent comes
before its children and a stack of starts per thread is all it takes; a
thread in another order, as other tools write, gets its depths from DuckDB
under a memory limit instead), ``step`` by a sorted lookup in its process's
steps (the one thing held whole: three integers per step).

Needs pyarrow and duckdb: ``pip install "mxprof[sql]"``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from array import array
from collections.abc import Sequence
from typing import Any

import msgspec

from .._version import __version__
from ..errors import OutputError, ProfilerError, TraceFormatError
from . import _scan
from ._convert import Converter
from ._event import Event
from .merge import timeline
from .model import read_lines
from .processes import SCOPE_STORAGE, identities_of
from .reader import PathArg, open_trace, read_raw, shown
from .steps import chosen, number
from .steps import group as steps_group

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


def write_parquet(paths: Sequence[PathArg], output: PathArg) -> dict[str, Any]:
    """Write the traces' events as Parquet tables into the folder output; return
    its manifest (``{"tables": {name: rows}, "sources": [...], ...}``).

    The folder is written whole or not at all (built beside it, then renamed);
    an existing folder is replaced only when it holds such tables already.

    Args:
        paths: traces (any form ``mxprof.load`` reads), placed on one clock as
            ``mxprof merge`` places them.
        output: the folder to write.

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
        manifest = _convert(paths, work, pa, pq, duckdb)
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


def _convert(paths: Sequence[PathArg], work: str, pa: Any, pq: Any, duckdb: Any) -> dict[str, Any]:
    listed = sources(paths)
    names = [os.fspath(p) for p in paths]
    metadata = [_metadata(n) for n in names]
    mapping = timeline(list(zip(names, metadata)))
    raw = os.path.join(work, ".raw")
    os.mkdir(raw)
    rows = _Rows(pa, pq, raw)
    try:
        for k, (name, meta, (info, move)) in enumerate(zip(names, metadata, mapping)):
            rows.add_input(k, name, meta, info, move)
    finally:
        rows.close()
    counts = _finish(pa, pq, duckdb, work, raw, rows)
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

_COMMON = [
    ("utid", "int64"),
    ("upid", "int64"),
    ("pid", "int64"),
    ("tid", "int64"),
    ("scope", "string"),
]


class _Rows:
    """The temporary tables: events buffered, then written as row groups."""

    def __init__(self, pa: Any, pq: Any, folder: str) -> None:
        self.pa, self.pq, self.folder = pa, pq, folder
        self.buffer: list[Event] = []
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
        string, i64, f64 = pa.string(), pa.int64(), pa.float64()
        job = [("file", string)]  # rank, role and host are added at the end (_Extra)
        common = [(n, getattr(pa, t)()) for n, t in _COMMON]
        self.schemas = {
            "slice": pa.schema(
                [("ts", i64), ("dur", i64), ("name", string), ("category", string)]
                + common
                + [("args", string), ("step_number", i64)]
                + job
            ),
            "counter": pa.schema(
                [("ts", i64), ("name", string), ("category", string), ("value", f64)] + common + job
            ),
            "instant": pa.schema(
                [("ts", i64), ("name", string), ("category", string)]
                + common
                + [("args", string)]
                + job
            ),
        }
        self.writers = {
            # Temporary: the cheapest compression to write (zstd for the final files).
            t: pq.ParquetWriter(os.path.join(folder, f"{t}.parquet"), s, compression="snappy")
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
        sink = _Sink(self.buffer)
        before = dict(self.counts)
        try:
            converted, _ = read_lines(path, lambda key: sink, self._flush_if_full)
        except _scan.NotLines:
            # Not in mxprof's shape after all (damage found on the way): read
            # whole, the general way, which names what is wrong.  What was
            # buffered goes; rows already written cannot be taken back.
            self.buffer.clear()
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
        if len(self.buffer) >= _ROWS:
            self._flush()

    def _flush(self) -> None:
        events = self.buffer
        if not events:
            return
        ranges = [e for e in events if e.ph == "X"]
        counters = [e for e in events if e.ph == "C"]
        instants = [e for e in events if e.ph != "X" and e.ph != "C"]
        events.clear()  # the sink's list: emptied in place
        if ranges:
            self._write_slices(ranges)
        if counters:
            self._write_counters(counters)
        if instants:
            self._write_instants(instants)

    def _times(self, events: list[Event]) -> tuple[list[int], list[int] | None]:
        """Starts and ends on the merged axis (ends: of ranges only)."""
        shift, move = self.shift, self.move
        if shift is not None:
            starts = [e.ts + shift for e in events]
            ends = [e.ts + (e.dur or 0) + shift for e in events] if events[0].ph == "X" else None
        else:
            starts = [move(e.ts) for e in events]
            ends = [move(e.ts + (e.dur or 0)) for e in events] if events[0].ph == "X" else None
        return starts, ends

    def _thread_columns(self, events: list[Event]) -> dict[str, Any]:
        """The thread and job columns: one lookup per event, the rest taken by
        pyarrow from one row per thread."""
        pa = self.pa
        index: dict[tuple[Any, Any], int] = {}
        rows = [index.setdefault((e.pid, e.tid), len(index)) for e in events]
        keys = list(index)
        per_thread = {
            "utid": pa.array([self._utid(p, t) for p, t in keys], pa.int64()),
            "upid": pa.array([self._upid(p) for p, _ in keys], pa.int64()),
            "pid": pa.array([_int(p) for p, _ in keys], pa.int64()),
            "tid": pa.array([_int(t) for _, t in keys], pa.int64()),
            "file": pa.array([self.file] * len(keys), pa.string()),
        }
        take = pa.array(rows, pa.int32())
        return {name: column.take(take) for name, column in per_thread.items()}

    def _write(self, table: str, columns: dict[str, list[Any]]) -> None:
        schema = self.schemas[table]
        batch = self.pa.table(
            {
                f.name: c
                if isinstance(c := columns[f.name], self.pa.Array)
                else self.pa.array(c, f.type)
                for f in schema
            }
        )
        self.writers[table].write_table(batch, row_group_size=_ROWS)
        self.counts[table] += batch.num_rows

    def _write_slices(self, events: list[Event]) -> None:
        starts, ends = self._times(events)
        assert ends is not None
        columns = self._thread_columns(events)
        columns["ts"] = starts
        if self.shift is not None:  # both ends moved by the same shift
            columns["dur"] = [e.dur for e in events]
        else:
            columns["dur"] = [b - a for a, b in zip(starts, ends)]
        columns["name"] = [e.name for e in events]
        columns["category"] = [e.category for e in events]
        columns["args"] = [_ENCODE(e.args).decode() if e.args else None for e in events]
        columns["scope"] = [_scope(e.args) if e.args else None for e in events]
        # Steps by their group, looked at once per distinct name and category.
        groups = {key: steps_group(*key) for key in {(e.name, e.category) for e in events}}
        numbers = [None if groups[e.name, e.category] is None else self._step(e) for e in events]
        columns["step_number"] = numbers
        for i in [i for i, n in enumerate(numbers) if n is not None]:
            e = events[i]
            group = groups[e.name, e.category]
            assert group is not None
            found = self.step_ranges.setdefault(
                (self._upid(e.pid), e.tid, *group), (array("q"), array("q"), array("q"))
            )
            found[0].append(starts[i])
            found[1].append(ends[i])
            found[2].append(numbers[i])  # type: ignore[arg-type]
        self._write("slice", columns)

    def _step(self, e: Event) -> int:
        """A step's number (``steps.number``), its order counted per thread and name."""
        key = (self.k, e.pid, e.tid, e.name)
        n = self.order.get(key, 0)
        self.order[key] = n + 1
        return number(e.name, e.args, n)

    def _write_counters(self, events: list[Event]) -> None:
        series: list[tuple[Event, str, float]] = []
        for e in events:
            values = [(k, v) for k, v in e.args.items() if _number(v)]
            for key, value in values:
                name = e.name if key == e.name or len(values) == 1 else f"{e.name} {key}"
                series.append((e, name, float(value)))
        if not series:
            return
        kept = [e for e, _, _ in series]
        starts, _ = self._times(kept)
        columns = self._thread_columns(kept)
        columns["ts"] = starts
        columns["name"] = [n for _, n, _ in series]
        columns["category"] = [e.category for e in kept]
        columns["value"] = [v for _, _, v in series]
        columns["scope"] = [e.name if e.category == SCOPE_STORAGE else _scope(e.args) for e in kept]
        self._write("counter", columns)

    def _write_instants(self, events: list[Event]) -> None:
        starts, _ = self._times(events)
        columns = self._thread_columns(events)
        columns["ts"] = starts
        columns["name"] = [e.name for e in events]
        columns["category"] = [e.category for e in events]
        columns["args"] = [_ENCODE(e.args).decode() if e.args else None for e in events]
        columns["scope"] = [_scope(e.args) for e in events]
        self._write("instant", columns)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        pa, pq = self.pa, self.pq
        i64, string = pa.int64(), pa.string()
        job = [("rank", i64), ("role", string), ("host", string), ("file", string)]
        thread = pa.schema(
            [("utid", i64), ("upid", i64), ("tid", i64), ("pid", i64), ("name", string)] + job
        )
        process = pa.schema([("upid", i64), ("pid", i64), ("name", string)] + job)
        pq.write_table(
            pa.Table.from_pylist(self.threads, thread), os.path.join(self.folder, "thread.parquet")
        )
        pq.write_table(
            pa.Table.from_pylist(self.processes, process),
            os.path.join(self.folder, "process.parquet"),
        )


class _Sink:
    """Every thread's events into one list: ``append`` is the list's own (C speed)."""

    __slots__ = ("append",)

    def __init__(self, buffer: list[Event]) -> None:
        self.append = buffer.append


def _int(value: Any) -> int | None:
    return value if type(value) is int and -(2**63) <= value < 2**63 else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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


def _finish(pa: Any, pq: Any, duckdb: Any, work: str, raw: str, rows: _Rows) -> dict[str, int]:
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
    names: list[str | None] = [None] * len(rows.utids)
    for t in rows.threads:
        names[t["utid"]] = t["name"]
    thread_names = pa.array(names, pa.string())
    who = [rows.who[upid] for upid in range(len(rows.upids))]
    job = (
        pa.array([w[0] for w in who], pa.int64()),
        pa.array([w[1] for w in who], pa.string()),
        pa.array([w[2] for w in who], pa.string()),
    )
    extra = _Extra(pa, np, steps, thread_names, job)
    try:
        _write_slices(pa, pq, work, raw, extra, depths=None)
    except _Unordered:
        shutil.rmtree(os.path.join(work, "slice"), ignore_errors=True)
        _write_slices(pa, pq, work, raw, extra, depths=_duckdb_depths(duckdb, raw))
    for table in ("counter", "instant"):
        source = pq.ParquetFile(os.path.join(raw, f"{table}.parquet"))
        with _Partitions(pq, os.path.join(work, table)) as out:
            for k in range(source.num_row_groups):
                out.write(extra.add(source.read_row_group(k)))
            out.finish(extra.add(source.schema_arrow.empty_table()))
    for table in ("thread", "process"):
        os.replace(os.path.join(raw, f"{table}.parquet"), os.path.join(work, f"{table}.parquet"))
    counts = dict(rows.counts)
    counts["thread"] = len(rows.threads)
    counts["process"] = len(rows.processes)
    return counts


def _chosen(rows: _Rows) -> dict[int, tuple[int, Any, str, str]]:
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
    """The columns added to every table: the thread's name, the step, and the
    process's rank, role and host (``job``: three arrays by upid)."""

    def __init__(
        self, pa: Any, np: Any, steps: dict[int, Any], thread_names: Any, job: tuple[Any, ...]
    ) -> None:
        self.pa, self.np, self.steps, self.thread_names = pa, np, steps, thread_names
        self.job = job

    def step(self, upids: Any, ts: Any) -> Any:
        """The step of each (process, instant): the latest of the process's steps
        that began at or before it, if it has not ended (a step's own start
        counts, for zero-length steps too)."""
        np = self.np
        out = np.zeros(len(ts), dtype=np.int64)
        found = np.zeros(len(ts), dtype=bool)
        for upid in np.unique(upids):
            got = self.steps.get(int(upid))
            if got is None:
                continue
            starts, ends, numbers = got
            sel = upids == upid
            at = ts[sel]
            k = np.searchsorted(starts, at, side="right") - 1
            before = k >= 0
            k = np.where(before, k, 0)
            inside = before & ((at < ends[k]) | (at == starts[k]))
            out[sel] = numbers[k]
            found[sel] = inside
        return self.pa.array(out, self.pa.int64(), mask=~found)

    def add(self, table: Any, depth: Any = None) -> Any:
        """table with ``depth`` (slices), ``thread`` and ``step``, in the final order."""
        pa = self.pa
        utids = table.column("utid").to_numpy()
        upids = table.column("upid").to_numpy()
        ts = table.column("ts").to_numpy()
        thread = self.thread_names.take(pa.array(utids, pa.int64()))
        step = self.step(upids, ts)
        names = table.column_names
        if depth is not None:
            table = table.append_column("depth", pa.array(depth, pa.int32()))
        table = table.append_column("thread", thread).append_column("step", step)
        at = pa.array(upids, pa.int64())
        for name, column in zip(("rank", "role", "host"), self.job):
            table = table.append_column(name, column.take(at))
        order = [n for n in _ORDER if n in table.column_names or n == "rank"]
        assert set(order) >= set(names)
        return table.select([n for n in order if n in table.column_names])


# The final columns, in this order (those a table has); rank goes in the path.
_ORDER = (
    "ts", "dur", "name", "category", "value", "depth", "thread", "utid", "upid", "pid", "tid",
    "args", "step_number", "step", "scope", "rank", "role", "host", "file",
)  # fmt: skip


def _write_slices(pa: Any, pq: Any, work: str, raw: str, extra: _Extra, depths: Any | None) -> None:
    """The slice table, depth from the reverse pass (depths None) or given by row."""
    source = pq.ParquetFile(os.path.join(raw, "slice.parquet"))
    groups = [source.metadata.row_group(k).num_rows for k in range(source.num_row_groups)]
    offsets = [sum(groups[:k]) for k in range(len(groups))]
    stacks: dict[int, list[int]] = {}
    last_end: dict[int, int] = {}
    with _Partitions(pq, os.path.join(work, "slice")) as out:
        for k in reversed(range(source.num_row_groups)):
            group = source.read_row_group(k)
            if depths is not None:
                out.write(extra.add(group, depths[offsets[k] : offsets[k] + groups[k]]))
                continue
            backwards = group.take(pa.array(range(group.num_rows - 1, -1, -1), pa.int64()))
            utids = backwards.column("utid").to_pylist()
            ts = backwards.column("ts").to_pylist()
            durs = backwards.column("dur").to_pylist()
            out.write(extra.add(backwards, _depths(utids, ts, durs, stacks, last_end)))
        out.finish(extra.add(source.schema_arrow.empty_table(), []))


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


def _duckdb_depths(duckdb: Any, raw: str) -> Any:
    """Depth of every slice, in the temporary table's row order, by DuckDB."""
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
    """One Parquet file per rank under folder (``rank=R/data.parquet``)."""

    def __init__(self, pq: Any, folder: str) -> None:
        self.pq, self.folder = pq, folder
        self.writers: dict[int, Any] = {}

    def __enter__(self) -> _Partitions:
        os.makedirs(self.folder, exist_ok=True)
        return self

    def write(self, table: Any) -> None:
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        ranks = table.column("rank")
        for rank in pc.unique(ranks).to_pylist():
            part = table.filter(pc.equal(ranks, rank)).drop_columns(["rank"])
            writer = self.writers.get(rank)
            if writer is None:
                folder = os.path.join(self.folder, f"rank={rank}")
                os.makedirs(folder, exist_ok=True)
                writer = self.writers[rank] = self.pq.ParquetWriter(
                    os.path.join(folder, "data.parquet"), part.schema, compression="zstd"
                )
            writer.write_table(part, row_group_size=_ROWS)

    def finish(self, empty: Any) -> None:
        """An empty table still has its columns: one empty file where none was written."""
        if not self.writers:
            folder = os.path.join(self.folder, "rank=0")
            os.makedirs(folder, exist_ok=True)
            self.pq.write_table(empty.drop_columns(["rank"]), os.path.join(folder, "data.parquet"))

    def __exit__(self, *exc: object) -> None:
        for writer in self.writers.values():
            writer.close()


def quoted(path: str) -> str:
    """A path inside a single-quoted SQL string."""
    return path.replace("'", "''")
