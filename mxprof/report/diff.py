"""Compare profiles name by name: ``mxprof diff BASE NEW`` and ``diff(base, new)``.

Every range name recorded on both sides gets a row: count, total, avg, P50
and P99 of each side (ns; percentiles by the nearest-rank rule of
``key_averages``), the change, and the *typical shift*: how much the
typical duration moved, in percent, with a confidence interval.  A row is
*flagged* only when the whole interval clears both guards:

- the threshold: the interval lies above ``+threshold`` percent (slower) or
  below ``-threshold`` (faster), 5 by default;
- the minimum absolute change: the typical duration moved by at least
  ``min_change`` ns (1 us by default) at the interval's near end, so a
  range of a few hundred ns is not flagged for a shift nobody can act on.

What is tested, exactly.  The events of one run are not independent draws
of the run-to-run noise: a busy second slows every event in it.  So the
unit is not the event but a *block*: each run's events of a name, in time
order, are cut into at most ``BLOCKS`` contiguous blocks of at least
``PER_BLOCK`` events, and each block gives the median of its durations.  A
side's typical duration is the mean of its blocks' log medians (one run
a side), or the mean over runs of each run's (several runs a side): a
geometric mean of medians, so a shift is a ratio.  The interval is Student's t at
``CONFIDENCE`` (99 %) on the difference of the two sides' typical log
durations:

- one run a side: the standard error of each side's mean from the spread
  of its blocks, degrees of freedom the fewer blocks less one;
- several runs on a side: the spread of the runs' typical durations around
  their side's mean, pooled over both sides (degrees of freedom: runs less
  two), so the interval is as wide as runs differ from each other, which
  is what a CI gate needs to know.  ``mxprof diff BASE... -- NEW...``
  gives several runs a side; five or more a side make a tight interval.

With one run a side the test cannot tell a slower program from a slower
machine (another job, a different clock speed), which moves every block of
a run together: the threshold is the guard against that, so compare runs
from one quiet machine, or give several runs a side.  A name with fewer
than ``PER_BLOCK`` x ``MIN_BLOCKS`` events on a side (one run), or with a
side of one run against a side of one run too short to block, is shown but
never flagged.  The average is shown, never tested: a few outliers that
double it do not move a median of blocks.

Names are the unit, as in "names only in one side": a name recorded under
several categories (two domains) is one row, its durations pooled.  The
profiler's own ranges (``_render.is_own``: its writer's flush) are left out.

When both sides hold stack samples (``sample_rate``), functions are compared
too, by their share of the samples (``Diff.shares``; the rule is in
``mxprof.report._shares``): inclusive and self share, base and new, the
change in percentage points with a confidence interval (Bonferroni over the
number of functions), flagged only when the interval clears the threshold
read as points.  Shares are relative (one function growing makes the others
shrink), so a flagged share is reported but is never a regression:
``regressions`` (what ``--fail-on-regression`` gates on) holds time rows only.
Two sides with samples but no range name in common compare shares alone.

``Diff.to_json()`` (``mxprof diff --format json``) returns::

    {"base": [paths], "new": [paths], "unit": "ns", "threshold_pct": 5.0,
     "min_change_ns": 1000,
     "test": {"name": "typical-shift", "estimate": "geometric mean of block medians",
              "interval": "student-t", "confidence": 0.99,
              "blocks": 32, "per_block": 4},
     "runs": {"base": int, "new": int},
     "truncated": {"base": bool, "new": bool},
     "rows": [{"name", "categories": [str],
               "base": {"count", "total", "avg", "p50", "p99"}, "new": {...},
               "delta": {...},        # new - base, same keys (ns; count in events)
               "change_pct": {...},   # 100 * delta / base, null where base is 0
               "shift": {"typical_base", "typical_new",   # ns
                         "pct", "low_pct", "high_pct",    # null when not judged
                         "units": {"base", "new"}, "by": "blocks" | "runs"},
               "direction": "slower" | "faster" | "same",   # of the typical shift
               "flagged": bool, "why": str}],
     "only_base": [{"name", "categories", "count", "total", "avg", "p50", "p99"}],
     "only_new": [...], "regressions": [names], "improvements": [names],
     "shares": null | {           # null unless both sides have stack samples
         "base_samples", "new_samples", "unit": "percent of samples",
         "threshold_pts", "test": {"name": "two-proportion-interval", "alpha",
                                   "correction": "bonferroni", "alpha_per_function"},
         "matched_by": "function and file name",
         "rows": [{"function", "file", "line",
                   "inclusive": {"base", "new", "base_pct", "new_pct", "delta_pts",
                                 "low_pts", "high_pts", "p_value"},
                   "self": {...}, "direction": "grew" | "shrank" | "same",
                   "flagged": bool, "why": str}],
         "grew": [labels], "shrank": [labels]}}

Example:
    >>> from mxprof.report.diff import diff
    >>> d = diff("yesterday.json", "today.json", threshold=10)  # doctest: +SKIP
    >>> [row.name for row in d.regressions]  # doctest: +SKIP
    ['forward']
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from .._render import display, format_ns, grouped_table, is_own
from ..errors import ConfigError, ProfilerError
from ..trace import Trace, load
from ..trace._convert import ThreadKey
from ._shares import Shares, Tally, compare

# The interval's confidence, and the shares' family-wise level (1 - CONFIDENCE).
CONFIDENCE = 0.99
ALPHA = 0.01
# A run's events of one name are cut into at most BLOCKS contiguous blocks of
# at least PER_BLOCK events; a side judged by its blocks needs MIN_BLOCKS.
BLOCKS = 32
PER_BLOCK = 4
MIN_BLOCKS = 4
# A thread's common shift is taken out of its ranges when it has this many.
MIN_GROUP = 3
# The default minimum absolute change of the typical duration, ns.
MIN_CHANGE_NS = 1000
# The statistics of each side, in the order tables and JSON show them.
STATS = ("count", "total", "avg", "p50", "p99")
# Student's t, two-sided 99 %: degrees of freedom -> quantile 0.995 (past
# the table, the normal quantile's value at 120 and beyond).
_T995 = (
    63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169,
    3.106, 3.055, 3.012, 2.977, 2.947, 2.921, 2.898, 2.878, 2.861, 2.845,
    2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763, 2.756, 2.750,
)  # fmt: skip
_T995_FAR = ((40, 2.704), (60, 2.660), (120, 2.617))

Source = Union[str, "os.PathLike[str]", Trace]
Inputs = Union[Source, Sequence[Source]]


class DiffError(ProfilerError, ValueError):
    """Two profiles cannot be compared: a side has no ranges, or no name is on
    both, and not both sides have stack samples.

    The message names the files.

    Example:
        >>> try:
        ...     diff(Trace([]), Trace([]))
        ... except DiffError as e:
        ...     print(e)
        <Trace>: no ranges to compare (only counters, markers, or nothing)
    """


@dataclass(frozen=True)
class Stats:
    """One side's numbers for one name; times in ns.

    Example:
        >>> Stats.of([1_000, 2_000, 6_000])
        Stats(count=3, total=9000, avg=3000.0, p50=2000, p99=6000)
    """

    count: int
    total: int
    avg: float
    p50: int
    p99: int

    @classmethod
    def of(cls, ordered: Sequence[int]) -> Stats:
        """The statistics of durations sorted ascending (at least one)."""
        total = sum(ordered)
        return cls(
            len(ordered),
            total,
            total / len(ordered),
            _nearest_rank(ordered, 50),
            _nearest_rank(ordered, 99),
        )

    def to_json(self) -> dict[str, float]:
        """The numbers under the keys of ``STATS``."""
        return {stat: getattr(self, stat) for stat in STATS}


@dataclass(frozen=True)
class Shift:
    """How the typical duration of one name moved, with its interval.

    ``pct`` is the change of the typical duration in percent; ``low_pct``
    and ``high_pct`` bound it at ``CONFIDENCE``; all three are None when
    the name has too few events (or runs) to be judged.  ``typical_base``
    and ``typical_new`` are the sides' typical durations (ns); ``units``
    says how many blocks or runs each side had, ``by`` which.

    Example:
        >>> s = typical_shift([[1000] * 40], [[1200] * 40])
        >>> round(s.pct, 1), s.by, s.units
        (20.0, 'blocks', (10, 10))
    """

    typical_base: float
    typical_new: float
    pct: float | None
    low_pct: float | None
    high_pct: float | None
    units: tuple[int, int]
    by: str
    thread: str | None = None  # the thread whose common shift was taken out
    thread_pct: float | None = None  # that common shift, percent

    @property
    def judged(self) -> bool:
        """Whether there was enough to put an interval on the shift."""
        return self.low_pct is not None

    def to_json(self) -> dict[str, Any]:
        """The shift as plain data (keys as the module docstring says)."""
        return {
            "typical_base": self.typical_base,
            "typical_new": self.typical_new,
            "pct": self.pct,
            "low_pct": self.low_pct,
            "high_pct": self.high_pct,
            "units": {"base": self.units[0], "new": self.units[1]},
            "by": self.by,
            "thread": self.thread,
            "thread_pct": self.thread_pct,
        }


@dataclass(frozen=True)
class DiffRow:
    """One name on both sides: their numbers, the shift, and whether it is flagged.

    Example:
        >>> row = diff("base.json", "new.json").rows[0]  # doctest: +SKIP
        >>> row.name, row.shift.pct, row.flagged  # doctest: +SKIP
        ('forward', 20.3, True)
    """

    name: str
    categories: tuple[str, ...]
    base: Stats
    new: Stats
    shift: Shift
    flagged: bool
    why: str

    def delta(self, stat: str) -> float:
        """new - base of one of ``STATS`` (ns; events for count)."""
        value: float = getattr(self.new, stat) - getattr(self.base, stat)
        return value

    def change_pct(self, stat: str) -> float | None:
        """The change of one of ``STATS`` in percent of base; None when base is 0."""
        before = getattr(self.base, stat)
        return 100.0 * self.delta(stat) / before if before else None

    @property
    def gates(self) -> bool:
        """Whether a flag here can fail the gate: several runs a side, or its
        thread's common shift taken out.  A range compared raw with one run
        a side (alone on its thread, or with too few others) cannot tell a
        busier machine from slower code: it is flagged, never a regression."""
        return self.shift.by == "runs" or self.shift.thread is not None

    @property
    def direction(self) -> str:
        """'slower', 'faster' or 'same': how the typical duration moved."""
        change = self.shift.typical_new - self.shift.typical_base
        return "slower" if change > 0 else "faster" if change < 0 else "same"


class Diff:
    """The comparison of two profiles (see the module docstring for the rule).

    Attributes:
        base, new: the files (or ``<Trace>``) of each side.
        threshold: percent the typical shift's interval must clear.
        min_change: ns the typical duration must move by, at least.
        runs: per side, how many runs (traces) it has.
        rows: one ``DiffRow`` per name on both sides, the largest change of
            total time first (ties by name).
        only_base, only_new: names on one side only, sorted; their numbers
            are in ``base_stats`` / ``new_stats``.
        base_stats, new_stats: every name's ``Stats`` on each side.
        truncated: per side, whether a file was cut short.
        shares: the function shares of the stack samples (``_shares.Shares``),
            or None unless both sides have samples.
        sampled: per side, its number of stack samples.
        threads: each thread whose common shift was taken out of its
            ranges, and that shift in percent.

    Example:
        >>> d = diff("base.json", "new.json")  # doctest: +SKIP
        >>> print(d.to_table())  # doctest: +SKIP
    """

    def __init__(self, base: _Side, new: _Side, threshold: float, min_change: float) -> None:
        self.base = base.labels
        self.new = new.labels
        self.threshold = threshold
        self.min_change = min_change
        self.runs = {"base": len(base.runs), "new": len(new.runs)}
        self.truncated = {"base": base.truncated, "new": new.truncated}
        base_all, new_all = base.pooled(), new.pooled()
        self.base_stats = {name: Stats.of(d) for name, d in base_all.items()}
        self.new_stats = {name: Stats.of(d) for name, d in new_all.items()}
        self.only_base = sorted(base_all.keys() - new_all.keys())
        self.only_new = sorted(new_all.keys() - base_all.keys())
        self.categories = {**base.categories}
        for name, cats in new.categories.items():
            self.categories[name] = self.categories.get(name, set()) | cats
        rows = []
        common_names = sorted(base_all.keys() & new_all.keys())
        offsets = thread_offsets(base, new, common_names)
        self.threads = {thread: pct for thread, _, pct, _ in offsets.values()}
        for name in common_names:
            if name in offsets:
                thread, offs, common, variance = offsets[name]
                raw = typical_shift(base.of(name), new.of(name))
                shift = typical_shift(base.of(name), new.of(name), offs, variance)
                shift = dataclasses.replace(
                    shift,
                    typical_base=raw.typical_base,
                    typical_new=raw.typical_new,
                    thread=thread,
                    thread_pct=common,
                )
            else:
                shift = typical_shift(base.of(name), new.of(name))
            flagged, why = _judge(shift, threshold, min_change)
            categories = tuple(sorted(self.categories[name]))
            b, n = self.base_stats[name], self.new_stats[name]
            rows.append(DiffRow(name, categories, b, n, shift, flagged, why))
        rows.sort(key=lambda r: (-abs(r.delta("total")), r.name))
        self.rows = rows
        self.sampled = {"base": base.samples.total, "new": new.samples.total}
        self.shares: Shares | None = None
        if base.samples.total and new.samples.total:
            self.shares = compare(base.samples, new.samples, threshold, ALPHA)

    @property
    def regressions(self) -> list[DiffRow]:
        """Flagged rows whose typical duration got slower, in ``rows`` order
        (never a function share: they are relative, see the module docstring)."""
        return [r for r in self.rows if r.flagged and r.gates and r.direction == "slower"]

    @property
    def improvements(self) -> list[DiffRow]:
        """Flagged rows whose typical duration got faster, in ``rows`` order."""
        return [r for r in self.rows if r.flagged and r.gates and r.direction == "faster"]

    def to_json(self) -> dict[str, Any]:
        """The comparison as plain data; the keys are in the module docstring.

        Example:
            >>> doc = diff("base.json", "new.json").to_json()  # doctest: +SKIP
            >>> doc["rows"][0]["shift"]["low_pct"], doc["regressions"]  # doctest: +SKIP
            (14.2, ['forward'])
        """

        def one_side(name: str, stats: Stats) -> dict[str, Any]:
            cats = sorted(self.categories[name])
            return {"name": name, "categories": cats, **stats.to_json()}

        return {
            "base": self.base,
            "new": self.new,
            "unit": "ns",
            "threshold_pct": self.threshold,
            "min_change_ns": self.min_change,
            "test": {
                "name": "typical-shift",
                "estimate": "geometric mean of block medians",
                "interval": "student-t",
                "confidence": CONFIDENCE,
                "blocks": BLOCKS,
                "per_block": PER_BLOCK,
            },
            "runs": dict(self.runs),
            "truncated": dict(self.truncated),
            "rows": [
                {
                    "name": r.name,
                    "categories": list(r.categories),
                    "base": r.base.to_json(),
                    "new": r.new.to_json(),
                    "delta": {s: r.delta(s) for s in STATS},
                    "change_pct": {s: r.change_pct(s) for s in STATS},
                    "shift": r.shift.to_json(),
                    "direction": r.direction,
                    "flagged": r.flagged,
                    "gates": r.gates,
                    "why": r.why,
                }
                for r in self.rows
            ],
            "only_base": [one_side(n, self.base_stats[n]) for n in self.only_base],
            "only_new": [one_side(n, self.new_stats[n]) for n in self.only_new],
            "regressions": [r.name for r in self.regressions],
            "improvements": [r.name for r in self.improvements],
            "shares": self.shares.to_json() if self.shares is not None else None,
        }

    def to_table(self) -> str:
        """The comparison as a text table, then the names on one side only and a summary.

        Columns: per statistic base, new, the change (``diff``, for total and
        avg) and the change in percent (``%``); ``shift`` is the typical
        shift and its interval; ``flag`` is SLOWER or FASTER for a flagged
        row, ``noise`` for a shift past the threshold whose interval does
        not clear it.  When both sides have stack samples, a section of
        function shares follows (flag GREW or SHRANK).

        Example:
            >>> print(diff("base.json", "new.json", threshold=10).to_table())  # doctest: +SKIP
        """
        return _table(self)


def diff(
    base: Inputs, new: Inputs, *, threshold: float = 5.0, min_change: float = MIN_CHANGE_NS
) -> Diff:
    """Compare two profiles name by name (the rule is in the module docstring).

    Args:
        base: the profile to compare against: a trace file (any kind
            ``mxprof.load`` reads), a loaded ``Trace``, or a sequence of them,
            each one run of the same program.
        new: the profile to compare, in the same forms.
        threshold: percent (>= 0) the typical shift's interval must clear
            for a row to be flagged; for function shares, the percentage
            points a share's interval must clear.
        min_change: ns (>= 0) the typical duration must move by at least.

    Returns:
        A ``Diff``.

    Raises:
        ConfigError: threshold or min_change is not a finite number >= 0, or
            a side is an empty sequence.
        TraceReadError, TraceFormatError: a file cannot be read or is not a
            trace (the message names it).
        DiffError: a side has no ranges, or no name is on both sides, and
            not both sides have stack samples to compare.

    Example:
        >>> d = diff(["a1.json", "a2.json"], ["b1.json", "b2.json"])  # doctest: +SKIP
        >>> for row in d.regressions:  # doctest: +SKIP
        ...     print(row.name, f"{row.shift.low_pct:+.1f}%", row.why)
    """
    for key, value in (("threshold", threshold), ("min_change", min_change)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not value >= 0
            or math.isinf(value)
        ):
            unit = "percent" if key == "threshold" else "ns"
            raise ConfigError(f"{key} must be a finite number of {unit} >= 0, got {value!r}")
    sides = _Side(base, "base"), _Side(new, "new")
    if sides[0].samples.total and sides[1].samples.total:
        return Diff(*sides, float(threshold), float(min_change))  # shares compare regardless
    for side in sides:
        if not side.names:
            raise DiffError(
                f"{side.label}: no ranges to compare (only counters, markers, or nothing)"
            )
    if not sides[0].names & sides[1].names:
        raise DiffError(
            f"no range name in common between {sides[0].label} ({len(sides[0].names)} "
            f"names) and {sides[1].label} ({len(sides[1].names)} names): "
            "are they profiles of the same program?"
        )
    return Diff(*sides, float(threshold), float(min_change))


def typical_shift(
    base: Sequence[Sequence[int]],
    new: Sequence[Sequence[int]],
    offsets: tuple[Sequence[float], Sequence[float]] | None = None,
    offset_variance: float = 0.0,
) -> Shift:
    """The typical shift between two sides, each a list of runs, each run a
    name's durations (ns) in time order (the rule is in the module docstring).

    ``offsets``, per side and run, are log speeds taken out of each run
    before the comparison (its thread's common shift); none by default.
    ``offset_variance`` is the variance of that estimate where the spread of
    the runs does not hold it already (one run a side).

    Example:
        >>> s = typical_shift([[100, 110, 90, 100] * 10], [[120, 132, 108, 120] * 10])
        >>> round(s.pct), round(s.low_pct), round(s.high_pct)
        (20, 20, 20)
    """
    zero = ([0.0] * len(base), [0.0] * len(new))
    sides = [
        [[v - off for v in _blocks(run)] for run, off in zip(runs, offs)]
        for runs, offs in zip((base, new), offsets or zero)
    ]
    centers = [[statistics.fmean(b) for b in runs if b] for runs in sides]
    typical = [
        math.exp(sum(c) / len(c)) if c else statistics.median(_all(runs)) or 0.0
        for c, runs in zip(centers, (base, new))
    ]
    several = max(len(base), len(new)) > 1
    if several:
        units = (len(centers[0]), len(centers[1]))
        by = "runs"
        spread = _runs_spread(centers)
    else:
        units = (len(sides[0][0]) if sides[0] else 0, len(sides[1][0]) if sides[1] else 0)
        by = "blocks"
        spread = _blocks_spread([runs[0] if runs else [] for runs in sides])
    if spread is None or not typical[0] or not typical[1]:
        return Shift(typical[0], typical[1], _ratio_pct(typical), None, None, units, by)
    se, df = spread
    log_shift = math.log(typical[1] / typical[0])
    half = _t995(df) * math.sqrt(se * se + offset_variance)
    low, high = 100 * math.expm1(log_shift - half), 100 * math.expm1(log_shift + half)
    return Shift(typical[0], typical[1], 100 * math.expm1(log_shift), low, high, units, by)


def _centers(runs: Sequence[Sequence[int]]) -> list[float] | None:
    """Each run's mean of block log medians; None if a run is too short to block."""
    out = []
    for run in runs:
        blocks = _blocks(run)
        if not blocks:
            return None
        out.append(statistics.fmean(blocks))
    return out


def thread_offsets(
    base: _Side, new: _Side, names: Sequence[str]
) -> dict[str, tuple[str, tuple[list[float], list[float]], float, float]]:
    """Each run's speed on each thread, to be taken out of its ranges.

    A run's ranges on one thread slow down together when the machine is
    busier (another job takes the CPU): that moves every one of them by one
    factor, and says nothing of the code.  For a thread with at least
    ``MIN_GROUP`` names present in every run of both sides that hold no
    other of them (leaves: a parent range moves with whichever child
    moved), each run's *offset* is the median over those names of (its log
    center less the name's mean over the base runs): the base runs' offsets
    centre on 0, and a new run's is its thread's common shift; every name
    of the thread, parents too, is compared with it taken out.  One name slower than
    its thread's others stands out of that median; a machine that is
    slower for all of them does not.

    With one run a side the common shift is itself an estimate, whose
    variance (that of a median of k shifts: about pi/2 times their mean
    variance over k) widens each of the thread's intervals; with several
    runs, the runs' spread already holds it.

    Returns:
        name -> (thread, (base offsets, new offsets) per run, the thread's
        common shift in percent, the variance of its log), for the names
        of such threads.
    """
    groups: dict[str, list[tuple[str, list[float], list[float]]]] = {}
    for name in names:
        thread = base.thread_of(name)
        if thread is None or thread != new.thread_of(name):
            continue
        if len(base.of(name)) != len(base.runs) or len(new.of(name)) != len(new.runs):
            continue  # not in every run: its runs cannot be lined up with the others'
        b, n = _centers(base.of(name)), _centers(new.of(name))
        if b is not None and n is not None:
            groups.setdefault(thread, []).append((name, b, n))
    out: dict[str, tuple[str, tuple[list[float], list[float]], float, float]] = {}
    several = max(len(base.runs), len(new.runs)) > 1
    for thread, everyone in groups.items():
        # Only leaves speak for the machine: a parent moves with whichever child moved.
        members = [
            m
            for m in everyone
            if not any(base.contains(m[0], other[0]) for other in everyone if other is not m)
        ]
        if len(members) < MIN_GROUP:
            continue
        variance = 0.0
        if not several:
            spreads = [
                _blocks_spread([_blocks(base.of(name)[0]), _blocks(new.of(name)[0])])
                for name, _, _ in members
            ]
            known = [se * se for se, _ in filter(None, spreads)]
            if known:
                variance = math.pi / 2 * statistics.fmean(known) / len(known)
        ref = {name: statistics.fmean(b) for name, b, _ in members}
        offsets = (
            [
                statistics.median(b[r] - ref[name] for name, b, _ in members)
                for r in range(len(base.runs))
            ],
            [
                statistics.median(n[r] - ref[name] for name, _, n in members)
                for r in range(len(new.runs))
            ],
        )
        common = 100 * math.expm1(statistics.fmean(offsets[1]) - statistics.fmean(offsets[0]))
        for name, _, _ in everyone:
            out[name] = (thread, (offsets[0], offsets[1]), common, variance)
    return out


def _all(runs: Sequence[Sequence[int]]) -> list[int]:
    return [d for run in runs for d in run]


def _ratio_pct(typical: list[float]) -> float | None:
    return 100 * (typical[1] / typical[0] - 1) if typical[0] else None


def _blocks(durations: Sequence[int]) -> list[float]:
    """The log medians of a run's contiguous blocks (empty: too few events)."""
    k = min(BLOCKS, len(durations) // PER_BLOCK)
    if k < 1:
        return []
    out = []
    for i in range(k):
        block = durations[i * len(durations) // k : (i + 1) * len(durations) // k]
        out.append(math.log(max(statistics.median(block), 1)))
    return out


def _blocks_spread(blocks: list[list[float]]) -> tuple[float, int] | None:
    """One run a side: the standard error of the difference of the two
    sides' medians of blocks, and its degrees of freedom."""
    if min(len(b) for b in blocks) < MIN_BLOCKS:
        return None
    variance = sum(statistics.variance(b) / len(b) for b in blocks)
    return math.sqrt(variance), min(len(b) for b in blocks) - 1


def _runs_spread(centers: list[list[float]]) -> tuple[float, int] | None:
    """Several runs a side: the standard error of the difference of the
    sides' means of run centers, from the runs' spread pooled over both
    sides, and its degrees of freedom (runs less two)."""
    n_base, n_new = len(centers[0]), len(centers[1])
    df = n_base + n_new - 2
    if not n_base or not n_new or df < 1:
        return None
    squares = sum(sum((c - sum(cs) / len(cs)) ** 2 for c in cs) for cs in centers)
    return math.sqrt(squares / df * (1 / n_base + 1 / n_new)), df


def _t995(df: int) -> float:
    if df <= len(_T995):
        return _T995[max(df, 1) - 1]
    for limit, value in _T995_FAR:
        if df <= limit:
            return value
    return 2.576


class _Side:
    """One side: per run, each name's durations in time order; names' categories;
    the stack samples pooled over its runs."""

    def __init__(self, inputs: Inputs, which: str) -> None:
        single = (str, os.PathLike, Trace)
        sources: list[Source] = [inputs] if isinstance(inputs, single) else list(inputs)
        if not sources:
            raise ConfigError(f"{which}: no trace given")
        self.labels: list[str] = []
        self.runs: list[dict[str, list[int]]] = []
        self.threads: list[dict[str, str]] = []  # per run: name -> its thread
        self.spans: dict[str, tuple[list[int], list[int]]] = {}  # first run: starts, ends
        self.categories: dict[str, set[str]] = {}
        self.truncated = False
        self.samples = Tally()
        for source in sources:
            trace = source if isinstance(source, Trace) else load(source)
            self.labels.append(trace.path if trace.path is not None else "<Trace>")
            self.truncated |= trace.truncated
            self.samples.add(trace.samples.samples)
            timed: dict[str, list[tuple[int, int]]] = {}
            where: dict[str, Counter[ThreadKey]] = {}
            for thread in trace.events.threads:  # the ranges' columns: no Event made
                names, categories = thread.keys.names, thread.keys.categories
                own: dict[int, bool] = {}
                for _, ts, dur, k in thread.range_columns():
                    mine = own.get(k)
                    if mine is None:
                        mine = own[k] = is_own(categories[k], names[k])
                    if not mine:
                        name = names[k]
                        timed.setdefault(name, []).append((ts, dur))
                        self.categories.setdefault(name, set()).add(categories[k])
                        seen = where.get(name)
                        if seen is None:
                            seen = where[name] = Counter()
                        seen[(thread.pid, thread.tid)] += 1
            self.runs.append({name: [d for _, d in sorted(v)] for name, v in timed.items()})
            if not self.spans:  # the first run's, for which name holds which
                for name, v in timed.items():
                    ordered = sorted(v)
                    self.spans[name] = ([t for t, _ in ordered], [t + d for t, d in ordered])
            self.threads.append(
                {name: _thread_label(trace, c.most_common(1)[0][0]) for name, c in where.items()}
            )
        self.names = set().union(*self.runs) if self.runs else set()
        self.label = " + ".join(self.labels)

    def thread_of(self, name: str) -> str | None:
        """The thread that records name, by its name (a tid where it has none),
        if every run of this side agrees; else None."""
        seen = {threads[name] for threads in self.threads if name in threads}
        return seen.pop() if len(seen) == 1 else None

    def contains(self, outer: str, inner: str) -> bool:
        """Whether most of inner's ranges (in the first run, up to 32 looked
        at) lie inside one of outer's: outer is its parent, and moves with it."""
        starts, ends = self.spans.get(outer, ([], []))
        inner_starts = self.spans.get(inner, ([], []))[0]
        if not starts or not inner_starts:
            return False
        looked = inner_starts[:: max(1, len(inner_starts) // 32)]
        inside = 0
        for t in looked:
            i = bisect.bisect_right(starts, t) - 1
            inside += i >= 0 and ends[i] >= t
        return 2 * inside > len(looked)

    def of(self, name: str) -> list[list[int]]:
        """Each run's durations of name in time order (a run without it: left out)."""
        return [run[name] for run in self.runs if name in run]

    def pooled(self) -> dict[str, list[int]]:
        """Each name's durations over every run, sorted ascending."""
        return {name: sorted(_all(self.of(name))) for name in self.names}


def _thread_label(trace: Trace, key: ThreadKey) -> str:
    # Names, not ids, line threads up across runs: tids are numbered in order
    # of first use, which another run may change.
    return trace.thread_names.get(key) or f"tid {key[1]}"


def _nearest_rank(ordered: Sequence[int], percent: int) -> int:
    rank = -(-percent * len(ordered) // 100)  # key_averages' rule: rank ceil(P/100 * n)
    return ordered[max(rank, 1) - 1]


def _judge(shift: Shift, threshold: float, min_change: float) -> tuple[bool, str]:
    """Whether a row is flagged, and the sentence that says why (or why not)."""
    if shift.pct is None:
        return False, "no typical duration on the base side"
    shown = f"typical {shift.pct:+.1f}%"
    if not shift.judged:
        return False, f"{shown}; too few events to judge ({_units(shift)})"
    assert shift.low_pct is not None and shift.high_pct is not None
    interval = f"[{shift.low_pct:+.1f}%, {shift.high_pct:+.1f}%]"
    if shift.low_pct > threshold:
        near = shift.typical_base * shift.low_pct / 100
    elif shift.high_pct < -threshold:
        near = -shift.typical_base * shift.high_pct / 100
    elif abs(shift.pct) > threshold:
        return False, f"{shown}, {interval} at {CONFIDENCE:.0%} does not clear {threshold:g}%"
    else:
        return False, f"{shown} {interval}, within {threshold:g}%"
    if near < min_change:
        return False, (
            f"{shown} {interval}: at least {format_ns(near)}, under the minimum change "
            f"of {format_ns(min_change)}"
        )
    return True, f"{shown}, {interval} at {CONFIDENCE:.0%} clears {threshold:g}%"


def _units(shift: Shift) -> str:
    b, n = shift.units
    return f"{b} and {n} {shift.by}"


def _signed_ns(value: float) -> str:
    return ("+" if value > 0 else "-" if value < 0 else "") + format_ns(abs(value))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


# (group, column, cell text of a row); a group's title spans its columns.
_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("Count", "base", lambda r: str(r.base.count)),
    ("Count", "new", lambda r: str(r.new.count)),
    ("Total", "base", lambda r: format_ns(r.base.total)),
    ("Total", "new", lambda r: format_ns(r.new.total)),
    ("Total", "diff", lambda r: _signed_ns(r.delta("total"))),
    ("Total", "%", lambda r: _pct(r.change_pct("total"))),
    ("Avg", "base", lambda r: format_ns(r.base.avg)),
    ("Avg", "new", lambda r: format_ns(r.new.avg)),
    ("Avg", "diff", lambda r: _signed_ns(r.delta("avg"))),
    ("Avg", "%", lambda r: _pct(r.change_pct("avg"))),
    ("P50", "base", lambda r: format_ns(r.base.p50)),
    ("P50", "new", lambda r: format_ns(r.new.p50)),
    ("P50", "%", lambda r: _pct(r.change_pct("p50"))),
    ("P99", "base", lambda r: format_ns(r.base.p99)),
    ("P99", "new", lambda r: format_ns(r.new.p99)),
    ("P99", "%", lambda r: _pct(r.change_pct("p99"))),
    ("Typical", "shift", lambda r: _pct(r.shift.pct)),
    ("Typical", f"{CONFIDENCE:.0%} interval", lambda r: _interval(r.shift)),
    ("", "flag", lambda r: _flag(r)),
)


def _interval(shift: Shift) -> str:
    if shift.low_pct is None or shift.high_pct is None:
        return "-"
    return f"{shift.low_pct:+.1f}%..{shift.high_pct:+.1f}%"


def _flag(row: DiffRow) -> str:
    if row.flagged:
        return row.direction.upper() + ("" if row.gates else "*")
    return "noise" if "does not clear" in row.why else ""


def _table(d: Diff) -> str:
    head = f"mxprof diff: {_label(d.base)} -> {_label(d.new)}"
    if d.rows or d.shares is None:
        names = [display(r.name) for r in d.rows]
        cells = [[cell(r) for _, _, cell in _COLUMNS] for r in d.rows]
        heads = [(group, column) for group, column, _ in _COLUMNS]
        lines = [
            f"{head} ({_runs(d)}; flagged when the typical shift's {CONFIDENCE:.0%} interval "
            f"clears {d.threshold:g}% and {format_ns(d.min_change)})",
            *grouped_table("Name", names, heads, cells),
        ]
    else:  # samples on both sides, no range name in common: shares only
        lines = [f"{head}: no range name on both sides; function shares only"]
    for which, only, stats in (
        (d.base, d.only_base, d.base_stats),
        (d.new, d.only_new, d.new_stats),
    ):
        if only:
            listed = ", ".join(
                f"{display(n)} ({stats[n].count} x {format_ns(stats[n].avg)})" for n in only
            )
            lines.append(f"only in {_label(which)}: {listed}")
    for thread, pct in sorted(d.threads.items()):
        lines.append(
            f"{display(thread)} as a whole {pct:+.1f}%: taken out of its ranges' shifts "
            "(a busier machine and code slower everywhere look alike)"
        )
    if any(r.flagged and not r.gates for r in d.rows):
        lines.append(
            "* compared raw (one run a side, too few other ranges on its thread to take the "
            "machine's speed out): never a regression; give several runs a side to gate on it"
        )
    if d.rows or d.shares is None:
        slower, faster = len(d.regressions), len(d.improvements)
        lines.append(
            f"{slower} slower, {faster} faster: interval beyond {d.threshold:g}%"
            f" ({len(d.rows)} compared)"
        )
    if d.shares is not None:
        lines += ["", *d.shares.table()]
    elif d.sampled["base"] or d.sampled["new"]:
        side = "base" if d.sampled["base"] else "new"
        lines.append(f"function shares not compared: stack samples in {side} only")
    return "\n".join(lines) + "\n"


def _label(paths: list[str]) -> str:
    return " + ".join(paths)


def _runs(d: Diff) -> str:
    base, new = d.runs["base"], d.runs["new"]
    if base == new == 1:
        return "one run a side: blocks of each run's events"
    return f"{base} run(s) against {new}: the runs' spread"
