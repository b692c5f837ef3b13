"""Hint rules on time: steps whose duration varies or stands out (the outlier
rule of ``trace.processes``, the one the page's step chart uses), and long
stretches of a thread with no range open."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from itertools import count

from ..._render import format_ns
from ...trace._columns import NO_DUR, Thread
from ...trace.processes import MAD_SCALE, OUTLIER_MADS, OUTLIER_MIN_EXCESS, Id, Process
from ._common import (
    MAX_LINES,
    MIN_STEPS,
    SEVERITY_RANK,
    Hint,
    Job,
    capped,
    hint,
    pct,
    plural,
    quoted,
    sampled_in_no_range,
)

STEP_CV = 0.25
STEP_CV_HIGH = 0.5
OUTLIER_EXCESS_HIGH = 0.2  # of all step time: high severity
OUTLIER_EXCESS_MEDIUM = 0.05  # of all step time: below it (and a low CV), low severity
WARMUP_STEPS = 1  # outliers only among the first steps: warm-up, low severity
GAP_MIN_NS = 1_000_000
GAP_WALL_SHARE = 0.10
GAP_ABS_NS = 1_000_000_000
GAP_SHARE_MEDIUM = 0.25

_FENCE = f"median + max({OUTLIER_MADS:g} x {MAD_SCALE} x MAD, {OUTLIER_MIN_EXCESS:g} x median)"


def _cv(durations: list[int]) -> float:
    mean = statistics.fmean(durations) if durations else 0.0
    return statistics.pstdev(durations) / mean if mean else 0.0


def step_variance(job: Job) -> Hint | None:
    """Step times that vary (CV), or outlier steps, with what grew in them."""
    found = []
    for p in job.procs:
        s = p.steps
        if s is None or len(s.ranges) < MIN_STEPS:
            continue
        durs = s.durations
        cv = _cv(durs)
        if cv >= STEP_CV or s.outliers:
            found.append((cv, p, s, durs))
    if not found:
        return None
    found.sort(key=lambda f: -f[0])
    evidence, subjects, severity = [], [], "low"
    for cv, p, s, durs in found:
        evidence.append(
            f"{job.where(p)}{len(durs)} steps {quoted(s.name)}: median {format_ns(s.median)}, "
            f"mean {format_ns(statistics.fmean(durs))}, CV {cv:.2f} (stdev / mean; flagged "
            f"from {STEP_CV})"
        )
        outliers = s.outliers
        if outliers:
            listed = ", ".join(
                f"step {s.index[k]} {format_ns(durs[k])} ({durs[k] / s.median:.1f} x median)"
                for k in outliers[:MAX_LINES]
            )
            more = f" and {len(outliers) - MAX_LINES} more" if len(outliers) > MAX_LINES else ""
            evidence.append(
                f"  outlier steps (> {format_ns(s.threshold)}, {_FENCE}): {listed}{more}"
            )
            evidence.extend(_grown_children(job, p, outliers))
        subjects += [f"step {s.index[k]}" for k in outliers] + [s.name]
        if job.where(p):
            subjects.append(p.label)
        excess = sum(durs[k] - s.median for k in outliers)
        if outliers and max(outliers) < WARMUP_STEPS and _cv(durs[WARMUP_STEPS:]) < STEP_CV:
            mine = "low"  # only warm-up steps stand out
        elif cv >= STEP_CV_HIGH or excess >= OUTLIER_EXCESS_HIGH * sum(durs):
            mine = "high"
        elif cv >= STEP_CV or excess >= OUTLIER_EXCESS_MEDIUM * sum(durs):
            mine = "medium"
        else:
            mine = "low"
        severity = min(severity, mine, key=SEVERITY_RANK.__getitem__)
    cv, p, s, durs = found[0]
    if s.outliers and max(s.outliers) < WARMUP_STEPS and _cv(durs[WARMUP_STEPS:]) < STEP_CV:
        title = f"The first step is {durs[0] / s.median:.1f} x the median step (warm-up)"
    elif cv >= STEP_CV:
        title = f"Step time varies: CV {cv:.2f} over {len(durs)} steps"
    else:
        worst = s.outliers[0]
        title = (
            f"{plural(len(s.outliers), 'outlier step')} over {len(durs)}: step "
            f"{s.index[worst]} takes {durs[worst] / s.median:.1f} x the median"
        )
    return hint(
        "step-variance",
        severity,
        title,
        capped(evidence, 3 * MAX_LINES),
        "Look at what grew in the slow steps (the ranges named above): periodic work "
        "(checkpoints, evaluation, logging), garbage collection (gc.freeze() after setup, or "
        "collect between steps), input stalls, or other processes on the machine. Slow first "
        "steps are warm-up (compilation, caches): leave them out of measurements with "
        "mxprof.profile(schedule=mxprof.schedule(wait=..., warmup=..., active=...)).",
        subjects,
    )


def _grown_children(job: Job, p: Process, outliers: list[int]) -> list[str]:
    """For the slowest outlier steps, the direct child whose time grew most
    against its median over all steps; the step's time in no range (None) is
    a candidate too, with what the samples taken then were doing."""
    s = p.steps
    assert s is not None
    columns: dict[str | None, Sequence[int]] = dict(s.children.items())
    columns[None] = s.in_no_range
    medians = {n: statistics.median(column) for n, column in columns.items()}
    lines = []
    for k in outliers[:3]:
        delta, name, took = max(
            ((column[k] - medians[n], n, column[k]) for n, column in columns.items()),
            key=lambda g: g[0],
        )
        if delta > 0:
            what = "time in no range inside the step" if name is None else quoted(name)
            lines.append(
                f"  step {s.index[k]}: {what} took {format_ns(took)} against a median of "
                f"{format_ns(medians[name])} per step (+{format_ns(delta)})"
            )
            e = s.ranges[k]
            n, frames = sampled_in_no_range(job, p, e.ts, e.end) if name is None else (0, [])
            if frames:
                lines.append(f"    its {plural(n, 'stack sample')}: {', '.join(frames)}")
    return lines


def idle_gaps(job: Job) -> Hint | None:
    """Long stretches of a thread with no range open."""
    gaps = []  # (length, process, tid, start, end, before, after)
    idle: dict[tuple[int, Id], int] = {}
    for p in job.procs:
        floor = max(GAP_MIN_NS, GAP_WALL_SHARE * p.wall)
        for tid, ranges in p.threads.items():
            thread = ranges.thread
            names = thread.keys.names
            for length, end, ts, last, k in _long_gaps(thread, min(floor, GAP_ABS_NS)):
                gaps.append((length, p, tid, end, ts, names[last], names[k]))
                idle[(id(p), tid)] = idle.get((id(p), tid), 0) + length
    if not gaps:
        return None
    gaps.sort(key=lambda g: -g[0])
    evidence, subjects = [], []
    for length, p, tid, a, b, before, after in gaps:
        evidence.append(
            f"{job.where(p)}{p.thread_label(tid)}: {format_ns(length)} "
            f"({pct(length / p.wall)} of wall time) from {format_ns(a)} to {format_ns(b)}, "
            f"after {quoted(before)}, before {quoted(after)}{_between(p, tid, a, b)}"
        )
        subjects += [before, after] + ([p.label] if job.where(p) else [])
    worst = max(idle.items(), key=lambda kv: kv[1])
    wp: Process = next(q for q in job.procs if id(q) == worst[0][0])
    share = worst[1] / wp.wall
    return hint(
        "idle-gap",
        "medium" if share >= GAP_SHARE_MEDIUM else "low",
        f"{pct(share)} of wall time on {wp.thread_label(worst[0][1])} has no range open "
        f"({plural(sum(1 for g in gaps if (id(g[1]), g[2]) == worst[0]), 'long gap')})",
        capped(evidence),
        "Nothing was recorded there: either work without a range (put one around the code "
        "that runs between the ranges named above) or the thread waiting (I/O, a lock, a "
        "queue, sleep, another process); a range around the waiting call shows which.",
        subjects,
    )


def _long_gaps(thread: Thread, least: float) -> list[tuple[int, int, int, int, int]]:
    """A thread's stretches of at least ``least`` ns (> 0) with no range open:
    (length, start, end, key index of the range whose end starts it, key
    index of the range that ends it), in time order.

    A stretch starts at the latest end of the ranges before a range (the
    first range reaching it, on a tie) and ends at that range's start.  The
    walk reads the ts and dur columns alone (positions, not keys, are kept:
    a key is looked up per stretch found), the rule's inner loop.
    """
    out: list[tuple[int, int, int, int, int]] = []
    best: int | None = None  # the latest end so far, and the position of its range
    at = 0
    for i, start, length in zip(count(), thread.ts, thread.dur):
        if length == NO_DUR:
            continue
        if best is not None and start - best >= least:
            out.append((start - best, best, start, at, i))
        end = start + length
        if best is None or end > best:
            best, at = end, i
    key, kind = thread.key, thread.kind
    return [(n, a, b, key(kind[x]), key(kind[y])) for n, a, b, x, y in out]


def _between(p: Process, tid: Id, a: int, b: int) -> str:
    """' (between steps N and M)' when the gap lies between two steps of p's thread."""
    s = p.steps
    if s is None or s.tid != tid:
        return ""
    k = bisect.bisect_right([e.end for e in s.ranges], a) - 1
    if 0 <= k < len(s.ranges) - 1 and s.ranges[k + 1].ts >= b:
        return f" (between steps {s.index[k]} and {s.index[k + 1]})"
    return ""
