"""Read NVIDIA profiler databases: nvprof/nvvp SQLite files and Nsight Systems SQLite exports.

``read_raw(path)`` turns either database into the Chrome trace events the rest
of ``mxprof.trace`` reads, so ``mxprof.load``, ``mxprof stats``, ``mxprof merge``
and ``mxprof report`` take them like any trace:

- kernels, memory copies and memsets on one track per GPU and stream (a
  process ``GPU <device>`` whose threads are ``stream <id>``), categories
  ``cuda_kernel``, ``cuda_memcpy``, ``cuda_memset``;
- CUDA runtime and driver calls (``cuda_runtime``, ``cuda_driver``) and NVTX
  ranges and marks (``nvtx``) on the CPU thread that made them (real pid and
  OS tid);
- a flow arrow (``s``/``f``, category ``cuda_flow``) from each launching call
  to the GPU work it caused;
- every GPU event's ``args``: ``correlation_id``; ``launch`` (the call's name)
  when the launching call is in the database; ``range`` (the innermost NVTX
  range open on the launching thread around the call) and ``ranges`` (every
  enclosing range, outermost first), both absent when no range encloses it.

Ranges are tied to GPU work the way apex pyprof's ``parse/nvvp.py`` does it: a
GPU record's ``correlationId`` finds its runtime (else driver) call; a range
encloses the call when it was opened on the call's thread strictly before the
call began and closed strictly after it ended; the innermost is the one
opened last.  A range opened on one thread and closed on another belongs to
the thread that opened it (pyprof joins the end marker to the start marker by
``id`` and keeps the start's ``objectId``); a range never closed stays open
to the end of the capture.

Schemas, as read here (column names checked against NVIDIA's documentation):

nvprof / nvvp (the tables apex pyprof's ``nvvp.py`` queries; CUPTI activity
record fields, https://docs.nvidia.com/cupti/ ``CUpti_ActivityKernel*``,
``CUpti_ActivityAPI``, ``CUpti_ActivityMemcpy``, ``CUpti_ActivityMarker2``):
  ``StringTable(_id_, value)``;
  ``CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`` / ``CUPTI_ACTIVITY_KIND_KERNEL``
  ``(name -> StringTable, start, end, deviceId, contextId, streamId,
  correlationId, gridX..Z, blockX..Z)``;
  ``CUPTI_ACTIVITY_KIND_RUNTIME`` / ``_DRIVER`` ``(cbid, start, end,
  processId, threadId, correlationId)`` (threadId compared as unsigned 32
  bits, as pyprof does);
  ``CUPTI_ACTIVITY_KIND_MEMCPY(copyKind, bytes, start, end, deviceId,
  streamId, correlationId)``, ``CUPTI_ACTIVITY_KIND_MEMSET(bytes, ...)``;
  ``CUPTI_ACTIVITY_KIND_MARKER(flags, timestamp, id, objectId, name)``:
  flags 1 instantaneous, 2 start, 4 end (CUpti_ActivityFlag); start and end
  share ``id``; ``objectId`` is the process id as 4 little-endian bytes then
  the thread id as 8.  Times are CUPTI ns timestamps; ts 0 is the earliest.

Nsight Systems (``nsys export --type sqlite``; "SQLite Export Schema
Reference", https://docs.nvidia.com/nsight-systems/UserGuide/index.html
#exporter-sqlite-schema, and the export's ``export_schema_version_notes.txt``):
  ``StringIds(id, value)``;
  ``CUPTI_ACTIVITY_KIND_KERNEL(start, end, deviceId, streamId,
  correlationId, globalPid, demangledName / shortName -> StringIds, grid*,
  block*)``;
  ``CUPTI_ACTIVITY_KIND_RUNTIME(start, end, globalTid, correlationId,
  nameId -> StringIds)`` (``_DRIVER`` likewise when present);
  ``CUPTI_ACTIVITY_KIND_MEMCPY(start, end, deviceId, streamId,
  correlationId, globalPid, bytes, copyKind)`` (copyKind named by
  ``ENUM_CUDA_MEMCPY_OPER(id, label)`` where the export has it, else by
  CUpti_ActivityMemcpyKind), ``..._MEMSET(..., bytes)``;
  ``NVTX_EVENTS(start, end, eventType, text, textId -> StringIds,
  globalTid, endGlobalTid, domainId)`` with eventType 34 mark, 59
  push/pop range, 60 start/end range, 75 domain create (and 70/71 for the
  NVTXT forms);
  ``ThreadNames(nameId, globalTid)``, ``PROCESSES(pid, name)``,
  ``TARGET_INFO_SESSION_START_TIME(utcEpochNs)``,
  ``META_DATA_EXPORT(name, value)`` with ``EXPORT_SCHEMA_VERSION``
  ("major.minor.micro"; majors 1-3 are read, a later major is refused).
  A serialized globalTid holds the pid in bits 24-47 and the tid in bits
  0-23; correlation ids are unique per process, so calls and GPU records
  are joined on (process, correlationId) (on correlationId alone for a GPU
  record whose globalPid is empty).

Bad input -- a database of neither kind, a file cut short, an unknown schema
version, a missing column, a string id that does not resolve, a value of
the wrong type -- raises ``TraceFormatError`` naming the file, the table and
the column.

Example:
    >>> import mxprof
    >>> trace = mxprof.load("run.sqlite")  # doctest: +SKIP
    >>> kernel = trace.filter(category="cuda_kernel")[0]  # doctest: +SKIP
    >>> kernel.args["range"], kernel.args["correlation_id"]  # doctest: +SKIP
    ('forward', 1234)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..errors import TraceFormatError
from ._nsys import NSYS_SCHEMA_MAJORS, read_nsys
from ._nvidia_db import COPY_KINDS, SQLITE_MAGIC, Database, Tables, check_file, uri_path
from ._nvidia_events import GPU_PID_BASE, build_events
from ._nvprof import read_nvprof

if TYPE_CHECKING:
    from .model import Trace
    from .reader import PathArg, RawEvent

__all__ = [
    "COPY_KINDS", "GPU_PID_BASE", "NSYS_SCHEMA_MAJORS", "SQLITE_MAGIC", "is_database", "load",
    "read_database", "read_raw",
]  # fmt: skip


def is_database(path: PathArg) -> bool:
    """Whether path is an SQLite file (by its first 16 bytes) or is named ``*.sqlite``.

    False when it cannot be read: the caller's own reading then says why.

    Example:
        >>> is_database("trace.json")  # doctest: +SKIP
        False
    """
    name = os.fspath(path)
    if name.lower().endswith(".sqlite"):
        return True
    try:
        with open(name, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except (OSError, ValueError):
        return False


def read_raw(path: PathArg) -> tuple[list[RawEvent], dict[str, Any], bool]:
    """``mxprof.trace.read_raw`` for an NVIDIA database: (events, metadata, False).

    Raises:
        TraceReadError: the path cannot be read.
        TraceFormatError: not a database of either kind, or a damaged one;
            the message names the file, table and column.

    Example:
        >>> events, metadata, _ = read_raw("run.sqlite")  # doctest: +SKIP
        >>> metadata["otherData"]["nvidia"]["source"]  # doctest: +SKIP
        'nsys'
    """
    db = read_database(path)
    events = build_events(db)
    counts: dict[str, int] = {}
    for work in db.work:
        counts[work.category] = counts.get(work.category, 0) + 1
    info = {
        "source": db.source,
        "schema_version": db.schema_version,
        "kernels": counts.get("cuda_kernel", 0),
        "copies": counts.get("cuda_memcpy", 0),
        "memsets": counts.get("cuda_memset", 0),
        "unmatched_markers": db.unmatched_markers,
    }
    metadata: dict[str, Any] = {
        "displayTimeUnit": "ms",
        "otherData": {"imported_by": f"mxprof {__version__}", "nvidia": info},
    }
    if db.base_ns is not None:
        metadata["baseTimeNanoseconds"] = db.base_ns
    return events, metadata, False


def load(path: PathArg) -> Trace:
    """An NVIDIA database as a ``Trace`` (what ``mxprof.load`` gives for one).

    Example:
        >>> load("run.sqlite").filter(category="cuda_kernel")  # doctest: +SKIP
    """
    from .model import Trace

    events, metadata, truncated = read_raw(path)
    return Trace.from_raw(events, metadata=metadata, truncated=truncated, path=os.fspath(path))


def read_database(path: PathArg) -> Database:
    """Read either schema into a ``Database``; see the module docstring."""
    from .reader import shown

    name = os.fspath(path)
    where = shown(name)
    try:
        import sqlite3
    except ImportError:  # a Python built without it
        raise TraceFormatError(
            f"{where}: reading NVIDIA databases needs Python's sqlite3 module"
        ) from None
    check_file(name, where)
    uri = "file:" + uri_path(os.path.abspath(name)) + "?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        # Names that are not valid UTF-8 are shown with U+FFFD, not refused.
        conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
    except sqlite3.Error as e:
        raise TraceFormatError(f"{where}: cannot open as SQLite: {e}") from None
    try:
        tables = Tables(conn, where)
        names = tables.names
        if "StringIds" in names and (
            "NVTX_EVENTS" in names or any(n.startswith("CUPTI_ACTIVITY_KIND_") for n in names)
        ):
            return read_nsys(tables)
        if "StringTable" in names and any(n.startswith("CUPTI_ACTIVITY_KIND_") for n in names):
            return read_nvprof(tables)
        listed = ", ".join(sorted(names)[:8]) or "none"
        raise TraceFormatError(
            f"{where}: an SQLite database, but neither an nvprof/nvvp database (StringTable "
            f"and CUPTI_ACTIVITY_KIND_* tables) nor an Nsight Systems export (StringIds with "
            f"CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS); its tables: {listed}"
        )
    finally:
        conn.close()
