"""Counter series and duration histograms, bounded for plotting.

``downsample`` keeps a series to about ``POINTS`` points whatever its
length; a histogram has ``HIST_BINS`` bins whatever the number of ranges.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..trace import Event, Trace
from ..trace.processes import Process, counter_value

POINTS = 2000  # most points of one plotted series
HIST_BINS = 40  # bins of a range's duration histogram

RawSeries = dict[tuple[Any, str, str], tuple[list[float], list[float]]]


def downsample(
    xs: Sequence[float], ys: Sequence[float], limit: int = POINTS
) -> tuple[list[float], list[float]]:
    """At most about ``limit`` points of a series, keeping each bucket's extremes.

    The series is cut into ``limit // 2`` buckets of consecutive points; each
    keeps its lowest and highest point in their order, so peaks and dips
    survive (a spike of one sample among millions is still drawn).  The first
    and last points are always kept.

    Example:
        >>> downsample([0, 1, 2, 3, 4, 5], [0, 9, 1, 1, 8, 0], limit=4)
        ([0, 1, 4, 5], [0, 9, 8, 0])
    """
    n = len(xs)
    if n <= limit:
        return list(xs), list(ys)
    buckets = max(limit // 2, 1)
    keep: list[int] = [0]
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo >= hi:
            continue
        chunk = ys[lo:hi]
        low = lo + min(range(hi - lo), key=chunk.__getitem__)
        high = lo + max(range(hi - lo), key=chunk.__getitem__)
        keep.extend(sorted({low, high}))
    keep.append(n - 1)
    picked = sorted(set(keep))
    return [xs[i] for i in picked], [ys[i] for i in picked]


@dataclass
class Histogram:
    """Counts of a range's durations in log-spaced bins (edges in ns, one more than counts)."""

    edges: list[float]
    counts: list[int]


def histogram(durations: Sequence[int], bins: int = HIST_BINS) -> Histogram:
    """Every duration counted into ``bins`` log-spaced bins from the least to the largest.

    ``durations`` must be sorted: each bin's share is then found by bisection.
    When every duration is the same (one range, say one step), the one bin
    spans 5 % either side of it, so that it has a width to draw on the
    page's log axis (a bin from v to v draws nothing).

    Example:
        >>> h = histogram([10, 100, 1000], bins=2)
        >>> h.counts
        [1, 2]
        >>> histogram([100, 100])
        Histogram(edges=[95.0, 105.0], counts=[2])
    """
    least, most = durations[0], durations[-1]
    if least == most:
        return Histogram([least * 0.95, most * 1.05], [len(durations)])
    lo, hi = math.log(max(least, 1)), math.log(most)
    step = (hi - lo) / bins

    def bin_of(d: int) -> int:
        k = int((math.log(max(d, 1)) - lo) / step) if d > 1 else 0
        return min(max(k, 0), bins - 1)

    # bin_of never decreases as d grows: where each bin begins in the sorted list.
    starts = [_first(durations, bin_of, k) for k in range(bins)]
    counts = [b - a for a, b in zip(starts, [*starts[1:], len(durations)])]
    edges = [math.exp(lo + k * step) for k in range(bins + 1)]
    edges[0], edges[-1] = least, most
    return Histogram(edges, counts)


def _first(ordered: Sequence[int], rank: Callable[[int], int], k: int) -> int:
    """The index of the first item whose rank is k or more (rank never decreases)."""
    lo, hi = 0, len(ordered)
    while lo < hi:
        mid = (lo + hi) // 2
        if rank(ordered[mid]) >= k:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class Series:
    """One counter's samples over time (time in ns from the earliest input start)."""

    name: str
    category: str
    process: str
    samples: int
    times: list[float]
    values: list[float]
    last: float
    least: float
    most: float
    peak_ts: float


@dataclass
class MemoryPeak:
    """A device's peak of memory in use, as the page shows it (``trace.processes``'s
    peak, its time from the page's start); the scope holding most of it then,
    where one can be named."""

    device: str
    process: str
    peak: float
    at_ns: float
    scope: str | None
    scope_bytes: float | None


def raw_series(trace: Trace, start: int, procs: Sequence[Process] | None = None) -> RawSeries:
    """Every counter's samples, (pid, category, name) -> (times, values), in time order.

    Times are ns from ``start``.  ``procs``, the trace's own processes
    (``trace.processes``, not a job's copies of several inputs), give the
    samples they already hold instead of a pass over the trace's events.
    """
    found: RawSeries = {}
    for pid, category, name, samples in _counter_samples(trace, procs):
        for e in samples:
            value = counter_value(e)
            if value is None:
                if procs is not None:
                    # A sample without a value: the counters' order is that
                    # of their first sample with one, which only the pass
                    # over the events gives.
                    return raw_series(trace, start)
                continue
            times, values = found.setdefault((pid, category, name), ([], []))
            times.append(float(e.ts - start))
            values.append(value)
    for times, values in found.values():
        if any(b < a for a, b in zip(times, times[1:])):  # several threads: put in time order
            ordered = sorted(zip(times, values))
            times[:], values[:] = [t for t, _ in ordered], [v for _, v in ordered]
    return found


def _counter_samples(
    trace: Trace, procs: Sequence[Process] | None
) -> Iterator[tuple[Any, str, str, Sequence[Event]]]:
    """(pid, category, name, samples) of each counter, samples in the order of
    ``trace.events`` (thread by thread, each in time order)."""
    if procs is None:
        for e in trace.events.points():
            if e.ph == "C":
                yield e.pid, e.category, e.name, (e,)
        return
    for p in procs:
        for (category, name), samples in p.counters.items():
            if any(e.tid != samples[0].tid for e in samples):
                # Several threads' samples, sorted by time: back to the
                # events' order, thread by thread (each one's stays in order).
                samples = sorted(samples, key=lambda e: str(e.tid))
            yield p.pid, category, name, samples


def series(labels: dict[Any, str], raw: RawSeries) -> list[Series]:
    """Every counter of raw_series, downsampled, with its last, least and largest
    value; its process by ``labels`` (pid -> label, ``trace.processes``'s)."""
    out = []
    for (pid, cat, name), (times, values) in raw.items():
        peak = max(range(len(values)), key=values.__getitem__)
        xs, ys = downsample(times, values)
        out.append(
            Series(
                name=name,
                category=cat,
                process=labels.get(pid, f"pid {pid}"),
                samples=len(values),
                times=xs,
                values=ys,
                last=values[-1],
                least=min(values),
                most=values[peak],
                peak_ts=times[peak],
            )
        )
    out.sort(key=lambda s: (-s.most, s.name, s.process))
    return out
