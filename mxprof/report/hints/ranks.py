"""Hint rules across ranks: the straggler, named by whom the others wait for
in collectives (``report.ranks``), else by busy time beyond the others'."""

from __future__ import annotations

import statistics

from ..._render import format_ns
from ...errors import TraceFormatError
from ...trace.processes import Process
from ..ranks import RankAnalysis
from ..ranks import analyze as analyze_ranks
from ._common import Hint, Job, capped, hint, measure, overlap, pct, quoted, union, words

STRAGGLER_RATIO = 1.2
STRAGGLER_RATIO_HIGH = 1.5

# fmt: off
COMM_WORDS = frozenset({
    "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "barrier", "wait",
    "waiting", "sync", "synchronize", "recv", "send", "nccl", "gloo", "comm",
    "communication", "push", "pull",
})
# fmt: on


def _is_comm(name: str, cache: dict[str, bool]) -> bool:
    known = cache.get(name)
    if known is None:
        known = cache[name] = bool(words(name) & COMM_WORDS)
    return known


def straggler(job: Job) -> Hint | None:
    """The rank the others wait for (collectives), else the busiest of a role."""
    if sum(1 for p in job.procs if p.threads) < 2:
        return None  # one process with ranges: no rank to compare with
    try:
        found = analyze_ranks(job.traces)
    except TraceFormatError:  # not one job (one rank twice, two worlds): no waits to match
        return _busiest(job.procs)
    if found.straggler is not None:
        return _late_rank(found)
    if found.matched:  # collectives say who waits for whom: busy time would mislead
        return None
    return _busiest(job.procs)


def _late_rank(found: RankAnalysis) -> Hint:
    """The straggler the cross-rank analysis names (mxprof.report.ranks)."""
    s = found.straggler
    assert s is not None
    steps = [m["total"] for m in found.per_rank().values()]
    step = statistics.median(steps) if found.step_name and steps else 0.0
    what = f" ({pct(s.waited_for / step)} of a step)" if step else ""
    return hint(
        "straggler",
        "high" if step and s.waited_for >= (STRAGGLER_RATIO - 1) * step else "medium",
        f"Straggler: the other ranks wait {format_ns(s.waited_for)} per step for {s.label}" + what,
        s.evidence,
        f"{s.label} reaches the collectives last, so every other rank waits there for it. "
        "Find where its step is longer (the lines above: a range, or idle time with no range "
        "open): uneven shards or sequence lengths (balance or bucket them), work only it does "
        "(logging, checkpoints, evaluation: move them off the step or to another process), "
        "or a slower machine (clock limits, other jobs, a different GPU).",
        [s.label, *s.ranges],
    )


def _busiest(procs: list[Process]) -> Hint | None:
    """Without collectives: the rank busy beyond the others of its role."""
    cache: dict[str, bool] = {}
    by_role: dict[str, list[Process]] = {}
    for p in procs:
        by_role.setdefault(p.role, []).append(p)
    best = None
    for group in by_role.values():
        stepped = [p for p in group if p.steps is not None]
        per_step = bool(stepped)
        group = stepped or group  # ranks have steps; a parent that only waits has none
        if len(group) < 2:
            continue
        rows = [r for p in group if (r := _busy(p, per_step, cache)) is not None and r[0] > 0]
        if len(rows) < 2:
            continue
        rows.sort(key=lambda r: -r[0])
        others = statistics.median(r[0] for r in rows[1:])
        ratio = rows[0][0] / others if others else float("inf")
        if ratio >= STRAGGLER_RATIO and (best is None or ratio > best[0]):
            best = (ratio, per_step, rows, others)
    if best is None:
        return None
    ratio, per_step, rows, others = best
    what = "busy time per step" if per_step else "busy time"
    slow = rows[0][3]
    evidence = [
        f"{p.label}: {format_ns(busy)} {what} outside communication/waiting, "
        f"{format_ns(comm)} in it" + (f" ({len(p.steps.ranges)} steps)" if p.steps else "")
        for busy, comm, _, p in rows
    ]
    evidence = capped(evidence)
    evidence.append(f"median of the others: {format_ns(others)}; {slow.label}: {ratio:.2f} x")
    excess = []
    for name, took in rows[0][2].items():
        typical = statistics.median(r[2].get(name, 0) for r in rows[1:])
        if took > typical:
            excess.append((took - typical, name, took, typical))
    for delta, name, took, typical in sorted(excess, reverse=True)[:3]:
        evidence.append(
            f"  {quoted(name)} on {slow.label}: {format_ns(took)} against a median of "
            f"{format_ns(typical)} on the others (+{format_ns(delta)})"
        )
    return hint(
        "straggler",
        "high" if ratio >= STRAGGLER_RATIO_HIGH else "medium",
        f"Straggler: {slow.label} is busy {ratio:.2f} x as long as the median of the others",
        evidence,
        f"The others wait for {slow.label} at every synchronisation. Find why it does more: "
        "uneven shards or sequence lengths (balance or bucket them), work only it does "
        "(logging, checkpoints, evaluation: move them off the step or to another process), "
        "or a slower machine (clock limits, other jobs, a different GPU).",
        [slow.label] + [e[1] for e in sorted(excess, reverse=True)[:3]],
    )


def _busy(
    p: Process, per_step: bool, cache: dict[str, bool]
) -> tuple[float, float, dict[str, float], Process] | None:
    """(busy, communication, time by name) on the process's main thread, per
    step when per_step; None when it has no ranges."""
    if p.steps is not None:
        tid = p.steps.tid
        lo, hi = p.steps.span
    elif p.threads:
        tid = max(
            p.threads,
            key=lambda t: measure(union((ts, ts + d) for ts, d, _ in p.threads[t].columns())),
        )
        lo, hi = p.start, p.end
    else:
        return None
    work: list[list[int]] = []
    comm: list[list[int]] = []
    by_name: dict[str, float] = {}
    names = p.threads[tid].thread.keys.names
    for ts, d, k in p.threads[tid].columns():  # in ts order, so clipped starts stay in order
        a, b = max(ts, lo), min(ts + d, hi)
        if b <= a:
            continue
        name = names[k]
        by_name[name] = by_name.get(name, 0) + b - a
        spans = comm if _is_comm(name, cache) else work
        if spans and a <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
    n = len(p.steps.ranges) if per_step and p.steps is not None else 1
    busy = measure(work) - overlap([(a, b) for a, b in work], [(a, b) for a, b in comm])
    return busy / n, measure(comm) / n, {k: v / n for k, v in by_name.items()}, p
