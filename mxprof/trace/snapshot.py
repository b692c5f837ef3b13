"""A flight recorder snapshot's trigger, read back from a trace's ``otherData``.

A snapshot (``mxprof.trigger``; one process's, or a job's merged by
``mxprof.distributed``) is a trace like any other, plus
``otherData.flight_recorder``: the reason, the trigger's time (``trigger_us``
on the file's own time axis) and the window, and for a job's snapshot the
process that triggered, the processes missing and the range each process
was in at the trigger (``ranks``, ``stuck``).  :func:`trigger_of` reads it
defensively (a file is input: a field of the wrong type is left out, never
an error) for the report and the hints.  :func:`read_window`,
:func:`headline` and :func:`standing_out` work out, from one process's
snapshot file, where it was at the trigger, and who stands out among a
job's processes (``mxprof.distributed`` writes that into the merged file).

Part of the offline tier: it reads trace metadata and nothing live.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import TraceFormatError
from . import _scan
from .model import Trace
from .reader import open_trace, read_raw


@dataclass(frozen=True)
class RankAt:
    """Where one process was at the trigger: its innermost open range and for how long."""

    process: str
    range: str | None
    open_for_seconds: float | None


@dataclass(frozen=True)
class Trigger:
    """What a snapshot says of its trigger (times in ns on the file's axis)."""

    reason: str
    at_ns: int  # the trigger, ns from the file's ts 0
    wall_ns: int | None  # the trigger on the wall clock (a job's: the rank-0 worker's)
    window_seconds: float | None
    after_seconds: float | None
    start_ns: int | None  # the window as kept
    end_ns: int | None
    shortened_by_cap: bool
    suppressed: int  # triggers held back by the rate limit before this one
    by: str | None  # the process that triggered (a job's snapshot), or None
    job: bool
    missing: list[str] = field(default_factory=list)  # "<process>: <why>"
    ranks: list[RankAt] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)  # sentences
    details: Any = None

    @property
    def kept_seconds(self) -> float | None:
        """The length of the window as kept (before and after the trigger)."""
        if self.start_ns is None or self.end_ns is None:
            return None
        return max(self.end_ns - self.start_ns, 0) / 1e9


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _ns(value: Any) -> int | None:
    us = _number(value)
    return None if us is None else round(us * 1000)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def trigger_of(trace: Trace) -> Trigger | None:
    """The trigger of a flight recorder snapshot (None: the trace is no snapshot).

    Example:
        >>> t = trigger_of(mxprof.load("train.flight1-watchdog.json"))  # doctest: +SKIP
        >>> t.reason, t.at_ns / 1e9  # doctest: +SKIP
        ('watchdog', 31.5)
    """
    other = trace.metadata.get("otherData")
    info = other.get("flight_recorder") if isinstance(other, dict) else None
    if not isinstance(info, dict):
        return None
    at = _ns(info.get("trigger_us"))
    if at is None:
        return None
    by = info.get("triggered_by")
    by_text = _text(by.get("process")) if isinstance(by, dict) else None
    if by_text is None and isinstance(info.get("pid"), int):
        by_text = f"pid {info['pid']}"
    missing = []
    for gap in info.get("missing") or []:
        if isinstance(gap, dict) and _text(gap.get("process")):
            missing.append(f"{gap['process']}: {_text(gap.get('why')) or 'missing'}")
    ranks = []
    for r in info.get("ranks") or []:
        if isinstance(r, dict) and _text(r.get("process")):
            ranks.append(
                RankAt(r["process"], _text(r.get("range")), _number(r.get("open_for_seconds")))
            )
    stuck = []
    for s in info.get("stuck") or []:
        if isinstance(s, dict) and _text(s.get("process")) and _text(s.get("range")):
            held = _number(s.get("open_for_seconds"))
            since = f" for {held:.3g} s" if held is not None else ""
            others = _text(s.get("others_in"))
            tail = f", while the others are in {others}" if others else ""
            stuck.append(f"{s['process']} is in {s['range']}{since}{tail}")
    suppressed = info.get("suppressed_triggers")
    wall = info.get("trigger_wall_ns")
    return Trigger(
        reason=_text(info.get("reason")) or "trigger",
        at_ns=at,
        wall_ns=wall if isinstance(wall, int) and not isinstance(wall, bool) else None,
        window_seconds=_number(info.get("window_seconds")),
        after_seconds=_number(info.get("after_seconds")),
        start_ns=_ns(info.get("start_us")),
        end_ns=_ns(info.get("end_us")),
        shortened_by_cap=info.get("shortened_by_cap") is True,
        suppressed=suppressed if isinstance(suppressed, int) and suppressed > 0 else 0,
        by=by_text,
        job=info.get("job") is True,
        missing=missing,
        ranks=ranks,
        stuck=stuck,
        details=info.get("details"),
    )


# ---- where a process was at the trigger ----


def read_window(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A snapshot file's own ``otherData.flight_recorder`` ({} when it has
    none or cannot be read) and, per thread, the innermost range open at its
    trigger: of the ranges the snapshot cut short at its end
    (``args.cut_short``: open at the trigger and still open when the file
    was written), the one begun last, longest open first.  Of a file in
    mxprof's one-event-per-line shape only the lines of cut ranges and
    thread names are decoded.
    """
    try:
        with open_trace(path) as f:
            meta = _scan.metadata(f)
    except (OSError, _scan.NotLines, ValueError):
        try:
            meta = read_raw(path)[1]
        except (OSError, TraceFormatError):
            return {}, []
    other = meta.get("otherData")
    own = other.get("flight_recorder") if isinstance(other, dict) else None
    own = own if isinstance(own, dict) else {}
    trigger_us = _number(own.get("trigger_us"))
    if trigger_us is None:
        return own, []
    try:
        return own, _open_at(path, trigger_us)
    except (OSError, TraceFormatError):
        return own, []


def _open_at(path: str, trigger_us: float) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    try:
        with open_trace(path) as f:
            blocks = _scan.blocks(f)
            try:
                while True:
                    events.extend(_wanted(next(blocks)))
            except StopIteration:
                pass
    except _scan.NotLines:  # another shape or format: read whole
        events = read_raw(path)[0]
    names: dict[Any, str] = {}
    innermost: dict[tuple[Any, Any], tuple[float, dict[str, Any]]] = {}
    for e in events:
        args = e.get("args")
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            if isinstance(args, dict):
                names[(e.get("pid"), e.get("tid"))] = str(args.get("name"))
            continue
        ts = _number(e.get("ts"))
        if (
            e.get("ph") != "X"
            or not isinstance(args, dict)
            or args.get("cut_short") is not True
            or ts is None
            or ts > trigger_us
        ):
            continue
        key = (e.get("pid"), e.get("tid"))
        held = innermost.get(key)
        if held is None or ts >= held[0]:
            innermost[key] = (ts, e)
    out = [
        {
            "thread": names.get(key, f"thread {key[1]}"),
            "tid": key[1],
            "range": str(e.get("name")),
            "category": str(e.get("cat", "")),
            "open_for_seconds": round((trigger_us - ts) / 1e6, 6),
        }
        for key, (ts, e) in innermost.items()
    ]
    return sorted(out, key=lambda r: -float(r["open_for_seconds"]))


def _wanted(text: bytes) -> list[dict[str, Any]]:
    """Of a block of events (one a line), only the cut ranges and thread names."""
    kept = [
        line.strip().strip(b"[]").strip(b",")
        for line in text.split(b"\n")
        if b"cut_short" in line or b"thread_name" in line
    ]
    kept = [k for k in kept if k.startswith(b"{")]
    return _scan.raw_events(b"[" + b",".join(kept) + b"]") if kept else []


def headline(opened: list[dict[str, Any]], pid: Any) -> dict[str, Any] | None:
    """The range a process is in, of :func:`read_window`'s: its main thread's
    (the thread mxprof names after the pid, or ``MainThread``), else the one
    open longest; None when none is open."""
    main = {f"thread {pid}", "MainThread"}
    return next((r for r in opened if r["thread"] in main), opened[0] if opened else None)


def standing_out(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The processes (``{"process", "range", "open_for_seconds"}`` each)
    whose range differs from the one more than half of them are in: in a
    hang, the one the others wait for.  None stands out among fewer than
    two, or when no range holds a majority.

    Example:
        >>> standing_out([{"process": "w0", "range": "allreduce", "open_for_seconds": 30},
        ...               {"process": "w1", "range": "allreduce", "open_for_seconds": 30},
        ...               {"process": "w2", "range": "forward", "open_for_seconds": 31}])
        [{'process': 'w2', 'range': 'forward', 'open_for_seconds': 31, 'others_in': 'allreduce'}]
    """
    if len(ranks) < 2:
        return []
    common, n = collections.Counter(r.get("range") for r in ranks).most_common(1)[0]
    if common is None or n * 2 <= len(ranks):
        return []
    return [
        {
            "process": r["process"],
            "range": r.get("range"),
            "open_for_seconds": r.get("open_for_seconds"),
            "others_in": common,
        }
        for r in ranks
        if r.get("range") != common
    ]
