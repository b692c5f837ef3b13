"""The input rule (``data-loading``): a loop that waits for its input, found
three ways, whichever the trace holds.

- *Loading ranges*: ranges named or filed as loading (``LOADING_WORDS`` ...)
  cover a share of step time on the steps' thread (without steps: of wall
  time, on a thread that does other work too, not one that only loads).
- *Samples*: the stack samples of the main thread (the steps' thread, else
  ``MainThread``, else the thread whose tid is the pid) inside the steps
  are in a call that waits for input (``INPUT_CALLS``: a queue's ``get``, a
  pipe's ``recv``, a DataLoader iterator's ``__next__`` ...) in a share of
  the samples; a sampler takes every thread at a fixed rate, so the share of
  samples is the share of time.  The evidence names the waiting frames and
  the busiest other thread of the process (the producer) then.
- *Time in no range*: on the steps' thread, time inside no range
  (``trace.processes``) during which another thread of the process is in
  loading ranges: the loop waits in uninstrumented code for a loader that
  is busy.  Without loading names on the other thread nothing is claimed:
  a busy thread alone does not say the loop waits for it.

It fires from ``LOADING_SHARE`` (20 %) of step time (a fifth of the step
spent waiting for input is worth overlapping), high from 40 %, with at
least ``MIN_SAMPLES`` samples for the sampled way.
"""

from __future__ import annotations

import bisect
import operator
import os
from collections import Counter
from itertools import accumulate, compress, repeat
from itertools import count as counting
from operator import add, and_, ge

from ..._render import format_ns
from ...trace import Event
from ...trace._columns import NO_DUR, Ranges, Thread
from ...trace.processes import Id, Process
from ...trace.samples import Frame, Sample
from ...trace.steps import is_frame, is_profiler_step
from ._common import (
    MAX_LINES,
    Hint,
    Job,
    Span,
    capped,
    clipped,
    frame_text,
    hint,
    measure,
    overlap,
    pct,
    plural,
    quoted,
    union,
    words,
)

LOADING_SHARE = 0.20
LOADING_SHARE_HIGH = 0.40
MIN_SAMPLES = 20  # samples of the main thread the sampled way needs
WAITING = "<waiting>"  # the sampler's frame for a blocked thread (wall mode)

# fmt: off
LOADING_WORDS = frozenset({
    "load", "loads", "loading", "loader", "loaders", "dataloader", "fetch", "fetches",
    "fetching", "prefetch", "prefetcher", "collate",
})
BATCH_VERBS = frozenset({"get", "next", "iter", "read", "sample"})
# The calls in which a thread waits for (or makes) its input, by qualified name
# (co_qualname, Python 3.11+) and the files that define them; before 3.11 a
# frame has only the last part of the name, matched with the file.
INPUT_CALLS = {
    "Queue.get": ("queue.py", "queues.py"),  # queue, multiprocessing, asyncio
    "SimpleQueue.get": ("queues.py",),
    "Connection.recv": ("connection.py",),
    "Connection.recv_bytes": ("connection.py",),
    "Connection._recv_bytes": ("connection.py",),
    "Connection.poll": ("connection.py",),
    "_BaseDataLoaderIter.__next__": ("dataloader.py",),
    "_MultiProcessingDataLoaderIter._next_data": ("dataloader.py",),
    "_MultiProcessingDataLoaderIter._get_data": ("dataloader.py",),
    "_MultiProcessingDataLoaderIter._try_get_data": ("dataloader.py",),
    "_SingleProcessDataLoaderIter._next_data": ("dataloader.py",),
}
# fmt: on
_SHORT: dict[tuple[str, str], str] = {}
for _name, _files in INPUT_CALLS.items():
    for _file in _files:
        _SHORT.setdefault((_name.rsplit(".", 1)[-1], _file), _name)  # the first listed wins


def is_loading(name: str, category: str, cache: dict[tuple[str, str], bool]) -> bool:
    """Whether a range is loading by its name or its domain (module docstring)."""
    known = cache.get((name, category))
    if known is None:
        found = words(name)
        known = bool(
            found & LOADING_WORDS
            or ("data" in found and "parallel" not in found)
            or (found & {"batch", "batches"} and found & BATCH_VERBS)
            or (not is_frame(category) and words(category) & (LOADING_WORDS | {"input"}))
        )
        cache[(name, category)] = known
    return known


def input_call(frame: Frame, cache: dict[Frame, str | None]) -> str | None:
    """The INPUT_CALLS name of a frame, None when it is no input call."""
    if frame in cache:
        return cache[frame]
    function, file, _ = frame
    base = os.path.basename(file)
    found = function if base in INPUT_CALLS.get(function, ()) else _SHORT.get((function, base))
    cache[frame] = found
    return found


class _Found:
    """One process's evidence that its loop waits for input."""

    def __init__(self, p: Process, share: float, basis: str) -> None:
        self.p, self.share, self.basis = p, share, basis
        self.lines: list[str] = []
        self.subjects: list[str] = []
        self.names: list[str] = []
        self.ranged = False  # found by loading ranges on the waiting thread


def data_loading(job: Job) -> Hint | None:
    """The loop waits for its input: loading ranges, samples, or time in no range."""
    cache: dict[tuple[str, str], bool] = {}
    frames: dict[Frame, str | None] = {}
    found: list[_Found] = []
    for p in job.procs:
        ways = [
            _by_ranges(job, p, cache),
            _by_samples(job, p, frames),
            _by_no_range(job, p, cache),
        ]
        fired = [w for w in ways if w is not None and w.share >= LOADING_SHARE]
        if not fired:
            continue
        fired.sort(key=lambda w: -w.share)
        top = fired[0]
        for w in fired[1:]:
            top.lines += w.lines
            top.subjects += w.subjects
            top.names += w.names
        found.append(top)
    if not found:
        return None
    found.sort(key=lambda f: -f.share)
    first = found[0]
    evidence: list[str] = []
    subjects: list[str] = []
    names: list[str] = []
    for f in found:
        evidence += f.lines
        subjects += f.subjects
        names += f.names
        if job.where(f.p):
            subjects.append(f.p.label)
    title = (
        f"Data loading takes {pct(first.share)} of {first.basis}"
        if first.ranged
        else f"The loop waits for its input {pct(first.share)} of {first.basis}"
    )
    what = f" ({', '.join(map(quoted, dict.fromkeys(names)))})" if names else ""
    return hint(
        "data-loading",
        "high" if first.share >= LOADING_SHARE_HIGH else "medium",
        title,
        capped(evidence, 3 * MAX_LINES),
        f"The loop waits for its input{what}: overlap loading with compute "
        "(DataLoader num_workers > 0 with persistent_workers and prefetch_factor, or a "
        "background prefetch thread feeding a deeper queue), pin memory and copy with "
        "non_blocking=True, and make the producer faster (cache or pre-decode the data "
        "set); a new profile should show the wait shrink or move off the steps' thread.",
        subjects,
    )


def _by_ranges(job: Job, p: Process, cache: dict[tuple[str, str], bool]) -> _Found | None:
    """Loading ranges on the steps' thread (without steps: the thread with the
    most loading time that also does other work)."""
    if p.steps is not None:
        steps = p.steps.ranges
        tids = [p.steps.tid]
        (lo, hi), basis = p.steps.span, "step time"
    else:
        steps, tids, (lo, hi), basis = [], list(p.threads), (p.start, p.end), "wall time"
    if hi <= lo:
        return None
    starts = [e.ts for e in steps]
    best: tuple[int, Id, list[Event]] | None = None
    for tid in tids:
        ranges: list[Event] = []
        found = p.threads.get(tid)
        if found is None:
            continue
        thread = found.thread
        names, categories = thread.keys.names, thread.keys.categories
        # The kind values (trace/_columns.py) of loading ranges that are no step.
        loads = {
            k
            for k in range(len(names))
            if is_loading(names[k], categories[k], cache)
            and not is_frame(categories[k])
            and not is_profiler_step(names[k])
        }
        kinds = loads | {-(j + 1) for j, (k, _) in enumerate(thread.extras) if k in loads}
        ts_col, dur_col = thread.ts, thread.dur
        # An Event made only for loading ranges; the others are read by the
        # C loops of map/compress, not one by one.
        for i in compress(counting(), map(kinds.__contains__, thread.kind)):
            d = dur_col[i]
            if d == NO_DUR:
                continue
            ts = ts_col[i]
            if not _holds_a_step(ts, ts + d, steps, starts):
                ranges.append(thread.event(i))
        # Without steps (no range holds one): whether the thread does other
        # work, a top-level range that is not loading.
        other = not steps and _other_top_level(thread, kinds, lo - 1)
        if not steps and not other:
            continue  # a thread that only loads runs beside the work: not a stall
        covered = measure(union(clipped(ranges, lo, hi)))
        if ranges and (best is None or covered > best[0]):
            best = (covered, tid, ranges)
    if best is None:
        return None
    loading, tid, ranges = best
    f = _Found(p, loading / (hi - lo), basis)
    f.ranged = True
    line = (
        f"{job.where(p)}loading ranges cover {format_ns(loading)} of "
        f"{format_ns(hi - lo)} {basis} ({pct(f.share)}) on {p.thread_label(tid)}"
    )
    if p.steps is not None:
        n = len(p.steps.ranges)
        line += (
            f", over {n} steps {quoted(p.steps.name)}: {format_ns(loading / n)} of "
            f"{format_ns((hi - lo) / n)} per step"
        )
    f.lines.append(line)
    per_name: dict[str, list[int]] = {}
    for e in ranges:
        if e.end > lo and e.ts < hi:
            got = per_name.setdefault(e.name, [0, 0])
            got[0] += 1
            got[1] += min(e.end, hi) - max(e.ts, lo)
    for name, (count, total) in sorted(per_name.items(), key=lambda kv: -kv[1][1])[:5]:
        f.lines.append(
            f"  {quoted(name)}: {count} ranges, {format_ns(total)} ({pct(total / (hi - lo))})"
        )
        f.subjects.append(name)
        f.names.append(name)
    return f


def _other_top_level(thread: Thread, loads: set[int], floor: int) -> bool:
    """Whether a range of the thread that is not loading (its kind value not
    in loads) starts at or after the end of every range before it (and at or
    after floor)."""
    ts, dur, kind = thread.ts, thread.dur, thread.kind
    # The latest end before each event, floor first; a point's NO_DUR puts
    # its end below any time, and its start too (it is no range).
    before = accumulate(map(add, ts, dur), max, initial=floor)
    starts = map(add, ts, map(min, dur, repeat(0)))
    top = map(ge, starts, before)
    return any(map(and_, top, map(operator.not_, map(loads.__contains__, kind))))


def _loading(ranges: Ranges, cache: dict[tuple[str, str], bool]) -> list[Event]:
    """A thread's loading ranges (an Event made for these only)."""
    thread = ranges.thread
    names, categories = thread.keys.names, thread.keys.categories
    wanted = {k for k in range(len(names)) if is_loading(names[k], categories[k], cache)}
    return [thread.event(i) for i, _, _, k in thread.range_columns() if k in wanted]


def _holds_a_step(ts: int, end: int, steps: list[Event], starts: list[int]) -> bool:
    k = bisect.bisect_left(starts, ts)
    while k < len(steps) and starts[k] < end:
        if steps[k].end <= end:
            return True
        k += 1
    return False


def _main_thread(p: Process, samples: list[Sample]) -> Id | None:
    """The thread whose waits matter: the steps', MainThread, tid = pid, most samples."""
    if p.steps is not None:
        return p.steps.tid
    for tid, name in p.thread_names.items():
        if name == "MainThread":
            return tid
    tids: Counter[Id] = Counter(s.tid for s in samples)
    if p.pid in tids:
        return p.pid
    return tids.most_common(1)[0][0] if tids else None


def _by_samples(job: Job, p: Process, frames: dict[Frame, str | None]) -> _Found | None:
    """The main thread's samples in calls that wait for input."""
    mine = [s for s in job.traces[p.source].samples.samples if s.pid == p.pid]
    if not mine:
        return None
    tid = _main_thread(p, mine)
    if tid is None:
        return None
    if p.steps is not None:
        lo, hi = p.steps.span
        basis = "step time"
        inside = [s for s in mine if lo <= s.ts <= hi]
    else:
        inside = mine
        lo, hi = (min(s.ts for s in mine), max(s.ts for s in mine)) if mine else (0, 0)
        lo, hi = min(lo, p.start), max(hi, p.end)
        basis = "wall time"
    main = [s for s in inside if s.tid == tid]
    if len(main) < MIN_SAMPLES:
        return None
    waits: Counter[tuple[str, Frame]] = Counter()
    for s in main:
        call = next((c for fr in s.stack if (c := input_call(fr, frames)) is not None), None)
        if call is not None:
            waits[(call, s.stack[-1])] += 1
    waited = sum(waits.values())
    if not waited:
        return None
    f = _Found(p, waited / len(main), basis)
    thread = p.thread_label(tid)
    f.lines.append(
        f"{job.where(p)}{waited:,} of {len(main):,} stack samples of {thread} "
        f"({pct(f.share)}) are in a call waiting for input: about "
        f"{format_ns(f.share * (hi - lo))} of {format_ns(hi - lo)} {basis}"
    )
    for (call, innermost), n in waits.most_common(3):
        below = f" > {frame_text((innermost,))}" if innermost[0] != call else ""
        f.lines.append(f"  {call}{below}: {plural(n, 'sample')}")
        f.subjects.append(call)
        f.names.append(call)
    producer = _producer(p, inside, tid)
    if producer is not None:
        f.lines.append(producer)
    return f


def _producer(p: Process, samples: list[Sample], main: Id | None) -> str | None:
    """The other thread of p busiest (not waiting) in these samples, with its top frame."""
    busy: Counter[Id] = Counter()
    total: Counter[Id] = Counter()
    tops: dict[Id, Counter[Frame]] = {}
    for s in samples:
        if s.tid == main or not s.stack:
            continue
        total[s.tid] += 1
        if s.stack[-1][0] != WAITING:
            busy[s.tid] += 1
            tops.setdefault(s.tid, Counter())[s.stack[-1]] += 1
    if not busy:
        return None
    tid, n = busy.most_common(1)[0]
    frame, _ = tops[tid].most_common(1)[0]
    return (
        f"  producer: {p.thread_label(tid)} was running in {n:,} of its {total[tid]:,} "
        f"samples then ({pct(n / total[tid])}), most in {frame_text((frame,))}"
    )


def _by_no_range(job: Job, p: Process, cache: dict[tuple[str, str], bool]) -> _Found | None:
    """Time in no range on the steps' thread while another thread is loading."""
    s = p.steps
    if s is None:
        return None
    lo, hi = s.span
    if sum(s.in_no_range) + sum(s.between) < LOADING_SHARE * (hi - lo):
        return None  # too little time in no range to reach the share: spare the spans
    others = {
        tid: loading
        for tid, ranges in p.threads.items()
        if tid != s.tid and (loading := _loading(ranges, cache))
    }
    if not others:
        return None  # no loader: a busy thread alone does not say the loop waits for it
    idle = p.no_range()
    idle_ns = measure(idle)
    if hi <= lo or not idle_ns:
        return None
    best: tuple[int, Id, dict[str, int]] | None = None
    for tid, loading in others.items():
        spans: list[Span] = union((e.ts, e.end) for e in loading)
        both = overlap(idle, spans)
        if both and (best is None or both > best[0]):
            by_name: dict[str, int] = {}
            for e in loading:
                by_name[e.name] = by_name.get(e.name, 0) + measure(clipped([e], lo, hi))
            best = (both, tid, by_name)
    if best is None:
        return None
    both, tid, by_name = best
    f = _Found(p, both / (hi - lo), "step time")
    f.lines.append(
        f"{job.where(p)}{p.thread_label(s.tid)} is in no range for {format_ns(idle_ns)} of "
        f"{format_ns(hi - lo)} step time ({pct(idle_ns / (hi - lo))}); "
        f"{p.thread_label(tid)} is loading during {format_ns(both)} of it "
        f"({pct(f.share)} of step time): the loop waits for it"
    )
    for name, ns in sorted(by_name.items(), key=lambda kv: -kv[1])[:3]:
        f.lines.append(f"  producer {quoted(name)}: {format_ns(ns)} in the steps")
        f.subjects.append(name)
        f.names.append(name)
    return f
