"""SQLite files in nvprof's and Nsight Systems' schemas, with known contents.

Both hold the same run (times in ns from the capture's start, T0 on the wall
clock): process 4242, its main thread 100 and a loader thread 200; NVTX ranges
step > forward > attention and step > backward on the main thread; prefetch
opened on the loader and closed on the main thread; tail opened on the loader
and never closed; CUDA calls, and the kernels, copy and memset they launched.
EXPECTED says, for each unit of GPU work, the ranges that enclose its launch.
"""

import sqlite3
import struct

T0 = 1_700_000_000_000_000_000
PID, MAIN, LOADER = 4242, 100, 200

# name, start, end, opening thread, closing thread (None: never closed), push/pop
RANGES = [
    ("step", 1000, 20000, MAIN, MAIN, True),
    ("forward", 2000, 8000, MAIN, MAIN, True),
    ("attention", 3000, 5000, MAIN, MAIN, True),
    ("backward", 9000, 15000, MAIN, MAIN, True),
    ("prefetch", 2500, 12000, LOADER, MAIN, False),
    ("tail", 30000, None, LOADER, None, False),
]
MARKS = [("checkpoint", 8500, MAIN)]
# api, name, start, end, thread, correlation id
CALLS = [
    ("runtime", "cudaLaunchKernel", 2100, 2200, MAIN, 1),
    ("runtime", "cudaLaunchKernel", 3100, 3200, MAIN, 2),
    ("runtime", "cudaLaunchKernel", 5050, 5100, MAIN, 3),  # just after attention closed
    ("runtime", "cudaLaunchKernel", 2600, 2700, LOADER, 4),
    ("runtime", "cudaMemcpyAsync", 9100, 9300, MAIN, 5),
    ("runtime", "cudaLaunchKernel", 21000, 21500, MAIN, 6),
    ("runtime", "cudaLaunchKernel", 31000, 31200, LOADER, 7),
    ("driver", "cuLaunchKernel", 10000, 10100, MAIN, 8),
    ("runtime", "cudaMemsetAsync", 9500, 9600, MAIN, 9),
    ("runtime", "cudaLaunchKernel", 2550, 2560, MAIN, 10),  # main thread, inside prefetch
]
CBIDS = {
    "cudaLaunchKernel": 211,
    "cudaMemcpyAsync": 41,
    "cudaMemsetAsync": 51,
    "cuLaunchKernel": 307,
}
# kind, name, start, end, device, stream, correlation id, bytes
WORK = [
    ("kernel", "gemm", 2300, 3300, 0, 7, 1, None),
    ("kernel", "softmax", 3400, 3900, 0, 7, 2, None),
    ("kernel", "gemm", 5200, 6200, 0, 7, 3, None),
    ("kernel", "prefetch_kernel", 2800, 2900, 0, 13, 4, None),
    ("memcpy", "Memcpy HtoD", 9400, 9800, 0, 7, 5, 4096),
    ("kernel", "reduce", 21600, 22600, 1, 7, 6, None),
    ("kernel", "tail_kernel", 31300, 31400, 0, 7, 7, None),
    ("kernel", "bwd_kernel", 10200, 10700, 0, 7, 8, None),
    ("memset", "Memset", 9900, 9950, 0, 7, 9, 256),
    ("kernel", "early", 2600, 2650, 0, 13, 10, None),
    ("kernel", "orphan", 40000, 40100, 0, 7, 99, None),  # no call has its id
]
# correlation id -> (enclosing ranges outermost first, launching call's name or None)
EXPECTED = {
    1: (["step", "forward"], "cudaLaunchKernel"),
    2: (["step", "forward", "attention"], "cudaLaunchKernel"),
    3: (["step", "forward"], "cudaLaunchKernel"),
    4: (["prefetch"], "cudaLaunchKernel"),
    5: (["step", "backward"], "cudaMemcpyAsync"),
    6: ([], "cudaLaunchKernel"),
    7: (["tail"], "cudaLaunchKernel"),
    8: (["step", "backward"], "cuLaunchKernel"),
    9: (["step", "backward"], "cudaMemsetAsync"),
    10: (["step", "forward"], "cudaLaunchKernel"),
    99: ([], None),
}


def gtid(pid, tid):
    """Nsight's serialized globalTid, with hardware/VM bits above the pid, as real exports have."""
    return (1 << 56) | (2 << 48) | (pid << 24) | tid


def nsys(path, *, version="3.17.2", ranges=RANGES, calls=CALLS, work=WORK, marks=MARKS, base=T0):
    """An Nsight Systems export of the run."""
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
        CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT,
            localTime TEXT);
        CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER,
            globalTid INTEGER);
        CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
            nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_DRIVER (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER,
            nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
            shortName INTEGER NOT NULL, mangledName INTEGER, gridX INTEGER NOT NULL,
            gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL,
            blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL,
            copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL,
            bytes INTEGER NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
            endGlobalTid INTEGER, textId INTEGER, domainId INTEGER);
        """
    )
    strings = {}

    def sid(text):
        return strings.setdefault(text, len(strings) + 1)

    db.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', ?)", (version,))
    db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (base,))
    for tid, name in ((MAIN, "MainThread"), (LOADER, "loader")):
        db.execute("INSERT INTO ThreadNames VALUES (?, 0, ?)", (sid(name), gtid(PID, tid)))
    db.execute("INSERT INTO PROCESSES VALUES (?, ?, 'python')", (gtid(PID, 0), PID))
    for api, name, start, end, tid, corr in calls:
        db.execute(
            f"INSERT INTO CUPTI_ACTIVITY_KIND_{api.upper()} VALUES (?, ?, 0, ?, ?, ?, 0, NULL)",
            (start, end, gtid(PID, tid), corr, sid(name)),
        )
    for kind, name, start, end, device, stream, corr, size in work:
        common = (start, end, device, 1, stream, corr, gtid(PID, 0))
        if kind == "kernel":
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 8, 1, 1, 128, 1, 1)",
                (*common, sid(f"void {name}<float>(float*)"), sid(name)),
            )
        elif kind == "memcpy":
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, 0, 0)",
                (*common, size),
            )
        else:
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)",
                (*common, size),
            )
    db.execute(
        "INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) "
        "VALUES (0, 75, 'train', ?, 1)",
        (gtid(PID, MAIN),),
    )
    for n, (name, start, end, tid, end_tid, push_pop) in enumerate(ranges):
        # Some names registered (textId), some given inline (text), as NVTX allows.
        text, text_id = (None, sid(name)) if n % 2 else (name, None)
        db.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, rangeId, text, globalTid, "
            "endGlobalTid, textId, domainId) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                start, end, 59 if push_pop else 60, None if push_pop else n, text,
                gtid(PID, tid), None if end_tid in (None, tid) else gtid(PID, end_tid), text_id,
                1 if name == "forward" else 0,
            ),
        )  # fmt: skip
    for name, ts, tid in marks:
        db.execute(
            "INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid) VALUES (?, 34, ?, ?)",
            (ts, name, gtid(PID, tid)),
        )
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    db.commit()
    db.close()
    return path


def object_id(pid, tid):
    """nvprof's marker objectId: pid as 4 little-endian bytes, then tid as 8."""
    return struct.pack("<i", pid) + struct.pack("<q", tid)


def nvprof(path, *, kernel_table="CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL"):
    """An nvprof database of the run (times on the CUPTI clock: T0 + t)."""
    db = sqlite3.connect(path)
    db.executescript(
        f"""
        CREATE TABLE StringTable (_id_ INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (_id_ INTEGER PRIMARY KEY, cbid INT NOT NULL,
            start INT NOT NULL, end INT NOT NULL, processId INT NOT NULL, threadId INT NOT NULL,
            correlationId INT NOT NULL, returnValue INT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_DRIVER (_id_ INTEGER PRIMARY KEY, cbid INT NOT NULL,
            start INT NOT NULL, end INT NOT NULL, processId INT NOT NULL, threadId INT NOT NULL,
            correlationId INT NOT NULL, returnValue INT NOT NULL);
        CREATE TABLE {kernel_table} (_id_ INTEGER PRIMARY KEY, cacheConfig BLOB,
            sharedMemoryConfig INT, registersPerThread INT, start INT NOT NULL, end INT NOT NULL,
            completed INT, deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL,
            gridX INT, gridY INT, gridZ INT, blockX INT, blockY INT, blockZ INT,
            staticSharedMemory INT, dynamicSharedMemory INT, localMemoryPerThread INT,
            localMemoryTotal INT, correlationId INT NOT NULL, gridId INT, name INT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (_id_ INTEGER PRIMARY KEY, copyKind INT NOT NULL,
            srcKind INT, dstKind INT, flags INT, bytes INT NOT NULL, start INT NOT NULL,
            end INT NOT NULL, deviceId INT NOT NULL, contextId INT NOT NULL,
            streamId INT NOT NULL, correlationId INT NOT NULL, runtimeCorrelationId INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (_id_ INTEGER PRIMARY KEY, value INT NOT NULL,
            bytes INT NOT NULL, start INT NOT NULL, end INT NOT NULL, deviceId INT NOT NULL,
            contextId INT NOT NULL, streamId INT NOT NULL, correlationId INT NOT NULL,
            flags INT, memoryKind INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MARKER (_id_ INTEGER PRIMARY KEY, flags INT NOT NULL,
            timestamp INT NOT NULL, id INT NOT NULL, objectKind INT NOT NULL,
            objectId BLOB NOT NULL, name INT NOT NULL, domain INT NOT NULL);
        """
    )
    strings = {"": 0}

    def sid(text):
        return strings.setdefault(text, len(strings))

    for api, name, start, end, tid, corr in CALLS:
        db.execute(
            f"INSERT INTO CUPTI_ACTIVITY_KIND_{api.upper()} (cbid, start, end, processId, "
            "threadId, correlationId, returnValue) VALUES (?, ?, ?, ?, ?, ?, 0)",
            (CBIDS[name], T0 + start, T0 + end, PID, tid, corr),
        )
    for kind, name, start, end, device, stream, corr, size in WORK:
        common = (T0 + start, T0 + end, device, 1, stream, corr)
        if kind == "kernel":
            db.execute(
                f"INSERT INTO {kernel_table} (start, end, deviceId, contextId, streamId, "
                "correlationId, gridX, gridY, gridZ, blockX, blockY, blockZ, name) "
                "VALUES (?, ?, ?, ?, ?, ?, 8, 1, 1, 128, 1, 1, ?)",
                (*common, sid(f"void {name}<float>(float*)")),
            )
        elif kind == "memcpy":
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (copyKind, bytes, start, end, deviceId, "
                "contextId, streamId, correlationId) VALUES (1, ?, ?, ?, ?, ?, ?, ?)",
                (size, *common),
            )
        else:
            db.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET (value, bytes, start, end, deviceId, "
                "contextId, streamId, correlationId) VALUES (0, ?, ?, ?, ?, ?, ?, ?)",
                (size, *common),
            )
    markers = []  # flags, timestamp, id, objectId, name
    for n, (name, start, end, tid, end_tid, _) in enumerate(RANGES, start=1):
        markers.append((2, start, n, object_id(PID, tid), sid(name)))
        if end is not None:
            markers.append((4, end, n, object_id(PID, end_tid), 0))
    for name, ts, tid in MARKS:
        markers.append((1, ts, 100, object_id(PID, tid), sid(name)))
    markers.sort(key=lambda m: m[1])
    db.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_MARKER (flags, timestamp, id, objectKind, objectId, "
        "name, domain) VALUES (?, ?, ?, 2, ?, ?, 0)",
        [(f, T0 + ts, i, obj, name) for f, ts, i, obj, name in markers],
    )
    db.executemany("INSERT INTO StringTable VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    db.commit()
    db.close()
    return path
