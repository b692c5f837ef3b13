"""Read an nvprof / nvvp database (the tables apex pyprof's ``nvvp.py`` reads).

See ``mxprof.trace.nvidia`` for the schema.
"""

from __future__ import annotations

import struct

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

# CUpti_ActivityFlag bits of a marker record.
_MARKER_INSTANT, _MARKER_START, _MARKER_END = 1, 2, 4
# nvprof stores calls by callback id only; the common ones by name
# (cupti_runtime_cbid.h, cupti_driver_cbid.h), the rest as "<api> #<cbid>".
_RUNTIME_CBIDS = {
    4: "cudaGetDeviceProperties", 10: "cudaGetLastError", 13: "cudaLaunch",
    16: "cudaSetDevice", 17: "cudaGetDevice", 20: "cudaMalloc", 22: "cudaFree",
    31: "cudaMemcpy", 41: "cudaMemcpyAsync", 49: "cudaMemset", 51: "cudaMemsetAsync",
    131: "cudaStreamSynchronize", 137: "cudaEventSynchronize", 147: "cudaStreamWaitEvent",
    165: "cudaDeviceSynchronize", 211: "cudaLaunchKernel", 214: "cudaLaunchKernel_ptsz",
    269: "cudaLaunchCooperativeKernel",
}  # fmt: skip
_DRIVER_CBIDS = {
    17: "cuCtxSynchronize", 126: "cuStreamSynchronize", 276: "cuMemcpyHtoD_v2",
    278: "cuMemcpyDtoH_v2", 280: "cuMemcpyDtoD_v2", 305: "cuMemcpy", 306: "cuMemcpyAsync",
    307: "cuLaunchKernel", 442: "cuLaunchKernel_ptsz", 514: "cuGraphLaunch",
    652: "cuLaunchKernelEx",
}  # fmt: skip


def read_nvprof(tables: Tables) -> Database:
    strings = tables.strings("StringTable", "_id_")
    db = Database("nvprof", None, None, 0)
    for api, table, names in (
        ("runtime", "CUPTI_ACTIVITY_KIND_RUNTIME", _RUNTIME_CBIDS),
        ("driver", "CUPTI_ACTIVITY_KIND_DRIVER", _DRIVER_CBIDS),
    ):
        if table not in tables.names:
            continue
        cols = ("cbid", "start", "end", "processId", "threadId", "correlationId")
        for row in tables.rows(table, cols):
            cbid = tables.integer(row["cbid"], table, "cbid")
            db.calls.append(
                Call(
                    api,
                    names.get(cbid, f"cuda {api} call #{cbid}"),
                    tables.integer(row["start"], table, "start"),
                    tables.integer(row["end"], table, "end"),
                    tables.integer(row["processId"], table, "processId"),
                    tables.integer(row["threadId"], table, "threadId") & 0xFFFFFFFF,
                    tables.integer(row["correlationId"], table, "correlationId", null=True),
                )
            )
    for table in ("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", "CUPTI_ACTIVITY_KIND_KERNEL"):
        if table not in tables.names:
            continue
        cols = ("name", "start", "end", "deviceId", "streamId", "correlationId")
        rows = tables.rows(table, cols, DIM_COLUMNS)
        for row in rows:
            name = string_at(tables, strings, row["name"], table, "name", "StringTable")
            db.work.append(
                work_record(tables, table, row, "cuda_kernel", name, None, dims(row, table, tables))
            )
        if rows:
            break  # nvprof writes one of the two; pyprof reads the concurrent one
    _nvprof_copies(tables, db)
    if "CUPTI_ACTIVITY_KIND_MARKER" in tables.names:
        _nvprof_markers(tables, strings, db)
    times = [c.start for c in db.calls] + [w.start for w in db.work]
    times += [r.start for r in db.ranges] + [m.ts for m in db.marks]
    db.origin = min(times, default=0)
    # CUPTI timestamps are ns since the epoch on Linux; smaller ones are no wall clock.
    db.base_ns = db.origin if db.origin >= 10**18 else None
    return db


def _nvprof_copies(tables: Tables, db: Database) -> None:
    base = ("start", "end", "deviceId", "streamId", "correlationId", "bytes")
    for table, category, cols in (
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "cuda_memcpy", (*base, "copyKind")),
        ("CUPTI_ACTIVITY_KIND_MEMSET", "cuda_memset", base),
    ):
        if table in tables.names:
            for row in tables.rows(table, cols):
                name, args = copy_args(tables, table, row)
                db.work.append(work_record(tables, table, row, category, name, None, args))


def _object_thread(tables: Tables, value: object) -> tuple[int, int]:
    """(pid, tid) from a marker's objectId: pid as 4 little-endian bytes, tid as 8."""
    if not isinstance(value, bytes) or len(value) < 12:
        raise tables.fail(
            f"CUPTI_ACTIVITY_KIND_MARKER.objectId: expected 12 bytes (pid, tid), found {value!r}"
        )
    pid, tid = struct.unpack_from("<iq", value)
    return pid, tid & 0xFFFFFFFF


def _nvprof_markers(tables: Tables, strings: dict[int, str], db: Database) -> None:
    table = "CUPTI_ACTIVITY_KIND_MARKER"
    rows = tables.rows(table, ("flags", "timestamp", "id", "objectId", "name"), ("_id_",))
    rows.sort(key=lambda r: (tables.integer(r["timestamp"], table, "timestamp"), r["_id_"] or 0))
    open_ranges: dict[int, Range] = {}
    for row in rows:
        flags = tables.integer(row["flags"], table, "flags")
        ts = row["timestamp"]
        pid, tid = _object_thread(tables, row["objectId"])
        marker = tables.integer(row["id"], table, "id")
        if flags & _MARKER_START:
            name = string_at(tables, strings, row["name"], table, "name", "StringTable")
            opened = Range(name, ts, None, pid, tid, pid, tid)
            open_ranges[marker] = opened
            db.ranges.append(opened)
        elif flags & _MARKER_END:
            begun = open_ranges.pop(marker, None)
            if begun is None:
                db.unmatched_markers += 1
                continue
            begun.end, begun.end_pid, begun.end_tid = ts, pid, tid
            begun.nested = (pid, tid) == (begun.pid, begun.tid)
        elif flags & _MARKER_INSTANT:
            name = string_at(tables, strings, row["name"], table, "name", "StringTable")
            db.marks.append(Mark(name, ts, pid, tid))
