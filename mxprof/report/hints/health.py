"""Hint rules on the health of the recording and of single range names:
dropped events, misuse tallies, instrumentation overhead, tail latency."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

from ..._render import display, format_ns
from ...trace.steps import is_profiler_step
from ._common import (
    MAX_LINES,
    Hint,
    Job,
    capped,
    file_label,
    hint,
    pct,
    plural,
    quoted,
    tally,
    written_by_mxprof,
)

TAIL_MIN_COUNT = 100
TAIL_RATIO = 5.0
TAIL_RATIO_MEDIUM = 10.0
TAIL_MIN_P99_NS = 50_000
RANGE_COST_NS = 210
SHORT_RANGE_NS = 10_000
OVERHEAD_SHARE = 0.02
OVERHEAD_SHARE_HIGH = 0.10
OVERHEAD_MIN_NS = 1_000_000  # and at least 1 ms in all (about 4,800 ranges)

# Each core tally (_tallies.TALLIES) but dropped_events: what it counts, and its fix.
TALLY_FIXES = {
    "unmatched_stops": (
        "stop() with no range of that object open on the thread",
        "pair every start() with a stop() on the same thread, or use `with task:`",
    ),
    "non_lifo_stops": (
        "ranges stopped while a range started after them was still open",
        "stop ranges innermost first (`with` blocks do)",
    ),
    "unknown_frees": (
        "record_free() of a pointer with no live allocation",
        "free each pointer once, and record the allocation while profile_memory is on",
    ),
    "saturated_values": (
        "counter updates whose result went past the int64 limits and was held there",
        "keep counter values within +-2**63 (count in larger units)",
    ),
    "cut_ranges": (
        "ranges still open when profiling stopped, closed there (args.cut_short)",
        "stop profiling (set_state('stop'), dump(True)) after the ranges you need end",
    ),
    "ignored_calls": (
        "instrumentation calls made while not recording (paused or stopped)",
        "if you expected them in the trace, check when set_state/pause/resume run",
    ),
    "invalid_calls": (
        "C API calls (mxprof._C_API) with a NULL name or an id not of their kind",
        "check the ids a native extension passes: intern each name once, pass ids of its kind",
    ),
}
_SERIOUS_TALLIES = (
    "unmatched_stops", "non_lifo_stops", "unknown_frees", "saturated_values", "invalid_calls"
)  # fmt: skip


def rank(ordered: Sequence[int], percent: int) -> int:
    """The nearest-rank percentile, as Trace.key_averages computes it."""
    return ordered[max(-(-percent * len(ordered) // 100), 1) - 1]


def tail_latency(job: Job) -> Hint | None:
    """A range name whose P99 is far above its P50."""
    pooled: dict[tuple[str, str], list[Sequence[int]]] = {}
    steps = {(s.ranges[0].name, s.ranges[0].category) for p in job.procs if (s := p.steps)}
    for p in job.procs:
        for key, lengths in p.durations().items():
            if key not in steps and not is_profiler_step(key[0]):
                pooled.setdefault(key, []).append(lengths)
    found = []
    for (name, category), runs in pooled.items():
        if sum(map(len, runs)) < TAIL_MIN_COUNT:
            continue
        # One name's durations at a time, sorted (each process's run already is).
        durations: Sequence[int] = runs[0] if len(runs) == 1 else sorted(chain.from_iterable(runs))
        p50, p99 = rank(durations, 50), rank(durations, 99)
        if p99 >= TAIL_MIN_P99_NS and p99 >= TAIL_RATIO * max(p50, 1):
            found.append((p99 / max(p50, 1), name, category, durations, p50, p99))
    if not found:
        return None
    found.sort(key=lambda f: (-f[0], f[1]))
    evidence = []
    for ratio, name, category, durations, p50, p99 in found:
        slowest = durations[-max(1, len(durations) // 100) :]
        evidence.append(
            f"{quoted(name)} ({display(category) or 'no category'}): {len(durations):,} ranges, "
            f"P50 {format_ns(p50)}, P90 {format_ns(rank(durations, 90))}, P99 "
            f"{format_ns(p99)} ({ratio:.1f} x P50), max {format_ns(durations[-1])}; the slowest "
            f"1 % take {format_ns(sum(slowest))}"
        )
    ratio, name, *_ = found[0]
    return hint(
        "tail-latency",
        "medium" if ratio >= TAIL_RATIO_MEDIUM else "low",
        f"Tail latency: P99 of {quoted(name)} is {ratio:.1f} x its P50",
        capped(evidence),
        "A few calls are much slower than the typical one: sort these ranges by duration in "
        "the timeline (Perfetto) and look at what overlaps the slowest (garbage collection, "
        "a lock or queue wait, I/O, another thread holding the GIL, a cold cache); then make "
        "the slow path rare (warm up, preallocate, batch) or move it off the critical path.",
        [f[1] for f in found],
    )


def overhead(job: Job) -> Hint | None:
    """Many very short ranges, whose own cost is a share of the run."""
    found = []
    for p in job.procs:
        if not written_by_mxprof(job.traces[p.source]) or p.wall <= 0:
            continue
        short = [
            (len(d), name, d)
            for (name, _), d in p.durations().items()
            if rank(d, 50) <= SHORT_RANGE_NS
        ]
        count = sum(n for n, _, _ in short)
        cost = count * RANGE_COST_NS
        if cost >= OVERHEAD_SHARE * p.wall and cost >= OVERHEAD_MIN_NS:
            found.append((cost / p.wall, p, sorted(short, key=lambda s: (-s[0], s[1])), count))
    if not found:
        return None
    found.sort(key=lambda f: -f[0])
    evidence, subjects = [], []
    for share, p, short, count in found:
        traced = sum(sum(d) for _, _, d in short)
        evidence.append(
            f"{job.where(p)}{count:,} ranges of {plural(len(short), 'name')} "
            f"with a median of at most "
            f"{format_ns(SHORT_RANGE_NS)}: at {RANGE_COST_NS} ns each, about "
            f"{format_ns(count * RANGE_COST_NS)} of instrumentation, {pct(share)} of wall time "
            f"{format_ns(p.wall)} and {pct(count * RANGE_COST_NS / max(traced, 1))} of the "
            f"{format_ns(traced)} those ranges recorded"
        )
        for n, name, d in short[:5]:
            evidence.append(
                f"  {quoted(name)}: {n:,} ranges, median {format_ns(rank(d, 50))}, about "
                f"{format_ns(n * RANGE_COST_NS)} of instrumentation"
            )
            subjects.append(name)
    share = found[0][0]
    return hint(
        "instrumentation-overhead",
        "high" if share >= OVERHEAD_SHARE_HIGH else "medium",
        f"Instrumentation may cost about {pct(share)} of wall time (many very short ranges)",
        capped(evidence, 3 * MAX_LINES),
        f"Each range costs about {RANGE_COST_NS} ns (benchmarks/calls.py): time the enclosing "
        "loop or batch once instead of every call of the ranges above, or count the calls "
        "with a Counter; keep per-call ranges for short, focused runs.",
        subjects,
    )


def dropped(job: Job) -> Hint | None:
    """Events the core dropped at its cap: the profile is partial."""
    evidence, subjects, total = [], [], 0
    for i, t in enumerate(job.traces):
        n = tally(t, "dropped_events")
        if n:
            total += n
            evidence.append(
                f"{file_label(t, i)}: {n:,} events dropped (otherData.dropped_events); "
                f"{len(t):,} events in the file"
            )
            subjects.append(file_label(t, i))
    if not total:
        return None
    return hint(
        "dropped-events",
        "high",
        f"{total:,} events were dropped: the profile is incomplete",
        evidence,
        "More events waited for the file than max_events allows (default 10,000,000): raise "
        "it (set_config(max_events=50_000_000), 0 = no limit), let the writer drain sooner "
        "(a lower dump_period, or dump_events), or record fewer ranges (statistics only: "
        "write_trace=False).",
        subjects,
    )


def misuse(job: Job) -> Hint | None:
    """The core's misuse tallies, each with its meaning and fix."""
    evidence, fixes, subjects, serious = [], [], [], False
    for key, (meaning, fix) in TALLY_FIXES.items():
        counts = [(t, i, tally(t, key)) for i, t in enumerate(job.traces)]
        counts = [c for c in counts if c[2]]
        if not counts:
            continue
        serious |= key in _SERIOUS_TALLIES
        where = ", ".join(f"{file_label(t, i)}: {n:,}" for t, i, n in counts)
        evidence.append(f"{key} = {sum(n for *_, n in counts):,}: {meaning} ({where})")
        fixes.append(f"{key}: {fix}")
        subjects.append(key)
    if not set(subjects) - {"ignored_calls"}:
        return None  # calls while paused or between scheduled cycles are expected
    return hint(
        "misuse",
        "medium" if serious else "low",
        f"Instrumentation tallies: {', '.join(subjects)}",
        evidence,
        "; ".join(fixes) + ".",
        subjects,
    )
