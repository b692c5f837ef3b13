"""A flight recorder snapshot's trigger, read back from a trace's ``otherData``.

A snapshot (``mxprof.trigger``; one process's, or a job's merged by
``mxprof.distributed``) is a trace like any other, plus
``otherData.flight_recorder``: the reason, the trigger's time (``trigger_us``
on the file's own time axis) and the window, and for a job's snapshot the
process that triggered, the processes missing and the range each process
was in at the trigger (``ranks``, ``stuck``).  :func:`trigger_of` reads it
defensively (a file is input: a field of the wrong type is left out, never
an error) for the report and the hints.

Part of the offline tier: it reads trace metadata and nothing live.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .model import Trace


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
