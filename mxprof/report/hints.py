"""Optimisation hints: rules over loaded traces, each with its evidence.

``find_hints(traces)`` looks at one or more loaded traces (several files, or
one merged file with several processes) and returns what a reader should look
at first: each ``Hint`` has a title, the numbers behind it (evidence lines
naming the ranges, steps, processes involved) and a concrete suggestion.

Terms the rules share:

- *process*: one pid of one input trace, labelled ``worker 1`` / ``server 0``
  (``distributedInfo`` of a single-process file, or the process name a
  distributed ``mxprof merge`` gives), else ``pid N`` (with the file's name
  when several files are given).
- *steps*: the ranges of one frame (category ``<domain>,frame``; the step
  index is ``args.frame``) or torch.profiler's ``ProfilerStep#N`` (index N);
  where a process has several, the one with the most ranges. *Step time* is
  the span from the first step's start to the last one's end, so the time
  between steps (often where a loop fetches its next batch) is in it.
- *wall time* of a process: its first event's start to its last one's end.
- *words* of a name: its parts split at non-letters and camelCase humps,
  lower-cased, plus each two neighbours joined (``DataLoader.__next__`` has
  ``data``, ``loader``, ``next``, ``dataloader``, ``loadernext``).

The rules, their thresholds (module constants) and why; a rule gives at most
one hint, covering every process where it fires:

=====================  ============================================  ==========================
rule                   fires when                                    why this threshold
=====================  ============================================  ==========================
data-loading           loading ranges (below) cover >= 20 % of       a fifth of the step spent
                       step time on the steps' thread (without       waiting for input is worth
                       steps: of wall time, on the thread with the   overlapping
                       most, not one that only loads); high >= 40 %
step-variance          >= 5 steps and CV of step durations >= 0.25,  CV 0.25 is far above the
                       or a step longer than median + max(3 x        few % of a steady loop;
                       1.4826 x MAD, 0.5 x median); high from CV     3 scaled MADs is the usual
                       0.5 or outliers' excess >= 20 % of all step   robust outlier fence, and
                       time; low when only the first step stands     1.5 x median keeps it off
                       out (warm-up)                                 noise when MAD is ~0
tail-latency           a range name with >= 100 ranges, P99 >=       with 100 ranges P99 is not
                       5 x P50 and P99 >= 50 us; medium from 10 x,   the single slowest; 5 x is
                       else low                                      a tail, not jitter; 50 us
                                                                     skips timer noise
instrumentation-       in a trace mxprof wrote: names whose median   at 0.21 us a range, a
overhead               range is <= 10 us, their count x 0.21 us      range of 10 us pays 2 %;
                       >= 2 % of wall time and >= 1 ms; high from    2 % of the run (and 1 ms)
                       10 %                                          is worth a change
memory-peak            a device's memory counter (``Memory: gpu/0``  a peak is always worth
                       in ``Device Storage``) ever above 0; low      knowing, never alarming
memory-growth          >= 5 steps, the device's bytes in use at      a leak grows in most
                       step ends rise in >= 60 % of steps and end    steps; 10 % keeps small
                       >= 10 % above where they began; medium        one-off caches out
straggler              the cross-rank analysis (``report.ranks``)    its thresholds are
                       names the rank the others wait for in         ``report.ranks``'s; 20 %
                       collectives (high when they wait >= 20 % of   of a step (or busy time)
                       a step); without collectives: >= 2            is beyond run-to-run
                       processes of one role (with steps, if any     noise of a balanced job
                       has them), the busiest's busy time (per step
                       with steps) >= 1.2 x the median of the
                       others; high from 1.5 x
dropped-events         ``otherData.dropped_events`` > 0; high        any loss makes the rest
                                                                     of the profile partial
misuse                 a tally of ``otherData`` (``TALLIES``) > 0,   each one names a fix;
                       medium for unmatched/non-LIFO stops, unknown  calls while paused or
                       frees, saturated values; low for cut ranges;  between scheduled cycles
                       ignored_calls alone does not fire             are expected
idle-gap               on a thread with ranges, a gap with none      a tenth of the run
                       open between two ranges >= max(1 ms,          unaccounted for is worth a
                       10 % of wall time), or >= 1 s; medium when    look; 1 s is long anywhere
                       a thread's gaps add up to >= 25 % of wall
=====================  ============================================  ==========================

Loading ranges: a range (not a step, not containing one) whose name has one
of ``LOADING_WORDS``, or ``batch``/``batches`` with one of ``BATCH_VERBS``
(``get_batch``, ``next_batch``; not ``train_batch``), or ``data`` without
``parallel``; a user marks ranges as loading by putting them in a domain
(category) with such a word or ``input`` (``mxprof.Domain("input")``).

Straggler: where collectives were recorded (the torch adapter's, or
torch.profiler's ``gloo:``/``nccl:`` ranges), ``mxprof.report.ranks`` decides:
a slow rank waits *least* inside them, so it is found by whom the others
wait for, not by busy time, and no busy-time hint is given when the
collectives name no one.

Busy time (straggler, without collectives): on the steps' thread (without
steps, the thread with the most time in ranges), the time inside ranges
less the time inside ranges named like communication or waiting (``COMM_WORDS``: ``allreduce``,
``barrier``, ``wait`` ...), within the step span: so a fast rank that waits
for a slow one in a collective is not counted busy while it waits.

The per-range cost, ``RANGE_COST_NS`` = 210 ns, is ``with task`` while
recording from ``benchmarks/calls.py`` in the recorded run of
``benchmarks/README.md`` (2026-11-21, 209.6 ns; 160 ns on 2026-11-23 on the
same kind of 2-vCPU machine): the report runs without the compiled core, so
the cost is a constant of this build, the higher of the two.
"""

from __future__ import annotations

import bisect
import os
import re
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from .._render import display, format_ns
from ..trace import Event, Trace
from ..trace.steps import is_frame, is_profiler_step, step_number
from .ranks import RankAnalysis
from .ranks import analyze as analyze_ranks

__all__ = ["Hint", "find_hints"]

# ---- thresholds (see the table in the module docstring) ----
LOADING_SHARE = 0.20
LOADING_SHARE_HIGH = 0.40
MIN_STEPS = 5
STEP_CV = 0.25
STEP_CV_HIGH = 0.5
OUTLIER_MADS = 3.0
MAD_SCALE = 1.4826  # MAD x this estimates the standard deviation of a normal
OUTLIER_MIN_EXCESS = 0.5  # of the median: an outlier step is at least 1.5 x it
OUTLIER_EXCESS_HIGH = 0.2  # of all step time: high severity
WARMUP_STEPS = 1  # outliers only among the first steps: warm-up, low severity
TAIL_MIN_COUNT = 100
TAIL_RATIO = 5.0
TAIL_RATIO_MEDIUM = 10.0
TAIL_MIN_P99_NS = 50_000
RANGE_COST_NS = 210
SHORT_RANGE_NS = 10_000
OVERHEAD_SHARE = 0.02
OVERHEAD_SHARE_HIGH = 0.10
OVERHEAD_MIN_NS = 1_000_000  # and at least 1 ms in all (about 4,800 ranges)
GROWTH_RISING_SHARE = 0.6
GROWTH_MIN_SHARE = 0.10
STRAGGLER_RATIO = 1.2
STRAGGLER_RATIO_HIGH = 1.5
GAP_MIN_NS = 1_000_000
GAP_WALL_SHARE = 0.10
GAP_ABS_NS = 1_000_000_000
GAP_SHARE_MEDIUM = 0.25
MAX_LINES = 8  # evidence lines of one kind before "... and N more"

# fmt: off
LOADING_WORDS = frozenset({
    "load", "loads", "loading", "loader", "loaders", "dataloader", "fetch", "fetches",
    "fetching", "prefetch", "prefetcher", "collate",
})
BATCH_VERBS = frozenset({"get", "next", "iter", "read", "sample"})
COMM_WORDS = frozenset({
    "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "barrier", "wait",
    "waiting", "sync", "synchronize", "recv", "send", "nccl", "gloo", "comm",
    "communication", "push", "pull",
})
# fmt: on
TALLIES = {
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
_SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}
_DIST_LABEL = re.compile(r"^(worker|server) (\d+) \(")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

Id = Union[int, str]
Span = tuple[int, int]


@dataclass(frozen=True)
class Hint:
    """One finding: what, how sure, the numbers behind it and what to try.

    ``subjects`` are what the hint is about, for a report to link or mark:
    range names as they are, steps as ``"step N"``, processes by their label
    (``"worker 1"``, ``"pid 4242"``), devices as ``"gpu/0"``, scopes by name.

    Example:
        >>> hints = find_hints([mxprof.load("trace.json")])  # doctest: +SKIP
        >>> for h in hints:  # doctest: +SKIP
        ...     print(h.severity, h.title, *h.evidence, h.suggestion, sep="\\n  ")
    """

    rule: str
    severity: str
    title: str
    evidence: tuple[str, ...]
    suggestion: str
    subjects: tuple[str, ...] = ()


def find_hints(traces: Trace | Sequence[Trace]) -> list[Hint]:
    """Run every rule over the traces; the hints that fire, most severe first
    (ties in the order of the module docstring's table).

    Args:
        traces: loaded traces (``mxprof.load``); several files of one job are
            compared as processes (ranks). A single Trace is taken as [trace].

    Raises:
        TypeError: an item is not a Trace.

    Example:
        >>> import mxprof
        >>> from mxprof.report.hints import find_hints
        >>> ranks = [mxprof.load(f"rank{r}.json") for r in range(4)]  # doctest: +SKIP
        >>> found = find_hints(ranks)  # doctest: +SKIP
        >>> found[0].title  # doctest: +SKIP
        'Straggler: worker 1 is busy 1.31 x as long as the median of the others'
    """
    items = [traces] if isinstance(traces, Trace) else list(traces)
    for t in items:
        if not isinstance(t, Trace):
            raise TypeError(f"find_hints takes loaded Traces (mxprof.load), got {t!r}")
    procs = _processes(items)
    found = [rule(items, procs) for rule in _RULES]
    hints = [h for h in found if h is not None]
    hints.sort(key=lambda h: _SEVERITY_RANK[h.severity])
    return hints


# ---- what the rules read: processes, threads, steps, counters ----


@dataclass
class _Steps:
    name: str
    tid: Id
    index: list[int]
    ranges: list[Event]

    @property
    def span(self) -> Span:
        return self.ranges[0].ts, max(e.end for e in self.ranges)


@dataclass
class _Process:
    pid: Id
    source: int  # index of its trace in find_hints' input
    label: str = ""
    role: str = ""
    start: int = 2**63
    end: int = -(2**63)
    threads: dict[Id, list[Event]] = field(default_factory=dict)
    thread_names: dict[Id, str] = field(default_factory=dict)
    durations: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    counters: dict[tuple[str, str], list[Event]] = field(default_factory=dict)
    step_groups: dict[tuple[Id, str], list[Event]] = field(default_factory=dict)
    steps: _Steps | None = None

    @property
    def wall(self) -> int:
        return self.end - self.start

    def thread_label(self, tid: Id) -> str:
        name = self.thread_names.get(tid)
        return f"thread {_q(name)} (tid {tid})" if name else f"tid {tid}"


def _processes(traces: list[Trace]) -> list[_Process]:
    procs: list[_Process] = []
    labels: set[str] = set()
    frames: dict[str, bool] = {}  # category -> whether its ranges are frames
    profiler_steps: dict[str, bool] = {}  # name -> whether it is ProfilerStep#N
    for i, trace in enumerate(traces):
        mine: dict[Id, _Process] = {}
        p = _Process(pid="", source=i)
        thread: list[Event] = []
        tid: object = None
        for e in trace.events:  # sorted by pid, tid, ts: one list per thread at a time
            if not mine or e.pid != p.pid:
                p = mine.get(e.pid) or mine.setdefault(e.pid, _Process(e.pid, i))
                tid = None
            ts, dur = e.ts, e.dur
            if ts < p.start:
                p.start = ts
            if dur is None:
                if ts > p.end:
                    p.end = ts
                if e.ph == "C":
                    p.counters.setdefault((e.category, e.name), []).append(e)
                continue
            if ts + dur > p.end:
                p.end = ts + dur
            if e.tid != tid:
                tid = e.tid
                thread = p.threads.setdefault(e.tid, [])
            thread.append(e)
            category = e.category
            frame = frames.get(category)
            if frame is None:
                frame = frames[category] = is_frame(category)
            if frame:
                p.step_groups.setdefault((tid, e.name), []).append(e)
                continue
            name = e.name
            stepping = profiler_steps.get(name)
            if stepping is None:
                stepping = profiler_steps[name] = is_profiler_step(name)
            if stepping:
                p.step_groups.setdefault((tid, "ProfilerStep#"), []).append(e)
        if len(mine) == 1:  # one process: its durations by name are the trace's
            for p in mine.values():
                p.durations = trace.durations()
        else:
            for e in trace.events:
                if e.dur is not None:
                    mine[e.pid].durations.setdefault((e.name, e.category), []).append(e.dur)
        for p in mine.values():
            p.role, p.label = _label(traces, i, p.pid, len(mine))
            if p.label in labels:
                p.label += f" (pid {p.pid}, {_file_label(trace, i)})"
            labels.add(p.label)
            p.thread_names = {t: n for (q, t), n in trace.thread_names.items() if q == p.pid}
            for samples in p.counters.values():
                samples.sort(key=lambda e: e.ts)
            for durations in p.durations.values():
                durations.sort()  # (already sorted when they are the trace's)
            p.steps = _pick_steps(p)
        procs.extend(mine.values())
    return procs


def _label(traces: list[Trace], i: int, pid: Id, pids: int) -> tuple[str, str]:
    """(role, label) of a process: see the module docstring."""
    trace = traces[i]
    info = trace.metadata.get("distributedInfo")
    m = _DIST_LABEL.match(trace.process_names.get(pid, ""))
    if isinstance(info, dict) and "rank" in info and pids == 1:
        role = str(info.get("role") or "worker")
        return role, f"{role} {info['rank']}"
    if m is not None:
        return m.group(1), f"{m.group(1)} {m.group(2)}"
    where = f" ({_file_label(trace, i)})" if len(traces) > 1 else ""
    return "", f"pid {pid}{where}"


def _pick_steps(p: _Process) -> _Steps | None:
    if not p.step_groups:
        return None
    (tid, name), ranges = max(
        p.step_groups.items(), key=lambda kv: (len(kv[1]), sum(e.dur or 0 for e in kv[1]))
    )
    index = [step_number(e, k) for k, e in enumerate(ranges)]
    return _Steps(name, tid, index, ranges)


def _file_label(trace: Trace, i: int) -> str:
    return os.path.basename(trace.path) if trace.path else f"trace {i + 1}"


def _words(text: str) -> set[str]:
    parts = [w.lower() for w in _WORD.findall(text)]
    return set(parts) | {a + b for a, b in zip(parts, parts[1:])}


def _is_loading(name: str, category: str, cache: dict[tuple[str, str], bool]) -> bool:
    known = cache.get((name, category))
    if known is None:
        words = _words(name)
        known = bool(
            words & LOADING_WORDS
            or ("data" in words and "parallel" not in words)
            or (words & {"batch", "batches"} and words & BATCH_VERBS)
            or (not is_frame(category) and _words(category) & (LOADING_WORDS | {"input"}))
        )
        cache[(name, category)] = known
    return known


def _is_comm(name: str, cache: dict[str, bool]) -> bool:
    known = cache.get(name)
    if known is None:
        known = cache[name] = bool(_words(name) & COMM_WORDS)
    return known


# ---- interval arithmetic on spans sorted by start ----


def _union(spans: Iterable[Span]) -> list[Span]:
    out: list[list[int]] = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _measure(spans: Iterable[Span] | Iterable[list[int]]) -> int:
    return sum(b - a for a, b in spans)


def _overlap(xs: list[Span], ys: list[Span]) -> int:
    """Measure of the intersection of two disjoint, sorted span lists."""
    i = j = total = 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _clipped(ranges: Iterable[Event], lo: int, hi: int) -> Iterator[Span]:
    for e in ranges:
        if e.end > lo and e.ts < hi:
            yield max(e.ts, lo), min(e.end, hi)


# ---- text ----


def _pct(share: float) -> str:
    return f"{share * 100:.1f} %" if share < 0.1 else f"{share * 100:.0f} %"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


def _q(name: str) -> str:
    return f"'{display(name)}'"


def _capped(lines: list[str], limit: int = MAX_LINES) -> list[str]:
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"... and {len(lines) - limit} more"]


def _hint(
    rule: str,
    severity: str,
    title: str,
    evidence: Iterable[str],
    suggestion: str,
    subjects: Iterable[str],
) -> Hint:
    return Hint(rule, severity, title, tuple(evidence), suggestion, tuple(dict.fromkeys(subjects)))


def _where(p: _Process, procs: list[_Process]) -> str:
    """The process's label as an evidence line's prefix, when several have ranges
    (a Kineto file has pseudo-processes holding only its own metadata)."""
    return f"{p.label}: " if sum(1 for q in procs if q.threads) > 1 else ""


# ---- the rules ----

Rule = Callable[[list[Trace], list[_Process]], Optional[Hint]]


def _data_loading(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    cache: dict[tuple[str, str], bool] = {}
    found = []  # (share, process, tid, basis, lo, hi, loading ranges)
    for p in procs:
        if p.steps is not None:
            steps = p.steps.ranges
            tids: list[Id] = [p.steps.tid]
            (lo, hi), basis = p.steps.span, "step time"
        else:
            steps, tids, (lo, hi), basis = [], list(p.threads), (p.start, p.end), "wall time"
        if hi <= lo:
            continue
        starts = [e.ts for e in steps]
        best: tuple[int, Id, list[Event]] | None = None
        for tid in tids:
            ranges, other, open_end = [], False, lo - 1
            for e in p.threads.get(tid, ()):
                ts = e.ts
                if (
                    _is_loading(e.name, e.category, cache)
                    and not is_frame(e.category)
                    and not is_profiler_step(e.name)
                    and not _holds_a_step(e, steps, starts)
                ):
                    ranges.append(e)
                elif ts >= open_end:
                    other = True  # a top-level range that is not loading
                end = ts + (e.dur or 0)
                if end > open_end:
                    open_end = end
            if not steps and not other:
                continue  # a thread that only loads runs beside the work: not a stall
            covered = _measure(_union(_clipped(ranges, lo, hi)))
            if ranges and (best is None or covered > best[0]):
                best = (covered, tid, ranges)
        if best is not None and best[0] / (hi - lo) >= LOADING_SHARE:
            found.append((best[0] / (hi - lo), p, best[1], basis, lo, hi, best[2]))
    if not found:
        return None
    found.sort(key=lambda f: -f[0])
    top_share, _, _, top_basis, *_ = found[0]
    evidence, subjects, names = [], [], []
    for share, p, tid, basis, lo, hi, ranges in found:
        loading = share * (hi - lo)
        line = (
            f"{_where(p, procs)}loading ranges cover {format_ns(loading)} of "
            f"{format_ns(hi - lo)} {basis} ({_pct(share)}) on {p.thread_label(tid)}"
        )
        if p.steps is not None:
            n = len(p.steps.ranges)
            line += (
                f", over {n} steps {_q(p.steps.name)}: {format_ns(loading / n)} of "
                f"{format_ns((hi - lo) / n)} per step"
            )
        evidence.append(line)
        per_name: dict[str, list[int]] = {}
        for e in ranges:
            if e.end > lo and e.ts < hi:
                got = per_name.setdefault(e.name, [0, 0])
                got[0] += 1
                got[1] += min(e.end, hi) - max(e.ts, lo)
        for name, (count, total) in sorted(per_name.items(), key=lambda kv: -kv[1][1])[:5]:
            evidence.append(
                f"  {_q(name)}: {count} ranges, {format_ns(total)} ({_pct(total / (hi - lo))})"
            )
            subjects.append(name)
            names.append(name)
        if _where(p, procs):
            subjects.append(p.label)
    return _hint(
        "data-loading",
        "high" if top_share >= LOADING_SHARE_HIGH else "medium",
        f"Data loading takes {_pct(top_share)} of {top_basis}",
        _capped(evidence, 3 * MAX_LINES),
        f"The loop waits for its input ({', '.join(map(_q, dict.fromkeys(names)))}): overlap "
        "loading with compute "
        "(DataLoader num_workers > 0 with persistent_workers and prefetch_factor, or a "
        "background prefetch thread), pin memory and copy with non_blocking=True, and "
        "cache or pre-decode the data set; a new profile should show these ranges shrink "
        "or move off the steps' thread.",
        subjects,
    )


def _holds_a_step(e: Event, steps: list[Event], starts: list[int]) -> bool:
    k = bisect.bisect_left(starts, e.ts)
    while k < len(steps) and starts[k] < e.end:
        if steps[k].end <= e.end:
            return True
        k += 1
    return False


def _step_variance(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    found = []
    for p in procs:
        s = p.steps
        if s is None or len(s.ranges) < MIN_STEPS:
            continue
        durs = [e.dur or 0 for e in s.ranges]
        med = statistics.median(durs)
        mad = statistics.median(abs(d - med) for d in durs)
        mean = statistics.fmean(durs)
        cv = statistics.pstdev(durs) / mean if mean else 0.0
        fence = med + max(OUTLIER_MADS * MAD_SCALE * mad, OUTLIER_MIN_EXCESS * med)
        outliers = [k for k, d in enumerate(durs) if d > fence]
        if cv >= STEP_CV or outliers:
            found.append((cv, p, s, durs, med, mean, fence, outliers))
    if not found:
        return None
    found.sort(key=lambda f: -f[0])
    evidence, subjects, severity = [], [], "low"
    for cv, p, s, durs, med, mean, fence, outliers in found:
        evidence.append(
            f"{_where(p, procs)}{len(durs)} steps {_q(s.name)}: median {format_ns(med)}, "
            f"mean {format_ns(mean)}, CV {cv:.2f} (stdev / mean; flagged from {STEP_CV})"
        )
        if outliers:
            listed = ", ".join(
                f"step {s.index[k]} {format_ns(durs[k])} ({durs[k] / med:.1f} x median)"
                for k in sorted(outliers, key=lambda k: -durs[k])[:MAX_LINES]
            )
            more = f" and {len(outliers) - MAX_LINES} more" if len(outliers) > MAX_LINES else ""
            evidence.append(
                f"  outlier steps (> {format_ns(fence)}, median + max(3 x 1.4826 x MAD, "
                f"0.5 x median)): {listed}{more}"
            )
            evidence.extend(_grown_children(p, s, outliers, durs))
        subjects += [f"step {s.index[k]}" for k in outliers] + [s.name]
        if _where(p, procs):
            subjects.append(p.label)
        excess = sum(durs[k] - med for k in outliers)
        rest = durs[WARMUP_STEPS:]
        rest_cv = statistics.pstdev(rest) / statistics.fmean(rest) if statistics.fmean(rest) else 0
        if outliers and max(outliers) < WARMUP_STEPS and rest_cv < STEP_CV:
            mine = "low"  # only warm-up steps stand out
        elif cv >= STEP_CV_HIGH or excess >= OUTLIER_EXCESS_HIGH * sum(durs):
            mine = "high"
        else:
            mine = "medium"
        severity = min(severity, mine, key=_SEVERITY_RANK.__getitem__)
    cv, p, s, durs, med, *_ = found[0]
    if severity == "low":
        title = f"The first step is {durs[0] / med:.1f} x the median step (warm-up)"
    else:
        title = f"Step time varies: CV {cv:.2f} over {len(durs)} steps"
    return _hint(
        "step-variance",
        severity,
        title,
        _capped(evidence, 3 * MAX_LINES),
        "Look at what grew in the slow steps (the ranges named above): periodic work "
        "(checkpoints, evaluation, logging), garbage collection (gc.freeze() after setup, or "
        "collect between steps), input stalls, or other processes on the machine. Slow first "
        "steps are warm-up (compilation, caches): leave them out of measurements with "
        "mxprof.profile(schedule=mxprof.schedule(wait=..., warmup=..., active=...)).",
        subjects,
    )


def _grown_children(p: _Process, s: _Steps, outliers: list[int], durs: list[int]) -> list[str]:
    """For the slowest outlier steps, the direct child whose time grew most
    against its median over all steps; the step's time in no child (None)
    is a candidate too."""
    per_step: list[dict[str | None, int]] = [{} for _ in s.ranges]
    bounds = [(e.ts, e.ts + (e.dur or 0)) for e in s.ranges]
    j, open_end, last = 0, 0, len(bounds)
    for e in p.threads.get(s.tid, []):
        ts, end = e.ts, e.ts + (e.dur or 0)
        while j < last and bounds[j][1] <= ts:
            j += 1
        if j == last:
            break
        if ts < bounds[j][0] or end > bounds[j][1] or ts < open_end or e is s.ranges[j]:
            continue  # outside the step or leaving it, a grandchild, or the step itself
        totals = per_step[j]
        totals[e.name] = totals.get(e.name, 0) + end - ts
        open_end = end
    for totals, dur in zip(per_step, durs):
        totals[None] = dur - sum(v for n, v in totals.items() if n is not None)
    names = {n for t in per_step for n in t}
    medians = {n: statistics.median(t.get(n, 0) for t in per_step) for n in names}
    lines = []
    for k in sorted(outliers, key=lambda k: -durs[k])[:3]:
        delta, name, took = max(
            ((t - medians[n], n, t) for n, t in per_step[k].items()), key=lambda g: g[0]
        )
        if delta > 0:
            what = "time in no range inside the step" if name is None else _q(name)
            lines.append(
                f"  step {s.index[k]}: {what} took {format_ns(took)} against a median of "
                f"{format_ns(medians[name])} per step (+{format_ns(delta)})"
            )
    return lines


def _tail_latency(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    pooled: dict[tuple[str, str], list[int]] = {}
    steps = {(s.ranges[0].name, s.ranges[0].category) for p in procs if (s := p.steps)}
    for p in procs:
        for key, durations in p.durations.items():
            if key not in steps and not is_profiler_step(key[0]):
                pooled.setdefault(key, []).extend(durations)
    found = []
    for (name, category), durations in pooled.items():
        if len(durations) < TAIL_MIN_COUNT:
            continue
        durations.sort()  # runs already sorted per process: timsort merges them
        p50, p99 = _rank(durations, 50), _rank(durations, 99)
        if p99 >= TAIL_MIN_P99_NS and p99 >= TAIL_RATIO * max(p50, 1):
            found.append((p99 / max(p50, 1), name, category, durations, p50, p99))
    if not found:
        return None
    found.sort(key=lambda f: (-f[0], f[1]))
    evidence = []
    for ratio, name, category, durations, p50, p99 in found:
        slowest = durations[-max(1, len(durations) // 100) :]
        evidence.append(
            f"{_q(name)} ({display(category) or 'no category'}): {len(durations):,} ranges, "
            f"P50 {format_ns(p50)}, P90 {format_ns(_rank(durations, 90))}, P99 "
            f"{format_ns(p99)} ({ratio:.1f} x P50), max {format_ns(durations[-1])}; the slowest "
            f"1 % take {format_ns(sum(slowest))}"
        )
    ratio, name, *_ = found[0]
    return _hint(
        "tail-latency",
        "medium" if ratio >= TAIL_RATIO_MEDIUM else "low",
        f"Tail latency: P99 of {_q(name)} is {ratio:.1f} x its P50",
        _capped(evidence),
        "A few calls are much slower than the typical one: sort these ranges by duration in "
        "the timeline (Perfetto) and look at what overlaps the slowest (garbage collection, "
        "a lock or queue wait, I/O, another thread holding the GIL, a cold cache); then make "
        "the slow path rare (warm up, preallocate, batch) or move it off the critical path.",
        [f[1] for f in found],
    )


def _rank(ordered: list[int], percent: int) -> int:
    """The nearest-rank percentile, as Trace.key_averages computes it."""
    return ordered[max(-(-percent * len(ordered) // 100), 1) - 1]


def _overhead(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    found = []
    for p in procs:
        if not _written_by_mxprof(traces[p.source]) or p.wall <= 0:
            continue
        short = [
            (len(d), name, d)
            for (name, _), d in p.durations.items()
            if _rank(d, 50) <= SHORT_RANGE_NS
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
            f"{_where(p, procs)}{count:,} ranges of {_plural(len(short), 'name')} "
            f"with a median of at most "
            f"{format_ns(SHORT_RANGE_NS)}: at {RANGE_COST_NS} ns each, about "
            f"{format_ns(count * RANGE_COST_NS)} of instrumentation, {_pct(share)} of wall time "
            f"{format_ns(p.wall)} and {_pct(count * RANGE_COST_NS / max(traced, 1))} of the "
            f"{format_ns(traced)} those ranges recorded"
        )
        for n, name, d in short[:5]:
            evidence.append(
                f"  {_q(name)}: {n:,} ranges, median {format_ns(_rank(d, 50))}, about "
                f"{format_ns(n * RANGE_COST_NS)} of instrumentation"
            )
            subjects.append(name)
    share = found[0][0]
    return _hint(
        "instrumentation-overhead",
        "high" if share >= OVERHEAD_SHARE_HIGH else "medium",
        f"Instrumentation may cost about {_pct(share)} of wall time (many very short ranges)",
        _capped(evidence, 3 * MAX_LINES),
        f"Each range costs about {RANGE_COST_NS} ns (benchmarks/calls.py): time the enclosing "
        "loop or batch once instead of every call of the ranges above, or count the calls "
        "with a Counter; keep per-call ranges for short, focused runs.",
        subjects,
    )


def _written_by_mxprof(trace: Trace) -> bool:
    other = trace.metadata.get("otherData")
    return isinstance(other, dict) and "mxprof_version" in other


def _memory(p: _Process) -> Iterator[tuple[str, list[Event]]]:
    for (category, name), samples in sorted(p.counters.items()):
        if category == "Device Storage" and name.startswith("Memory: "):
            yield name[len("Memory: ") :], samples


def _value(e: Event) -> float:
    v = e.args.get(e.name)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        v = next((x for x in e.args.values() if isinstance(x, (int, float))), 0)
    return float(v)


def _value_at(samples: list[Event], times: list[int], t: int) -> float:
    k = bisect.bisect_right(times, t)
    return _value(samples[k - 1]) if k else 0.0


def _scopes(p: _Process) -> list[tuple[str, list[Event], list[int]]]:
    return [
        (name, samples, [e.ts for e in samples])
        for (category, name), samples in sorted(p.counters.items())
        if category == "Scope Storage"
    ]


def _memory_peak(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    found = []
    for p in procs:
        devices = list(_memory(p))
        for device, samples in devices:
            peak = max(samples, key=_value)  # the first sample at the peak
            if _value(peak) > 0:
                found.append((_value(peak), p, device, peak, samples, len(devices)))
    if not found:
        return None
    found.sort(key=lambda f: -f[0])
    evidence, subjects, holders, unknown = [], [], [], False
    for value, p, device, peak, samples, ndev in found:
        where = [_q(e.name) for e in _open_at(p.threads.get(peak.tid, []), peak.ts)]
        step = _step_at(p, peak.ts)
        evidence.append(
            f"{_where(p, procs)}{device}: peak {_bytes(value)} at {format_ns(peak.ts)}"
            + (f" in step {step}" if step is not None else "")
            + (f", inside {' > '.join(where)}" if where else "")
            + f"; {_bytes(_value(samples[-1]))} in use at the last sample"
        )
        held = sorted(
            ((_value_at(s, ts, peak.ts), name) for name, s, ts in _scopes(p)), reverse=True
        )
        held = [(v, name) for v, name in held if v > 0][:5]
        unknown |= not held or any(name == "<unk>:" for _, name in held)
        if held and ndev == 1:
            evidence.append(
                "  scopes holding it: "
                + ", ".join(f"{_q(n)} {_bytes(v)} ({_pct(v / value)})" for v, n in held)
            )
            subjects += [device, held[0][1]]
        elif held:  # a scope's counter adds up its bytes on every device
            evidence.append(
                "  scopes in use then, on all devices together: "
                + ", ".join(f"{_q(n)} {_bytes(v)}" for v, n in held)
            )
            subjects.append(device)
        else:
            subjects.append(device)
        holders.append(held[0][1] if held and ndev == 1 else None)
        if _where(p, procs):
            subjects.append(p.label)
    value, p, device, *_ = found[0]
    holder = f", most held by scope {_q(holders[0])}" if holders[0] else ""
    return _hint(
        "memory-peak",
        "low",
        f"Memory peaks at {_bytes(value)} on {device}{holder}",
        _capped(evidence, 3 * MAX_LINES),
        "To lower the peak, shrink what the holding scope keeps alive at that moment: free "
        "or reuse buffers sooner, a smaller batch, recompute activations instead of keeping "
        "them (checkpointing)."
        + (
            " Allocations outside any scope show as '<unk>:': wrap the code that allocates "
            "in mxprof.scope('name') to see who holds them."
            if unknown
            else ""
        ),
        subjects,
    )


def _open_at(ranges: list[Event], t: int) -> Iterator[Event]:
    """The ranges open at t (ts <= t < end), outermost first."""
    for e in ranges:
        if e.ts > t:
            return
        if t < e.end:
            yield e


def _step_at(p: _Process, t: int) -> int | None:
    if p.steps is None:
        return None
    for k, e in enumerate(p.steps.ranges):
        if e.ts <= t < e.end:
            return p.steps.index[k]
    return None


def _memory_growth(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    found = []
    for p in procs:
        s = p.steps
        if s is None or len(s.ranges) < MIN_STEPS:
            continue
        ends = [e.end for e in s.ranges]
        for device, samples in _memory(p):
            times = [e.ts for e in samples]
            values = [_value_at(samples, times, t) for t in ends]
            rises = sum(b > a for a, b in zip(values, values[1:]))
            growth = values[-1] - values[0]
            if (
                rises >= GROWTH_RISING_SHARE * (len(values) - 1)
                and growth > 0
                and growth >= GROWTH_MIN_SHARE * values[-1]
            ):
                found.append((growth, p, device, values, rises))
    if not found:
        return None
    found.sort(key=lambda f: -f[0])
    evidence, subjects = [], []
    for growth, p, device, values, rises in found:
        s = p.steps
        assert s is not None
        n = len(values)
        evidence.append(
            f"{_where(p, procs)}{device}: {_bytes(values[0])} in use at the end of step "
            f"{s.index[0]}, {_bytes(values[-1])} at the end of step {s.index[-1]} "
            f"(+{_bytes(growth / (n - 1))} per step); it rose in {rises} of {n - 1} steps"
        )
        ends = [e.end for e in s.ranges]
        grown = []
        for name, samples, times in _scopes(p):
            first, last = _value_at(samples, times, ends[0]), _value_at(samples, times, ends[-1])
            if last > first:
                grown.append((last - first, name))
        for delta, name in sorted(grown, reverse=True)[:3]:
            evidence.append(f"  scope {_q(name)} grew by {_bytes(delta)} over those steps")
            subjects.append(name)
        subjects.append(device)
        if _where(p, procs):
            subjects.append(p.label)
    growth, p, device, values, _ = found[0]
    return _hint(
        "memory-growth",
        "medium",
        f"Memory on {device} grows step over step (+{_bytes(growth)} over {len(values)} steps)",
        _capped(evidence, 3 * MAX_LINES),
        "Something allocated in each step outlives it (a leak): look in the scopes above for "
        "tensors kept in a list (a loss kept with its graph: store loss.item()), caches "
        "without a bound, or references held past the step; in a healthy loop the bytes in "
        "use at step ends stay level.",
        subjects,
    )


def _straggler(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    if sum(1 for p in procs if p.threads) < 2:
        return None  # one process with ranges: no rank to compare with
    found = analyze_ranks(traces)
    if found.straggler is not None:
        return _late_rank(found)
    if found.matched:  # collectives say who waits for whom: busy time would mislead
        return None
    return _busiest(procs)


def _late_rank(found: RankAnalysis) -> Hint:
    """The straggler the cross-rank analysis names (mxprof.report.ranks)."""
    s = found.straggler
    assert s is not None
    steps = [m["total"] for m in found.per_rank().values()]
    step = statistics.median(steps) if found.step_name and steps else 0.0
    what = f" ({_pct(s.waited_for / step)} of a step)" if step else ""
    return _hint(
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


def _busiest(procs: list[_Process]) -> Hint | None:
    """Without collectives: the rank busy beyond the others."""
    cache: dict[str, bool] = {}
    by_role: dict[str, list[_Process]] = {}
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
    evidence = _capped(evidence)
    evidence.append(f"median of the others: {format_ns(others)}; {slow.label}: {ratio:.2f} x")
    excess = []
    for name, took in rows[0][2].items():
        typical = statistics.median(r[2].get(name, 0) for r in rows[1:])
        if took > typical:
            excess.append((took - typical, name, took, typical))
    for delta, name, took, typical in sorted(excess, reverse=True)[:3]:
        evidence.append(
            f"  {_q(name)} on {slow.label}: {format_ns(took)} against a median of "
            f"{format_ns(typical)} on the others (+{format_ns(delta)})"
        )
    return _hint(
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
    p: _Process, per_step: bool, cache: dict[str, bool]
) -> tuple[float, float, dict[str, float], _Process] | None:
    """(busy, communication, time by name) on the process's main thread, per
    step when per_step; None when it has no ranges."""
    if p.steps is not None:
        tid: Id = p.steps.tid
        lo, hi = p.steps.span
    elif p.threads:
        tid = max(p.threads, key=lambda t: _measure(_union((e.ts, e.end) for e in p.threads[t])))
        lo, hi = p.start, p.end
    else:
        return None
    work: list[list[int]] = []
    comm: list[list[int]] = []
    by_name: dict[str, float] = {}
    for e in p.threads[tid]:  # in ts order, so clipped starts stay in order
        a, b = max(e.ts, lo), min(e.end, hi)
        if b <= a:
            continue
        by_name[e.name] = by_name.get(e.name, 0) + b - a
        spans = comm if _is_comm(e.name, cache) else work
        if spans and a <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], b)
        else:
            spans.append([a, b])
    n = len(p.steps.ranges) if per_step and p.steps is not None else 1
    busy = _measure(work) - _overlap([(a, b) for a, b in work], [(a, b) for a, b in comm])
    return busy / n, _measure(comm) / n, {k: v / n for k, v in by_name.items()}, p


def _dropped(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    evidence, subjects, total = [], [], 0
    for i, t in enumerate(traces):
        n = _tally(t, "dropped_events")
        if n:
            total += n
            evidence.append(
                f"{_file_label(t, i)}: {n:,} events dropped (otherData.dropped_events); "
                f"{len(t):,} events in the file"
            )
            subjects.append(_file_label(t, i))
    if not total:
        return None
    return _hint(
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


def _tally(trace: Trace, key: str) -> int:
    other = trace.metadata.get("otherData")
    value = other.get(key) if isinstance(other, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _misuse(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    evidence, fixes, subjects, serious = [], [], [], False
    for key, (meaning, fix) in TALLIES.items():
        counts = [(t, i, _tally(t, key)) for i, t in enumerate(traces)]
        counts = [c for c in counts if c[2]]
        if not counts:
            continue
        serious |= key in _SERIOUS_TALLIES
        where = ", ".join(f"{_file_label(t, i)}: {n:,}" for t, i, n in counts)
        evidence.append(f"{key} = {sum(n for *_, n in counts):,}: {meaning} ({where})")
        fixes.append(f"{key}: {fix}")
        subjects.append(key)
    if not set(subjects) - {"ignored_calls"}:
        return None  # calls while paused or between scheduled cycles are expected
    return _hint(
        "misuse",
        "medium" if serious else "low",
        f"Instrumentation tallies: {', '.join(subjects)}",
        evidence,
        "; ".join(fixes) + ".",
        subjects,
    )


def _idle_gaps(traces: list[Trace], procs: list[_Process]) -> Hint | None:
    gaps = []  # (length, process, tid, start, end, before, after)
    idle: dict[tuple[int, Id], int] = {}
    for p in procs:
        floor = max(GAP_MIN_NS, GAP_WALL_SHARE * p.wall)
        for tid, ranges in p.threads.items():
            end, last = None, ""
            for e in ranges:
                ts = e.ts
                if end is not None and ts > end:
                    length = ts - end
                    if length >= floor or length >= GAP_ABS_NS:
                        gaps.append((length, p, tid, end, ts, last, e.name))
                        idle[(id(p), tid)] = idle.get((id(p), tid), 0) + length
                stop = ts + (e.dur or 0)
                if end is None or stop > end:
                    end, last = stop, e.name
    if not gaps:
        return None
    gaps.sort(key=lambda g: -g[0])
    evidence, subjects = [], []
    for length, p, tid, a, b, before, after in gaps:
        between = ""
        if p.steps is not None and p.steps.tid == tid:
            k = bisect.bisect_right([e.end for e in p.steps.ranges], a) - 1
            if 0 <= k < len(p.steps.ranges) - 1 and p.steps.ranges[k + 1].ts >= b:
                idx = p.steps.index
                between = f" (between steps {idx[k]} and {idx[k + 1]})"
        evidence.append(
            f"{_where(p, procs)}{p.thread_label(tid)}: {format_ns(length)} "
            f"({_pct(length / p.wall)} of wall time) from {format_ns(a)} to {format_ns(b)}, "
            f"after {_q(before)}, before {_q(after)}{between}"
        )
        subjects += [before, after] + ([p.label] if _where(p, procs) else [])
    length, p, tid, *_ = gaps[0]
    worst = max(idle.items(), key=lambda kv: kv[1])
    wp = next(q for q in procs if id(q) == worst[0][0])
    share = worst[1] / wp.wall
    return _hint(
        "idle-gap",
        "medium" if share >= GAP_SHARE_MEDIUM else "low",
        f"{_pct(share)} of wall time on {wp.thread_label(worst[0][1])} has no range open "
        f"({_plural(sum(1 for g in gaps if (id(g[1]), g[2]) == worst[0]), 'long gap')})",
        _capped(evidence),
        "Nothing was recorded there: either work without a range (put one around the code "
        "that runs between the ranges named above) or the thread waiting (I/O, a lock, a "
        "queue, sleep, another process); a range around the waiting call shows which.",
        subjects,
    )


_RULES: tuple[Rule, ...] = (
    _data_loading,
    _step_variance,
    _tail_latency,
    _overhead,
    _memory_peak,
    _memory_growth,
    _straggler,
    _dropped,
    _misuse,
    _idle_gaps,
)
