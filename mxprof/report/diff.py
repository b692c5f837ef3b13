"""Compare two profiles name by name: ``mxprof diff BASE NEW`` and ``diff(base, new)``.

Every range name recorded on both sides gets a row: count, total, avg, P50
and P99 of each side (ns; percentiles by the nearest-rank rule of
``key_averages``) and the change, absolute and in percent.  A row is
*flagged* when both of these hold:

- its average duration changed by more than ``threshold`` percent (5 by
  default): the change is big enough to matter;
- the change is beyond the noise of the two duration distributions: a
  two-sided Mann-Whitney U test on the per-event durations rejects "both
  sides draw from one distribution" at ``ALPHA`` (0.01), and its direction
  (new durations tend to be larger, or smaller) is the average's.

The U test ranks the pooled durations, so it asks whether one side's
durations tend to be larger than the other's: a few outliers that move the
average do not make it significant, and with many events a real shift of a
few percent does.  Its p-value is exact (the permutation distribution of the
rank sum, tied durations given their mean rank) when neither side has more
than ``EXACT_MAX`` events, and otherwise comes from the normal approximation
with the tie correction and a continuity correction.  Too few events cannot
reach ``ALPHA`` (one a side: p = 1; three a side: p >= 0.1), so a change seen
in a handful of events is never flagged: five events a side, every new one
slower than every old one, is the least that can be.  The test takes the
durations as independent draws, and it sees one run a side: it cannot tell
a slower program from a slower machine (another job, a different clock
speed), which moves every duration of a run together.  Two runs of the
quickstart example back to back on a busy machine differ by 3-8 % with p
far below ALPHA; the threshold is the guard against that, so compare runs
from one quiet machine, or raise it.

Names are the unit, as in "names only in one side": a name recorded under
several categories (two domains) is one row, its durations pooled.  Several
traces per side (``diff([a1, a2], [b1, b2])``) pool the same way.  The
profiler's own ranges (``_render.is_own``: its writer's flush) are left out.

When both sides hold stack samples (``sample_rate``), functions are compared
too, by their share of the samples (``Diff.shares``; the rule is in
``mxprof.report._shares``): inclusive and self share, base and new, the
change in percentage points, a two-proportion z test at ``ALPHA`` over the
number of functions (Bonferroni) and the threshold read as points.  Shares
are relative (one function growing makes the others shrink), so a flagged
share is reported but is never a regression:
``regressions`` (what ``--fail-on-regression`` gates on) holds time rows only.
Two sides with samples but no range name in common compare shares alone.

``Diff.to_json()`` (``mxprof diff --format json``) returns::

    {"base": [paths], "new": [paths], "unit": "ns", "threshold_pct": 5.0,
     "test": {"name": "mann-whitney-u", "alternative": "two-sided",
              "alpha": 0.01, "exact_max": 20},
     "truncated": {"base": bool, "new": bool},
     "rows": [{"name", "categories": [str],
               "base": {"count", "total", "avg", "p50", "p99"}, "new": {...},
               "delta": {...},        # new - base, same keys (ns; count in events)
               "change_pct": {...},   # 100 * delta / base, null where base is 0
               "p_value", "exact": bool,  # exact p-value, or the normal approximation
               "prob_slower",         # P(a new duration > a base one), ties count half
               "direction": "slower" | "faster" | "same",   # of the average
               "flagged": bool, "why": str}],
     "only_base": [{"name", "categories", "count", "total", "avg", "p50", "p99"}],
     "only_new": [...], "regressions": [names], "improvements": [names],
     "shares": null | {           # null unless both sides have stack samples
         "base_samples", "new_samples", "unit": "percent of samples",
         "threshold_pts", "test": {"name": "two-proportion-z", "alternative", "alpha",
                                   "correction": "bonferroni", "alpha_per_function"},
         "matched_by": "function and file name",
         "rows": [{"function", "file", "line",
                   "inclusive": {"base", "new", "base_pct", "new_pct", "delta_pts", "p_value"},
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

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from .._render import display, format_ns, grouped_table, is_own
from ..errors import ConfigError, ProfilerError
from ..trace import Trace, load
from ._shares import Shares, Tally, compare

# The test's significance level: a row is beyond the noise when p < ALPHA.
ALPHA = 0.01
# Sides of at most this many events get the exact p-value: its counts of rank
# sums take under 10 ms at 20 + 20, and past that the normal approximation is
# close to it (tests/test_diff.py holds it within 2e-3 at 21 + 21).
EXACT_MAX = 20
# The statistics of each side, in the order tables and JSON show them.
STATS = ("count", "total", "avg", "p50", "p99")

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
class RankTest:
    """A two-sided Mann-Whitney U test of base durations against new ones.

    ``p_value`` is the probability, were both sides drawn from one
    distribution, of rank sums at least this far from their mean; ``exact``
    says whether it was counted exactly or taken from the normal
    approximation.  ``prob_slower`` is U of the new side over n_base * n_new:
    the chance that a new duration exceeds a base one (ties count half).

    Example:
        >>> test = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
        >>> round(test.p_value, 5), test.exact, test.prob_slower
        (0.00794, True, 1.0)
    """

    p_value: float
    exact: bool
    prob_slower: float


@dataclass(frozen=True)
class DiffRow:
    """One name on both sides: their numbers, the test, and whether it is flagged.

    Example:
        >>> row = diff("base.json", "new.json").rows[0]  # doctest: +SKIP
        >>> row.name, row.base.avg, row.new.avg, row.change_pct("avg")  # doctest: +SKIP
        ('forward', 6554.2, 7912.0, 20.716...)
    """

    name: str
    categories: tuple[str, ...]
    base: Stats
    new: Stats
    test: RankTest
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
    def direction(self) -> str:
        """'slower', 'faster' or 'same': how the average duration moved."""
        change = self.delta("avg")
        return "slower" if change > 0 else "faster" if change < 0 else "same"

    @property
    def p_value(self) -> float:
        """The Mann-Whitney U test's two-sided p-value."""
        return self.test.p_value


class Diff:
    """The comparison of two profiles (see the module docstring for the rule).

    Attributes:
        base, new: the files (or ``<Trace>``) of each side.
        threshold: percent the average must move by to be flagged.
        rows: one ``DiffRow`` per name on both sides, the largest change of
            total time first (ties by name).
        only_base, only_new: names on one side only, sorted; their numbers
            are in ``base_stats`` / ``new_stats``.
        base_stats, new_stats: every name's ``Stats`` on each side.
        truncated: per side, whether a file was cut short.
        shares: the function shares of the stack samples (``_shares.Shares``),
            or None unless both sides have samples.
        sampled: per side, its number of stack samples.

    Example:
        >>> d = diff("base.json", "new.json")  # doctest: +SKIP
        >>> print(d.to_table())  # doctest: +SKIP
    """

    def __init__(self, base: _Side, new: _Side, threshold: float) -> None:
        self.base = base.labels
        self.new = new.labels
        self.threshold = threshold
        self.truncated = {"base": base.truncated, "new": new.truncated}
        self.base_stats = {name: Stats.of(d) for name, d in base.durations.items()}
        self.new_stats = {name: Stats.of(d) for name, d in new.durations.items()}
        self.only_base = sorted(base.durations.keys() - new.durations.keys())
        self.only_new = sorted(new.durations.keys() - base.durations.keys())
        self.categories = {**base.categories}
        for name, cats in new.categories.items():
            self.categories[name] = self.categories.get(name, set()) | cats
        rows = []
        for name in base.durations.keys() & new.durations.keys():
            test = mann_whitney_u(base.durations[name], new.durations[name])
            b, n = self.base_stats[name], self.new_stats[name]
            flagged, why = _judge(b, n, test, threshold)
            categories = tuple(sorted(self.categories[name]))
            rows.append(DiffRow(name, categories, b, n, test, flagged, why))
        rows.sort(key=lambda r: (-abs(r.delta("total")), r.name))
        self.rows = rows
        self.sampled = {"base": base.samples.total, "new": new.samples.total}
        self.shares: Shares | None = None
        if base.samples.total and new.samples.total:
            self.shares = compare(base.samples, new.samples, threshold, ALPHA)

    @property
    def regressions(self) -> list[DiffRow]:
        """Flagged rows whose average got slower, in ``rows`` order (never a
        function share: they are relative, see the module docstring)."""
        return [r for r in self.rows if r.flagged and r.direction == "slower"]

    @property
    def improvements(self) -> list[DiffRow]:
        """Flagged rows whose average got faster, in ``rows`` order."""
        return [r for r in self.rows if r.flagged and r.direction == "faster"]

    def to_json(self) -> dict[str, Any]:
        """The comparison as plain data; the keys are in the module docstring.

        Example:
            >>> doc = diff("base.json", "new.json").to_json()  # doctest: +SKIP
            >>> doc["rows"][0]["change_pct"]["avg"], doc["regressions"]  # doctest: +SKIP
            (20.7, ['forward'])
        """

        def one_side(name: str, stats: Stats) -> dict[str, Any]:
            cats = sorted(self.categories[name])
            return {"name": name, "categories": cats, **stats.to_json()}

        return {
            "base": self.base,
            "new": self.new,
            "unit": "ns",
            "threshold_pct": self.threshold,
            "test": {
                "name": "mann-whitney-u",
                "alternative": "two-sided",
                "alpha": ALPHA,
                "exact_max": EXACT_MAX,
            },
            "truncated": dict(self.truncated),
            "rows": [
                {
                    "name": r.name,
                    "categories": list(r.categories),
                    "base": r.base.to_json(),
                    "new": r.new.to_json(),
                    "delta": {s: r.delta(s) for s in STATS},
                    "change_pct": {s: r.change_pct(s) for s in STATS},
                    "p_value": r.test.p_value,
                    "exact": r.test.exact,
                    "prob_slower": r.test.prob_slower,
                    "direction": r.direction,
                    "flagged": r.flagged,
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
        avg) and the change in percent (``%``); ``p`` is the test's p-value;
        ``flag`` is SLOWER or FASTER for a flagged row, ``noise`` for an
        average that moved past the threshold within the noise.  When both
        sides have stack samples, a section of function shares follows
        (flag GREW or SHRANK).

        Example:
            >>> print(diff("base.json", "new.json", threshold=10).to_table())  # doctest: +SKIP
        """
        return _table(self)


def diff(base: Inputs, new: Inputs, *, threshold: float = 5.0) -> Diff:
    """Compare two profiles name by name (the rule is in the module docstring).

    Args:
        base: the profile to compare against: a trace file (any kind
            ``mxprof.load`` reads), a loaded ``Trace``, or a sequence of them
            whose ranges are pooled.
        new: the profile to compare, in the same forms.
        threshold: percent (>= 0) the average duration must change by for a
            row to be flagged; for function shares, the percentage points a
            share must move by.

    Returns:
        A ``Diff``.

    Raises:
        ConfigError: threshold is not a number >= 0, or a side is an empty sequence.
        TraceReadError, TraceFormatError: a file cannot be read or is not a
            trace (the message names it).
        DiffError: a side has no ranges, or no name is on both sides, and
            not both sides have stack samples to compare.

    Example:
        >>> d = diff("base.json", "new.json", threshold=10)  # doctest: +SKIP
        >>> for row in d.regressions:  # doctest: +SKIP
        ...     print(row.name, f"{row.change_pct('avg'):+.1f}%", row.why)
    """
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not threshold >= 0
        or math.isinf(threshold)
    ):
        raise ConfigError(f"threshold must be a finite number of percent >= 0, got {threshold!r}")
    sides = _Side(base, "base"), _Side(new, "new")
    if sides[0].samples.total and sides[1].samples.total:
        return Diff(*sides, float(threshold))  # shares compare whatever the ranges
    for side in sides:
        if not side.durations:
            raise DiffError(
                f"{side.label}: no ranges to compare (only counters, markers, or nothing)"
            )
    if not sides[0].durations.keys() & sides[1].durations.keys():
        raise DiffError(
            f"no range name in common between {sides[0].label} ({len(sides[0].durations)} "
            f"names) and {sides[1].label} ({len(sides[1].durations)} names): "
            "are they profiles of the same program?"
        )
    return Diff(*sides, float(threshold))


def mann_whitney_u(base: Sequence[float], new: Sequence[float]) -> RankTest:
    """Two-sided Mann-Whitney U test of two samples, each sorted ascending.

    Exact (the permutation distribution of the rank sum, ties at their mean
    rank) when neither sample has more than ``EXACT_MAX`` values; otherwise
    the normal approximation with the tie correction and a continuity
    correction of 1/2.  An empty sample gives p = 1.

    Example:
        >>> test = mann_whitney_u([11, 12, 17, 20], [16, 19, 22, 24, 29])
        >>> round(test.p_value, 4), test.prob_slower
        (0.1111, 0.85)
    """
    n_base, n_new = len(base), len(new)
    if not n_base or not n_new:
        return RankTest(1.0, True, 0.5)
    groups = list(_tie_groups(base, new))
    # Ranks are doubled so that a tie's mean rank stays an integer.
    rank_sum_new = sum(in_new * rank2 for _, in_new, rank2 in groups)
    u_new = rank_sum_new / 2 - n_new * (n_new + 1) / 2
    prob_slower = u_new / (n_base * n_new)
    if n_base <= EXACT_MAX and n_new <= EXACT_MAX:
        ranks2 = [rank2 for in_base, in_new, rank2 in groups for _ in range(in_base + in_new)]
        return RankTest(_exact_p(ranks2, n_new, rank_sum_new), True, prob_slower)
    pooled = n_base + n_new
    ties = sum((a + b) ** 3 - (a + b) for a, b, _ in groups)
    variance = n_base * n_new / 12 * ((pooled + 1) - ties / (pooled * (pooled - 1)))
    if variance <= 0:  # every duration equal
        return RankTest(1.0, False, prob_slower)
    z = max(0.0, abs(u_new - n_base * n_new / 2) - 0.5) / math.sqrt(variance)
    return RankTest(min(1.0, math.erfc(z / math.sqrt(2))), False, prob_slower)


class _Side:
    """One side's durations per name and its stack samples, pooled over its traces."""

    def __init__(self, inputs: Inputs, which: str) -> None:
        single = (str, os.PathLike, Trace)
        sources: list[Source] = [inputs] if isinstance(inputs, single) else list(inputs)
        if not sources:
            raise ConfigError(f"{which}: no trace given")
        self.labels: list[str] = []
        self.durations: dict[str, list[int]] = {}
        self.categories: dict[str, set[str]] = {}
        self.truncated = False
        self.samples = Tally()
        for source in sources:
            trace = source if isinstance(source, Trace) else load(source)
            self.labels.append(trace.path if trace.path is not None else "<Trace>")
            self.truncated |= trace.truncated
            self.samples.add(trace.samples.samples)
            for event in trace:
                if event.dur is not None and not is_own(event.category, event.name):
                    self.durations.setdefault(event.name, []).append(event.dur)
                    self.categories.setdefault(event.name, set()).add(event.category)
        for durations in self.durations.values():
            durations.sort()
        self.label = " + ".join(self.labels)


def _nearest_rank(ordered: Sequence[int], percent: int) -> int:
    rank = -(-percent * len(ordered) // 100)  # key_averages' rule: rank ceil(P/100 * n)
    return ordered[max(rank, 1) - 1]


def _tie_groups(a: Sequence[float], b: Sequence[float]) -> Iterable[tuple[int, int, int]]:
    """Merge two ascending samples: per distinct value, (count in a, count in b,
    twice the value's mean rank in the pooled sample)."""
    i = j = ranked = 0
    while i < len(a) or j < len(b):
        value = min(a[i] if i < len(a) else math.inf, b[j] if j < len(b) else math.inf)
        start_i, start_j = i, j
        while i < len(a) and a[i] == value:
            i += 1
        while j < len(b) and b[j] == value:
            j += 1
        tied = i - start_i + j - start_j
        # Ranks ranked+1 .. ranked+tied; twice their mean is 2*ranked + tied + 1.
        yield i - start_i, j - start_j, 2 * ranked + tied + 1
        ranked += tied


def _exact_p(ranks2: list[int], k: int, observed: int) -> float:
    """P(|S - mean| >= |observed - mean|) for S the sum of k of ranks2 drawn at random.

    The distribution of rank sums is symmetric about its mean (the mean ranks
    of a pooled sample are), so this is the usual two-sided p-value.
    """
    # ways[j][s]: subsets of j of the ranks seen so far with sum s.
    ways: list[dict[int, int]] = [{0: 1}] + [{} for _ in range(k)]
    for rank2 in ranks2:
        for j in range(k, 0, -1):
            target = ways[j]
            for s, count in ways[j - 1].items():
                target[s + rank2] = target.get(s + rank2, 0) + count
    mean = k * (len(ranks2) + 1)  # k times the mean doubled rank
    extreme = abs(observed - mean)
    hits = sum(c for s, c in ways[k].items() if abs(s - mean) >= extreme)
    return min(1.0, hits / math.comb(len(ranks2), k))


def _judge(base: Stats, new: Stats, test: RankTest, threshold: float) -> tuple[bool, str]:
    """Whether a row is flagged, and the sentence that says why (or why not)."""
    change = base.avg and 100.0 * (new.avg - base.avg) / base.avg
    shown = f"avg {change:+.1f}%" if base.avg else f"avg {format_ns(new.avg)} from 0ns"
    p = f"Mann-Whitney U p={_p(test.p_value)}"
    if new.avg == base.avg or (base.avg and abs(change) <= threshold):
        return False, f"{shown}, within {threshold:g}%"
    if test.p_value >= ALPHA:
        return False, f"{shown}, within the noise ({p} >= {ALPHA:g})"
    if (new.avg > base.avg) != (test.prob_slower > 0.5):
        return False, (
            f"{shown}, but the durations tend the other way ({p}, "
            f"P(new > base) = {test.prob_slower:.2f}): a few outliers moved the mean"
        )
    return True, f"{shown} beyond {threshold:g}% and the noise ({p} < {ALPHA:g})"


def _p(value: float) -> str:
    return f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


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
    ("", "p", lambda r: _p(r.test.p_value)),
    ("", "flag", lambda r: _flag(r)),
)


def _flag(row: DiffRow) -> str:
    if row.flagged:
        return row.direction.upper()
    return "noise" if "within the noise" in row.why else ""


def _table(d: Diff) -> str:
    head = f"mxprof diff: {_label(d.base)} -> {_label(d.new)}"
    if d.rows or d.shares is None:
        names = [display(r.name) for r in d.rows]
        cells = [[cell(r) for _, _, cell in _COLUMNS] for r in d.rows]
        heads = [(group, column) for group, column, _ in _COLUMNS]
        lines = [
            f"{head} (threshold {d.threshold:g}%, two-sided Mann-Whitney U at alpha {ALPHA:g})",
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
    if d.rows or d.shares is None:
        slower, faster = len(d.regressions), len(d.improvements)
        lines.append(
            f"{slower} slower, {faster} faster beyond {d.threshold:g}% and the noise"
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
