"""Hint rules on memory: each device's peak and who held it, growth step
over step of mxprof.memory's devices, and the leak rule (``trace.leak``)
over the process memory ``memory_steps`` samples.  Peaks and the scopes in use at them are
``trace.processes``'s (``Process.memory``), the same the page's memory
section shows; sizes in binary units (``_render.format_bytes``)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import compress, count, repeat
from operator import eq

from ..._render import format_bytes, format_ns
from ...trace._columns import NO_DUR, Ranges
from ...trace.leak import (
    MIN_WINDOW,
    PROCESS_MEMORY,
    SITES,
    copy_on_read,
    first_leak,
    series,
    settings,
)
from ...trace.processes import Process, counter_value, value_at
from ._common import MAX_LINES, MIN_STEPS, Hint, Job, capped, hint, pct, quoted

HOLDERS = 5  # scopes named as in use at a peak
SITES_SHOWN = 3  # tracemalloc's growing sites named per process


def _open_at(ranges: Ranges | None, t: int) -> Iterator[str]:
    """The names of the ranges open at t (ts <= t < end), outermost first
    (read from the thread's columns: no Event made)."""
    if ranges is None:
        return
    names = ranges.thread.keys.names
    for ts, d, k in ranges.columns():
        if ts > t:
            return
        if t < ts + d:
            yield names[k]


def memory_peak(job: Job) -> Hint | None:
    """Each device's peak, where it happened, and the scopes holding it."""
    found = [(m.peak, p, m) for p in job.procs for m in p.memory if m.peak > 0]
    if not found:
        return None
    found.sort(key=lambda f: -f[0])
    evidence, subjects, unknown = [], [], False
    for value, p, m in found:
        where = [quoted(name) for name in _open_at(p.threads.get(m.tid), m.at)]
        step = p.step_at(m.at)
        evidence.append(
            f"{job.where(p)}{m.device}: peak {format_bytes(value)} at {format_ns(m.at)}"
            + (f" in step {step}" if step is not None else "")
            + (f", inside {' > '.join(where)}" if where else "")
            + f"; {format_bytes(m.last)} in use at the last sample"
        )
        held = m.scopes[:HOLDERS]
        unknown |= not held or any(name == "<unk>:" for name, _ in held)
        if held and m.holder is not None:
            evidence.append(
                "  scopes holding it: "
                + ", ".join(f"{quoted(n)} {format_bytes(v)} ({pct(v / value)})" for n, v in held)
            )
            subjects += [m.device, m.holder]
        elif held:  # a scope's counter adds up its bytes on every device
            evidence.append(
                "  scopes in use then, on all devices together: "
                + ", ".join(f"{quoted(n)} {format_bytes(v)}" for n, v in held)
            )
            subjects.append(m.device)
        else:
            subjects.append(m.device)
        if job.where(p):
            subjects.append(p.label)
    value, p, m = found[0]
    holder = f", most held by scope {quoted(m.holder)}" if m.holder else ""
    return hint(
        "memory-peak",
        "low",
        f"Memory peaks at {format_bytes(value)} on {m.device}{holder}",
        capped(evidence, 3 * MAX_LINES),
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


def memory_growth(job: Job) -> Hint | None:
    """Bytes in use on a device (mxprof.memory's counters) at step ends that
    keep rising: ``trace.leak``'s rule, the one ``memory-leak`` and the live
    sampler run, over the values at step ends.  Its window is the trace's
    ``leak_steps``, or every step where the run has fewer (a whole run is
    the evidence a report has); the least rate is ``leak_min_bytes``."""
    found = []
    for p in job.procs:
        s = p.steps
        if s is None or len(s.ranges) < max(MIN_STEPS, MIN_WINDOW):
            continue
        window, min_rate = settings(job.traces[p.source])
        ends = [e.end for e in s.ranges]
        for device, samples in p.devices():
            values = [value_at(samples, t) for t in ends]
            leaked = first_leak(values, min(window, len(values)), min_rate)
            if leaked is None:
                continue
            rises = sum(b > a for a, b in zip(values, values[1:]))
            found.append((values[-1] - values[0], p, device, values, rises, leaked[1].rate))
    if not found:
        return None
    found.sort(key=lambda f: -f[0])
    evidence, subjects = [], []
    for _, p, device, values, rises, rate in found:
        s = p.steps
        assert s is not None
        n = len(values)
        evidence.append(
            f"{job.where(p)}{device}: {format_bytes(values[0])} in use at the end of step "
            f"{s.index[0]}, {format_bytes(values[-1])} at the end of step {s.index[-1]} "
            f"(+{format_bytes(rate)} per step); it rose in {rises} of {n - 1} steps"
        )
        ends = [e.end for e in s.ranges]
        grown = []
        for name, samples in p.scopes():
            first, last = value_at(samples, ends[0]), value_at(samples, ends[-1])
            if last > first:
                grown.append((last - first, name))
        for delta, name in sorted(grown, reverse=True)[:3]:
            evidence.append(
                f"  scope {quoted(name)} grew by {format_bytes(delta)} over those steps"
            )
            subjects.append(name)
        subjects.append(device)
        if job.where(p):
            subjects.append(p.label)
    growth, p, device, values, _, _ = found[0]
    return hint(
        "memory-growth",
        "medium",
        f"Memory on {device} grows step over step (+{format_bytes(growth)} over "
        f"{len(values)} steps)",
        capped(evidence, 3 * MAX_LINES),
        "Something allocated in each step outlives it (a leak): look in the scopes above for "
        "tensors kept in a list (a loss kept with its graph: store loss.item()), caches "
        "without a bound, or references held past the step; in a healthy loop the bytes in "
        "use at step ends stay level.",
        subjects,
    )


# ---- memory_steps: the leak rule over the sampler's counters ----


def _live_leaks(job: Job, p: Process) -> list[str]:
    """The ``leak: ...`` markers the live sampler left in p (they name the
    process as it knew itself: ``DataLoader worker 1 (pid N)``); read only
    for a process the rule flagged."""
    out = []
    for thread in job.traces[p.source].events.threads:
        if thread.pid != p.pid or thread.ranges == len(thread):
            continue
        for i in compress(count(), map(eq, thread.dur, repeat(NO_DUR))):
            e = thread.event(i)
            if e.ph == "i" and e.category == PROCESS_MEMORY and e.name.startswith("leak:"):
                out.append(e.name)
    return out


def memory_leak(job: Job) -> Hint | None:
    """``trace.leak``'s rule (the one the live sampler runs) over the
    ``Process Memory`` counters of ``memory_steps``: a robust slope over
    ``leak_steps`` steps, persistent over both halves of the window."""
    found = []
    for p in job.procs:
        window, min_rate = settings(job.traces[p.source])
        for name, times, values, steps in series(p):
            first = first_leak(values, window, min_rate)
            if first is not None:
                end, growth = first
                begin = end - window + 1
                found.append((growth, p, name, times[begin], times[end], steps[begin], steps[end]))
                break  # one series per process: the first the rule names
    if not found:
        return None
    found.sort(key=lambda f: -f[0].rate)
    evidence, subjects = [], []
    for growth, p, name, t0, t1, s0, s1 in found:
        span = f"steps {s0} to {s1}" if s0 is not None else f"{growth.steps} samples"
        evidence.append(
            f"{p.label}: {name} grew {format_bytes(growth.rate)} per step over {span} "
            f"({format_bytes(growth.first)} to {format_bytes(growth.last)}), flagged at "
            f"{format_ns(t1)}"
        )
        evidence += [f"  recorded live: {quoted(m)}" for m in _live_leaks(job, p)[:2]]
        subjects += [p.label, name]
        grown = [
            (value_at(samples, t1) - value_at(samples, t0), scope) for scope, samples in p.scopes()
        ]
        grown = [g for g in grown if g[0] > 0]
        if grown:
            delta, scope = max(grown)
            evidence.append(f"  scope {quoted(scope)} grew most: {format_bytes(delta)}")
            subjects.append(scope)
        cow = copy_on_read(*(_within(p, key, t0, t1) for key in ("shared", "uss")))
        if cow is not None:
            evidence.append(
                f"  copy-on-read: shared pages turning private (shared "
                f"-{format_bytes(cow[0])}, private +{format_bytes(cow[1])})"
            )
        sites = [
            (counter_value(samples[-1]) or 0.0, where)
            for (category, where), samples in p.counters.items()
            if category == SITES and samples
        ]
        for per_step, where in sorted(sites, reverse=True)[:SITES_SHOWN]:
            evidence.append(f"  allocation site {where}: +{format_bytes(per_step)} per step")
            subjects.append(where)
    growth, p, name = found[0][:3]
    return hint(
        "memory-leak",
        "high",
        f"Memory leak: {name} of {p.label} grows {format_bytes(growth.rate)} per step",
        capped(evidence, 3 * MAX_LINES),
        "Something each step allocates is kept: the scope and allocation sites above say "
        "where (leak_sites_steps > 0, the default, has tracemalloc name the lines once the "
        "live rule flags a leak). In a DataLoader worker, shared pages turning private are "
        "copy-on-read: the dataset holds Python objects (lists, dicts) whose reference "
        "counts every read writes; keep samples in numpy arrays or bytes instead.",
        subjects,
    )


def _within(p: Process, name: str, t0: int, t1: int) -> list[float]:
    """The values of p's ``Process Memory`` counter name sampled from t0 to t1."""
    samples = p.counters.get((PROCESS_MEMORY, name), [])
    return [counter_value(e) or 0.0 for e in samples if t0 <= e.ts <= t1]
