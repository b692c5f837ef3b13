"""Read an Nsight Systems SQLite export (``nsys export --type sqlite``).

See ``mxprof.trace.nvidia`` for the schema.
"""

from __future__ import annotations

from typing import Any

from ._nvidia_db import (
    DIM_COLUMNS,
    Call,
    Database,
    Mark,
    Range,
    Tables,
    copy_args,
    dims,
    string_at,
    work_record,
)

# Export schema majors this reader knows; a later major is a breaking change.
NSYS_SCHEMA_MAJORS = (1, 2, 3)
_NSYS_MARK = 34
_NSYS_PUSH_POP = (59, 70)
_NSYS_START_END = (60, 71)
_NSYS_DOMAIN_CREATE = 75


def _split_tid(tables: Tables, value: object, table: str, column: str) -> tuple[int, int]:
    """(pid, tid) of a serialized globalTid/globalPid."""
    serial = tables.integer(value, table, column)
    return (serial >> 24) & 0xFFFFFF, serial & 0xFFFFFF


def _process(tables: Tables, value: object, table: str) -> int | None:
    """The pid of a GPU record's globalPid (None where the export leaves it empty)."""
    if value is None:
        return None
    return _split_tid(tables, value, table, "globalPid")[0]


def _copy_kinds(tables: Tables) -> dict[int, str] | None:
    """The export's own names of copy kinds (ENUM_CUDA_MEMCPY_OPER), where it has them."""
    table = "ENUM_CUDA_MEMCPY_OPER"
    if table not in tables.names or not {"id", "label"} <= set(tables.columns(table)):
        return None
    return {
        tables.integer(r["id"], table, "id"): str(r["label"])
        for r in tables.rows(table, ("id", "label"))
    }


def _nsys_version(tables: Tables) -> str | None:
    if "META_DATA_EXPORT" not in tables.names:
        return None
    rows = tables.rows("META_DATA_EXPORT", ("name", "value"))
    version = next((r["value"] for r in rows if r["name"] == "EXPORT_SCHEMA_VERSION"), None)
    if version is None:
        return None
    text = str(version)
    head = text.split(".", 1)[0]
    if not head.isdigit() or int(head) not in NSYS_SCHEMA_MAJORS:
        known = ", ".join(f"{m}.x" for m in NSYS_SCHEMA_MAJORS)
        raise tables.fail(
            f"META_DATA_EXPORT.value: export schema version {text!r} is not one this reader "
            f"knows ({known}); export the report with a supported Nsight Systems version"
        )
    return text


def read_nsys(tables: Tables) -> Database:
    version = _nsys_version(tables)
    strings = tables.strings("StringIds", "id")
    db = Database("nsys", version, None, 0, per_process_correlation=True)

    def text(row: dict[str, Any], table: str, column: str) -> str:
        return string_at(tables, strings, row[column], table, column, "StringIds")

    for api, table in (
        ("runtime", "CUPTI_ACTIVITY_KIND_RUNTIME"),
        ("driver", "CUPTI_ACTIVITY_KIND_DRIVER"),
    ):
        if table not in tables.names:
            continue
        for row in tables.rows(table, ("start", "end", "globalTid", "correlationId", "nameId")):
            pid, tid = _split_tid(tables, row["globalTid"], table, "globalTid")
            db.calls.append(
                Call(
                    api,
                    text(row, table, "nameId"),
                    tables.integer(row["start"], table, "start"),
                    tables.integer(row["end"], table, "end"),
                    pid,
                    tid,
                    tables.integer(row["correlationId"], table, "correlationId", null=True),
                )
            )
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    if table in tables.names:
        cols = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid")
        have = set(tables.columns(table))
        name_column = "demangledName" if "demangledName" in have else "shortName"
        for row in tables.rows(table, (*cols, name_column), ("shortName", *DIM_COLUMNS)):
            owner = _process(tables, row["globalPid"], table)
            args = dims(row, table, tables)
            if name_column != "shortName" and row["shortName"] is not None:
                args["short_name"] = text(row, table, "shortName")
            name = text(row, table, name_column)
            db.work.append(work_record(tables, table, row, "cuda_kernel", name, owner, args))
    kinds = _copy_kinds(tables)
    base = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes")
    for table, category, copy_cols in (
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "cuda_memcpy", (*base, "copyKind")),
        ("CUPTI_ACTIVITY_KIND_MEMSET", "cuda_memset", base),
    ):
        if table in tables.names:
            for row in tables.rows(table, copy_cols):
                owner = _process(tables, row["globalPid"], table)
                name, args = copy_args(tables, table, row, kinds)
                db.work.append(work_record(tables, table, row, category, name, owner, args))
    if "NVTX_EVENTS" in tables.names:
        _nsys_nvtx(tables, strings, db)
    if "ThreadNames" in tables.names:
        for row in tables.rows("ThreadNames", ("nameId", "globalTid")):
            key = _split_tid(tables, row["globalTid"], "ThreadNames", "globalTid")
            db.thread_names[key] = text(row, "ThreadNames", "nameId")
    if "PROCESSES" in tables.names:
        for row in tables.rows("PROCESSES", ("pid", "name")):
            if isinstance(row["name"], str) and row["name"]:
                db.process_names[tables.integer(row["pid"], "PROCESSES", "pid")] = row["name"]
    table = "TARGET_INFO_SESSION_START_TIME"
    if table in tables.names:
        found = tables.rows(table, ("utcEpochNs",))
        if found:
            db.base_ns = tables.integer(found[0]["utcEpochNs"], table, "utcEpochNs")
    return db


def _nsys_nvtx(tables: Tables, strings: dict[int, str], db: Database) -> None:
    table = "NVTX_EVENTS"
    rows = tables.rows(
        table,
        ("start", "end", "eventType", "globalTid"),
        ("text", "textId", "endGlobalTid", "domainId"),
    )
    domains: dict[int, str] = {}
    for row in rows:
        if row["eventType"] == _NSYS_DOMAIN_CREATE and row["domainId"] is not None:
            domains[row["domainId"]] = _nvtx_text(tables, strings, row) or ""
    for row in rows:
        kind = tables.integer(row["eventType"], table, "eventType")
        if kind not in (_NSYS_MARK, *_NSYS_PUSH_POP, *_NSYS_START_END):
            continue
        start = tables.integer(row["start"], table, "start")
        pid, tid = _split_tid(tables, row["globalTid"], table, "globalTid")
        name = _nvtx_text(tables, strings, row) or "(unnamed)"
        domain = domains.get(row["domainId"]) if row["domainId"] else None
        if kind == _NSYS_MARK:
            db.marks.append(Mark(name, start, pid, tid, domain))
            continue
        end = tables.integer(row["end"], table, "end", null=True)
        end_pid, end_tid = pid, tid
        if row["endGlobalTid"] is not None:
            end_pid, end_tid = _split_tid(tables, row["endGlobalTid"], table, "endGlobalTid")
        nested = kind in _NSYS_PUSH_POP
        db.ranges.append(Range(name, start, end, pid, tid, end_pid, end_tid, domain, nested))


def _nvtx_text(tables: Tables, strings: dict[int, str], row: dict[str, Any]) -> str | None:
    if row["textId"] is not None:
        return string_at(tables, strings, row["textId"], "NVTX_EVENTS", "textId", "StringIds")
    value = row["text"]
    return value if isinstance(value, str) else None
