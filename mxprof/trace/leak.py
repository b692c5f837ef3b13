"""The leak rule: memory that keeps growing step after step.

One function decides, :func:`leak`, and both sides call it: the live
sampler (``mxprof._memstep``) on the last ``leak_steps`` samples it took,
to flag a leak while the program runs (and start ``tracemalloc``, and
trigger the flight recorder), and the report's ``memory-leak`` hint on the
counters a trace holds (:func:`first_leak` slides the same window over them).

The rule, over a window of n values (bytes, one per step, oldest first):

- the rate is the Theil–Sen slope, the median of the slopes between every
  two values: one spike, or one jump (a cache filled once), moves the
  median little, where a least-squares line would follow it;
- it must be at least ``min_rate`` bytes per step;
- the growth is persistent: each half of the window grows at no less than
  half ``min_rate`` by its own Theil–Sen slope, so a single jump (which lies
  in one half only) is not a leak, and the later half grows at no less than
  ``LATE_SHARE`` (0.65) of the rate of the earlier one, so growth that
  slows to a stop (warm-up: pools and caches filling) is not one either;
- it stands out of the noise: the growth over the window (rate x (n - 1))
  is at least ``NOISE_MADS`` scaled median absolute deviations of the
  values around the fitted line.

So a leak is reported once it has lasted a whole window (``leak_steps``, 16
by default: a steady leak of 1 MB per step is flagged at its 16th step, by
the 20th under noise of +-2 MB), and growth that stops within about half a
window never is.  The thresholds were set on synthetic series
(tests/test_memstep.py): over 300 seeds of 200 steps each, noise of +-2 MB
with 8 MB spikes and a linear warm-up that stops never fired; a warm-up
decaying as exp(-step/4) fired in 2 of 300.

The counters it reads are written by the live sampler, in the counter
domain ``Process Memory`` (:data:`PROCESS_MEMORY`): ``rss`` at step ends
and on the period; ``pss``, ``uss`` (private), ``shared`` on the period
(``/proc/self/smaps_rollup``); ``cuda:N allocated`` and ``cuda:N reserved``
at step ends.  The allocation sites ``tracemalloc`` found after a leak are
counters of domain ``Allocation Sites`` (:data:`SITES`), named
``file:line``, each valued in bytes per step.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._render import format_bytes

if TYPE_CHECKING:
    from .model import Trace
    from .processes import Process

__all__ = [
    "COPY_ON_READ_SHARE",
    "LEAK_MIN_BYTES",
    "LEAK_STEPS",
    "MIN_WINDOW",
    "PROCESS_MEMORY",
    "SITES",
    "Growth",
    "copy_on_read",
    "first_leak",
    "leak",
    "render_memory",
    "series",
    "summary",
    "theil_sen",
]

PROCESS_MEMORY = "Process Memory"  # the sampler's counter domain (category in the trace)
SITES = "Allocation Sites"  # tracemalloc's growing sites after a leak: bytes per step
LEAK_STEPS = 16  # the window, in steps (config leak_steps)
LEAK_MIN_BYTES = 256 << 10  # the least rate that is a leak, per step (config leak_min_bytes)
MIN_WINDOW = 6  # fewer values say nothing about persistence
NOISE_MADS = 6.0  # growth over the window vs. the scaled MAD of the residuals
MAD_SCALE = 1.4826  # a normal's standard deviation from its MAD
LATE_SHARE = 0.65  # the later half grows at least this share of the earlier half's rate
COPY_ON_READ_SHARE = 0.5  # shared bytes lost / private bytes gained that names copy-on-read


@dataclass(frozen=True)
class Growth:
    """A leak found by :func:`leak` over one window.

    Attributes:
        rate: bytes per step (the Theil–Sen slope over the window).
        steps: values in the window.
        first: the window's first value (bytes).
        last: the window's last value (bytes).
    """

    rate: float
    steps: int
    first: float
    last: float


def theil_sen(values: Sequence[float]) -> float:
    """The median of the slopes between every two values (x: their positions).

    Example:
        >>> theil_sen([0, 1, 2, 3, 100, 5, 6])  # one spike moves it not at all
        1.0
    """
    n = len(values)
    slopes = [(values[j] - values[i]) / (j - i) for i in range(n) for j in range(i + 1, n)]
    return float(statistics.median(slopes)) if slopes else 0.0


def _span(n: int) -> int:
    """A span d such that a Theil–Sen slope m over n values implies a range of
    at least d x m: the median being >= m needs n(n-1)/4 pairs (at least)
    of slope >= m, and fewer pairs than that are closer than d apart, so one
    of them spans d or more positions.

    Example:
        >>> _span(16)  # 54 pairs are closer than 5 apart, 60 are needed
        5
    """
    needed = n * (n - 1) // 2 // 2
    d, closer = 1, 0
    while closer + (n - d) < needed:
        closer += n - d
        d += 1
    return d


def leak(values: Sequence[float], min_rate: float = LEAK_MIN_BYTES) -> Growth | None:
    """The leak rule of the module docstring over one window of values.

    Args:
        values: bytes in use, one per step, oldest first (the whole window).
        min_rate: the least growth per step that is a leak (bytes; > 0 is
            always required).

    Returns:
        The growth when the window is a leak, else None (also for fewer
        than ``MIN_WINDOW`` values).

    Example:
        >>> leak([100 + 2**20 * k for k in range(16)]).rate
        1048576.0
        >>> leak([100 + 2**20 * min(k, 5) for k in range(16)]) is None  # stops: warm-up
        True
    """
    n = len(values)
    if n < MIN_WINDOW or max(values) - min(values) < _span(n) * max(min_rate, 1e-9):
        return None  # cannot pass: the cheap test that keeps a level process's steps cheap
    rate = theil_sen(values)
    if rate <= 0 or rate < min_rate:
        return None
    half = n // 2
    early, late = theil_sen(values[:half]), theil_sen(values[n - half :])
    if min(early, late) < min_rate / 2 or min(early, late) <= 0 or late < LATE_SHARE * early:
        return None
    residuals = [v - rate * i for i, v in enumerate(values)]
    centre = statistics.median(residuals)
    spread = MAD_SCALE * statistics.median(abs(r - centre) for r in residuals)
    if rate * (n - 1) < NOISE_MADS * spread:
        return None
    return Growth(rate, n, float(values[0]), float(values[-1]))


def first_leak(
    values: Sequence[float], window: int = LEAK_STEPS, min_rate: float = LEAK_MIN_BYTES
) -> tuple[int, Growth] | None:
    """Where the live rule would first have fired over a whole series: the
    position of the window's last value, and its growth.

    Example:
        >>> first_leak([0.0] * 10 + [2**20 * k for k in range(30)])[0]
        21
    """
    for end in range(window, len(values) + 1):
        found = leak(values[end - window : end], min_rate)
        if found is not None:
            return end - 1, found
    return None


def copy_on_read(shared: Sequence[float], private: Sequence[float]) -> tuple[float, float] | None:
    """(shared bytes lost, private bytes gained) over a window when shared
    pages turned private (copy-on-read: a forked worker touching objects it
    inherited copies their pages): private grew and shared fell by at least
    ``COPY_ON_READ_SHARE`` of it.  Each list: samples over the window, oldest
    first; None otherwise.

    Example:
        >>> copy_on_read([100e6, 80e6, 60e6], [10e6, 30e6, 50e6])
        (40000000.0, 40000000.0)
    """
    if len(shared) < 2 or len(private) < 2:
        return None
    lost, gained = shared[0] - shared[-1], private[-1] - private[0]
    if gained <= 0 or lost < COPY_ON_READ_SHARE * gained:
        return None
    return float(lost), float(gained)


def series(p: Process) -> Iterator[tuple[str, list[int], list[float], list[int | None]]]:
    """What the live sampler's rule watches, read back from p's counters:
    (name, the instants of its values in ns, the values, their step numbers
    or None).

    With steps (at least ``MIN_WINDOW``), ``rss`` and each ``cuda:N
    allocated`` as they were at each step end: the sample taken at a step's
    end lies after the step's end and before the next one's start, so each
    value is read at the next step's start.  Without steps, ``uss`` and
    ``cuda:N allocated`` at every sample (the period's samples are that
    process's steps, as they are live).
    """
    from .processes import counter_value, value_at  # processes imports the trace model

    mine = {name: e for (cat, name), e in p.counters.items() if cat == PROCESS_MEMORY}
    s = p.steps
    if s is not None and len(s.ranges) >= MIN_WINDOW:
        reads = [e.ts for e in s.ranges[1:]] + [p.end + 1]
        ends = [e.end for e in s.ranges]
        for name, samples in sorted(mine.items()):
            if name == "rss" or name.endswith(" allocated"):
                values = [value_at(samples, t) for t in reads]
                yield name, ends, values, list(s.index)
        return
    for name, samples in sorted(mine.items()):
        if name == "uss" or name.endswith(" allocated"):
            values = [counter_value(e) or 0.0 for e in samples]
            yield name, [e.ts for e in samples], values, [None] * len(values)


def _setting(trace: Trace, key: str, default: int) -> int:
    """A memory_steps key as the trace's config (``otherData``) recorded it."""
    other = trace.metadata.get("otherData")
    config = other.get("config") if isinstance(other, dict) else None
    value = config.get(key) if isinstance(config, dict) else None
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return int(value) if ok else default  # type: ignore[arg-type]


def settings(trace: Trace) -> tuple[int, int]:
    """(leak_steps, leak_min_bytes) the trace was recorded with (else the defaults)."""
    return _setting(trace, "leak_steps", LEAK_STEPS), _setting(
        trace, "leak_min_bytes", LEAK_MIN_BYTES
    )


def summary(trace: Trace) -> dict[str, Any] | None:
    """``mxprof stats``' memory block: per process with ``memory_steps``
    counters, each counter's samples, first, last, min and max (bytes), and
    the leak the rule finds (as the report's hint does); None without them.

    Example:
        >>> summary(mxprof.load("run.json"))["processes"][0]["leak"]  # doctest: +SKIP
        {'series': 'rss', 'rate_per_step': 1048576, 'window': 16, 'at': 'step 15'}
    """
    from .processes import counter_value, processes

    window, min_rate = settings(trace)
    out = []
    for p in processes(trace):
        counters = []
        for (category, name), samples in sorted(p.counters.items()):
            if category != PROCESS_MEMORY or not samples:
                continue
            values = [counter_value(e) or 0.0 for e in samples]
            counters.append(
                {
                    "name": name,
                    "samples": len(values),
                    "first": round(values[0]),
                    "last": round(values[-1]),
                    "min": round(min(values)),
                    "max": round(max(values)),
                }
            )
        if not counters:
            continue
        found = None
        for name, _, values, steps in series(p):
            first = first_leak(values, window, min_rate)
            if first is not None:
                at, growth = first
                where = f"step {steps[at]}" if steps[at] is not None else f"sample {at}"
                found = {
                    "series": name,
                    "rate_per_step": round(growth.rate),
                    "window": window,
                    "at": where,
                }
                break
        out.append({"process": p.label, "counters": counters, "leak": found})
    return {"processes": out} if out else None


def render_memory(block: dict[str, Any]) -> list[str]:
    """The memory block as text lines (sizes in binary units)."""
    lines = ["Process memory (memory_steps)"]
    for p in block["processes"]:
        lines.append(f"  {p['process']}:")
        for c in p["counters"]:
            lines.append(
                f"    {c['name']:<20} {c['samples']:>6} samples  first {format_bytes(c['first'])}"
                f"  last {format_bytes(c['last'])}  min {format_bytes(c['min'])}"
                f"  max {format_bytes(c['max'])}"
            )
        leak_found = p["leak"]
        if leak_found:
            lines.append(
                f"    leak: {leak_found['series']} +{format_bytes(leak_found['rate_per_step'])} "
                f"per step over {leak_found['window']} steps, flagged at {leak_found['at']}"
            )
        else:
            lines.append("    no leak (the leak rule: docs/memory.md)")
    return lines
