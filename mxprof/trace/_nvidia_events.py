"""An NVIDIA database's records as Chrome trace events, GPU work tied to its ranges.

The attribution rule (apex pyprof's) and the tracks are described in
``mxprof.trace.nvidia``; this module applies them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._nvidia_db import Call, Database, GpuWork, Range
    from .reader import RawEvent

# GPU tracks get pids above any Linux pid (PID_MAX_LIMIT is 2**22), so they
# never take a real process's place, in containers (pid 1) included.
GPU_PID_BASE = 1 << 22

Thread = tuple[int, int]
_NEVER = 1 << 63  # the end of a range never closed: open to the end of the capture


def _end(r: Range) -> int:
    return r.end if r.end is not None else _NEVER


def enclosing_ranges(db: Database) -> dict[int, list[Range]]:
    """id(call) -> the ranges enclosing it on its thread, outermost first.

    A range encloses a call when it was opened on the call's thread strictly
    before the call began and is closed strictly after it ended (or never).
    """
    ranges: dict[Thread, list[Range]] = {}
    for r in db.ranges:
        ranges.setdefault((r.pid, r.tid), []).append(r)
    for found in ranges.values():
        # Opened first, and of two opened together the longer (the outer) first.
        found.sort(key=lambda r: (r.start, -_end(r)))
    calls: dict[Thread, list[Call]] = {}
    for c in db.calls:
        calls.setdefault((c.pid, c.tid), []).append(c)
    out: dict[int, list[Range]] = {}
    for thread, on_thread in calls.items():
        opened = ranges.get(thread, [])
        on_thread.sort(key=lambda c: c.start)
        active: list[Range] = []
        i = 0
        for call in on_thread:
            while i < len(opened) and opened[i].start < call.start:
                active.append(opened[i])
                i += 1
            active = [r for r in active if r.end is None or r.end > call.start]
            out[id(call)] = [r for r in active if r.end is None or r.end > call.end]
    return out


def _launches(db: Database) -> dict[tuple[int | None, int], Call]:
    """(process or None, correlation id) -> the call; a runtime call wins over a driver call."""
    found: dict[tuple[int | None, int], Call] = {}
    for api in ("driver", "runtime"):
        for c in db.calls:
            if c.api == api and c.correlation_id is not None:
                found[(None, c.correlation_id)] = c  # for GPU work of no known process
                if db.per_process_correlation:
                    found[(c.pid, c.correlation_id)] = c
    return found


def _not_nested(ranges: list[Range]) -> set[int]:
    """id() of the same-thread ranges that cross another one's end (drawn as async slices)."""
    crossing: set[int] = set()
    by_thread: dict[Thread, list[Range]] = {}
    for r in ranges:
        by_thread.setdefault((r.pid, r.tid), []).append(r)
    for on_thread in by_thread.values():
        on_thread.sort(key=lambda r: (r.start, -_end(r)))
        stack: list[Range] = []
        for r in on_thread:
            while stack and _end(stack[-1]) <= r.start:
                stack.pop()
            if stack and _end(r) > _end(stack[-1]):
                crossing.add(id(r))
                continue
            stack.append(r)
    return crossing


def build_events(db: Database) -> list[RawEvent]:
    """Every record of db as raw Chrome events, ts in µs from db.origin."""
    origin = db.origin
    times = [c.end for c in db.calls] + [w.end for w in db.work] + [m.ts for m in db.marks]
    times += [r.end if r.end is not None else r.start for r in db.ranges]
    capture_end = max(times, default=origin)

    def us(t: int) -> float:
        return (t - origin) / 1000

    events: list[RawEvent] = []
    cpu_threads: set[Thread] = set()
    for c in db.calls:
        cpu_threads.add((c.pid, c.tid))
        args = {} if c.correlation_id is None else {"correlation_id": c.correlation_id}
        events.append(_slice(c.name, f"cuda_{c.api}", c.pid, c.tid, us(c.start), us(c.end), args))
    events += _range_events(db, us, capture_end, cpu_threads)
    for m in db.marks:
        cpu_threads.add((m.pid, m.tid))
        mark_args: dict[str, Any] = {"domain": m.domain} if m.domain else {}
        events.append(
            {"name": m.name, "cat": "nvtx", "ph": "i", "s": "t", "ts": us(m.ts),
             "pid": m.pid, "tid": m.tid, "args": mark_args}
        )  # fmt: skip
    events += _work_events(db, us)
    events += _names(db, cpu_threads)
    return events


def _slice(
    name: str, cat: str, pid: int, tid: int, start: float, end: float, args: dict[str, Any]
) -> RawEvent:
    return {
        "name": name, "cat": cat, "ph": "X", "ts": start, "dur": max(end - start, 0.0),
        "pid": pid, "tid": tid, "args": args,
    }  # fmt: skip


def _range_events(db: Database, us: Any, capture_end: int, threads: set[Thread]) -> list[RawEvent]:
    out: list[RawEvent] = []
    same_thread = [r for r in db.ranges if r.nested and (r.pid, r.tid) == (r.end_pid, r.end_tid)]
    crossing = _not_nested(same_thread)
    for n, r in enumerate(db.ranges):
        threads.add((r.pid, r.tid))
        args: dict[str, Any] = {"domain": r.domain} if r.domain else {}
        end = r.end
        if end is None:
            end = capture_end
            args["cut_short"] = True
        if r.nested and (r.pid, r.tid) == (r.end_pid, r.end_tid) and id(r) not in crossing:
            out.append(_slice(r.name, "nvtx", r.pid, r.tid, us(r.start), us(end), args))
            continue
        if (r.end_pid, r.end_tid) != (r.pid, r.tid):
            args["end_tid"] = r.end_tid
        # Not nested on one thread: an async slice, as mxprof draws cross-thread ranges.
        common = {"name": r.name, "cat": "nvtx", "id": n, "pid": r.pid}
        out.append({**common, "ph": "b", "ts": us(r.start), "tid": r.tid, "args": args})
        out.append({**common, "ph": "e", "ts": us(end), "tid": r.end_tid})
    return out


def _gpu_tracks(work: list[GpuWork]) -> dict[tuple[int | None, int], int]:
    keys = sorted({(w.pid, w.device) for w in work}, key=lambda k: (k[1], k[0] or 0))
    return {key: GPU_PID_BASE + i for i, key in enumerate(keys)}


def _work_events(db: Database, us: Any) -> list[RawEvent]:
    launches = _launches(db)
    stacks = enclosing_ranges(db)
    tracks = _gpu_tracks(db.work)
    out: list[RawEvent] = []
    for w in db.work:
        pid = tracks[(w.pid, w.device)]
        args = dict(w.args)
        call = None
        corr = w.correlation_id
        if corr is not None:
            args["correlation_id"] = corr
            call = launches.get((w.pid if db.per_process_correlation else None, corr))
        if call is not None and corr is not None:
            args["launch"] = call.name
            stack = stacks.get(id(call), [])
            if stack:
                args["range"] = stack[-1].name
                args["ranges"] = [r.name for r in stack]
            flow = {"name": "launch", "cat": "cuda_flow", "id": (call.pid << 32) | corr}
            middle = (call.start + call.end) // 2
            out.append({**flow, "ph": "s", "ts": us(middle), "pid": call.pid, "tid": call.tid})
            inside = (w.start + w.end) // 2
            out.append(
                {**flow, "ph": "f", "bp": "e", "ts": us(inside), "pid": pid, "tid": w.stream}
            )
        out.append(_slice(w.name, w.category, pid, w.stream, us(w.start), us(w.end), args))
    return out


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> RawEvent:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _names(db: Database, cpu_threads: set[Thread]) -> list[RawEvent]:
    out: list[RawEvent] = []
    for pid in sorted({p for p, _ in cpu_threads}):
        if pid in db.process_names:
            out.append(_meta("process_name", pid, 0, {"name": db.process_names[pid]}))
    for pid, tid in sorted(cpu_threads):
        name = db.thread_names.get((pid, tid))
        if name:
            out.append(_meta("thread_name", pid, tid, {"name": name}))
    tracks = _gpu_tracks(db.work)
    processes = {p for p, _ in tracks if p is not None}
    for (owner, device), pid in tracks.items():
        label = f"GPU {device}"
        if len(processes) > 1:
            label += f" (process {owner})"
        out.append(_meta("process_name", pid, 0, {"name": label}))
        out.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
    streams = sorted({(tracks[(w.pid, w.device)], w.stream) for w in db.work})
    for pid, stream in streams:
        out.append(_meta("thread_name", pid, stream, {"name": f"stream {stream}"}))
        out.append(_meta("thread_sort_index", pid, stream, {"sort_index": stream}))
    return out
