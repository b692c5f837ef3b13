"""The records of an NVIDIA profiler database, and checked reads of its tables.

Shared by the two schema readers (``_nvprof``, ``_nsys``); see
``mxprof.trace.nvidia`` for the schemas and what becomes of the records.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import TraceFormatError, TraceReadError

if TYPE_CHECKING:
    import sqlite3

SQLITE_MAGIC = b"SQLite format 3\x00"
# CUpti_ActivityMemcpyKind.
COPY_KINDS = {
    1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA",
    6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP",
}  # fmt: skip


@dataclass
class Call:
    """A CUDA runtime or driver call on a CPU thread (times in ns)."""

    api: str  # "runtime" | "driver"
    name: str
    start: int
    end: int
    pid: int
    tid: int
    correlation_id: int | None


@dataclass
class Range:
    """An NVTX range: opened on (pid, tid), closed on (end_pid, end_tid) or never."""

    name: str
    start: int
    end: int | None
    pid: int
    tid: int
    end_pid: int
    end_tid: int
    domain: str | None = None
    nested: bool = True  # push/pop (thread-nested) rather than start/end


@dataclass
class Mark:
    name: str
    ts: int
    pid: int
    tid: int
    domain: str | None = None


@dataclass
class GpuWork:
    """A kernel, copy or memset on a device's stream."""

    category: str  # cuda_kernel | cuda_memcpy | cuda_memset
    name: str
    start: int
    end: int
    device: int
    stream: int
    pid: int | None  # the process it belongs to, where the database says
    correlation_id: int | None
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Database:
    """What one database holds, in ns on its own axis, before it becomes events."""

    source: str  # "nvprof" | "nsys"
    schema_version: str | None
    base_ns: int | None  # wall-clock ns of t = 0, where known
    origin: int  # subtracted from every time: t - origin is the event's ts in ns
    calls: list[Call] = field(default_factory=list)
    ranges: list[Range] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    work: list[GpuWork] = field(default_factory=list)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    process_names: dict[int, str] = field(default_factory=dict)
    per_process_correlation: bool = False  # nsys: ids repeat across processes
    unmatched_markers: int = 0


def uri_path(path: str) -> str:
    from urllib.parse import quote

    return quote(path.replace(os.sep, "/"), safe="/:")


def check_file(path: str, where: str) -> None:
    """The SQLite header, and the file's size against the size the header records."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise TraceReadError(f"{where}: cannot read: {e.strerror or e}", path, e.errno) from None
    except ValueError as e:
        raise TraceReadError(f"{where}: cannot read: {e}", path, None) from None
    if not header.startswith(SQLITE_MAGIC):
        raise TraceFormatError(
            f"{where}: not an SQLite database (nvprof and Nsight Systems databases begin "
            f"with {SQLITE_MAGIC[:15].decode()!r})"
        )
    if len(header) < 100:
        raise TraceFormatError(f"{where}: cut short: {size} bytes, less than an SQLite header")
    page_size = struct.unpack_from(">H", header, 16)[0]
    page_size = 65536 if page_size == 1 else page_size
    pages, change, valid_for = struct.unpack_from(">I", header, 28)[0], header[24:28], header[92:96]
    # The header's page count is valid only where the two counters agree (SQLite file format 1.3.8).
    if pages and change == valid_for and size < pages * page_size:
        raise TraceFormatError(
            f"{where}: cut short: {size} bytes of the {pages * page_size} its header records"
        )


def _why(error: Exception) -> str:
    """What a failed read says (a MemoryError from SQLite says nothing)."""
    if isinstance(error, MemoryError):
        return "SQLite ran out of memory reading it (a damaged file, or one too big to read here)"
    return str(error)


class Tables:
    """Checked reads of one database's tables: every failure names table and column."""

    def __init__(self, conn: sqlite3.Connection, where: str) -> None:
        import sqlite3

        self.conn = conn
        self.where = where
        # sqlite3's own errors, and what a damaged file makes of its reading
        # (a text cell that is not UTF-8, a value out of Python's ranges;
        # sizes in a damaged schema that SQLite answers with SQLITE_NOMEM,
        # which Python raises as MemoryError: a 7 KB file did so).
        self.error: tuple[type[Exception], ...] = (
            sqlite3.Error,
            ValueError,
            OverflowError,
            MemoryError,
        )
        try:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        except self.error as e:
            raise TraceFormatError(f"{where}: not a readable SQLite database: {_why(e)}") from None
        self.names = {r[0] for r in rows}

    def fail(self, problem: str) -> TraceFormatError:
        return TraceFormatError(f"{self.where}: {problem}")

    def columns(self, table: str) -> list[str]:
        try:
            return [r[1] for r in self.conn.execute(f'PRAGMA table_info("{table}")')]
        except self.error as e:
            raise self.fail(f"cannot read table {table}: {_why(e)}") from None

    def rows(
        self, table: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
    ) -> list[dict[str, Any]]:
        """Every row of table as {column: value}; optional columns are None when absent."""
        have = set(self.columns(table))
        for column in required:
            if column not in have:
                raise self.fail(
                    f"table {table} has no column {column!r} (an unknown schema version?); "
                    f"its columns: {', '.join(sorted(have))}"
                )
        wanted = list(required) + [c for c in optional if c in have]
        listed = ", ".join(f'"{c}"' for c in wanted)
        try:
            raw = self.conn.execute(f'SELECT {listed} FROM "{table}"').fetchall()
        except self.error as e:
            raise self.fail(f"cannot read table {table}: {_why(e)}") from None
        return [{c: v for c, v in zip(wanted, row)} | _absent(optional, have) for row in raw]

    def integer(self, value: object, table: str, column: str, *, null: bool = False) -> Any:
        """value, checked to be an integer (or None where null is allowed)."""
        if value is None and null:
            return None
        if type(value) is not int:
            raise self.fail(f"{table}.{column}: expected an integer, found {value!r}")
        return value

    def strings(self, table: str, id_column: str) -> dict[int, str]:
        if table not in self.names:
            return {}
        out: dict[int, str] = {}
        for row in self.rows(table, (id_column, "value")):
            key = self.integer(row[id_column], table, id_column)
            value = row["value"]
            out[key] = value if isinstance(value, str) else "" if value is None else str(value)
        return out


def _absent(optional: tuple[str, ...], have: set[str]) -> dict[str, Any]:
    return {c: None for c in optional if c not in have}


def string_at(
    tables: Tables, strings: dict[int, str], value: object, table: str, column: str, pool: str
) -> str:
    key = tables.integer(value, table, column)
    try:
        return strings[key]
    except KeyError:
        raise tables.fail(f"{table}.{column}: string id {key} is not in {pool}") from None


def dims(row: dict[str, Any], table: str, tables: Tables) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for kind in ("grid", "block"):
        values = [row.get(f"{kind}{axis}") for axis in "XYZ"]
        if all(v is not None for v in values):
            args[kind] = [tables.integer(v, table, f"{kind}XYZ") for v in values]
    return args


DIM_COLUMNS = tuple(f"{k}{a}" for k in ("grid", "block") for a in "XYZ")


def work_record(
    tables: Tables,
    table: str,
    row: dict[str, Any],
    category: str,
    name: str,
    pid: int | None,
    args: dict[str, Any],
) -> GpuWork:
    return GpuWork(
        category,
        name,
        tables.integer(row["start"], table, "start"),
        tables.integer(row["end"], table, "end"),
        tables.integer(row["deviceId"], table, "deviceId"),
        tables.integer(row["streamId"], table, "streamId"),
        pid,
        tables.integer(row["correlationId"], table, "correlationId", null=True),
        args,
    )


def copy_args(
    tables: Tables, table: str, row: dict[str, Any], kinds: dict[int, str] | None = None
) -> tuple[str, dict[str, Any]]:
    """A copy's or memset's name and args; kinds: the file's own names of copy kinds."""
    size = tables.integer(row["bytes"], table, "bytes")
    if "copyKind" not in row:
        return "Memset", {"bytes": size}
    kind = tables.integer(row["copyKind"], table, "copyKind")
    label = (kinds or COPY_KINDS).get(kind, f"kind {kind}")
    return f"Memcpy {label}", {"bytes": size, "copy_kind": label}
