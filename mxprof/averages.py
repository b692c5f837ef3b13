"""Per-name statistics rows shared by ``profile.key_averages()`` and ``load()``.

A row holds one range name's numbers in nanoseconds; ``KeyAverages`` is a
list of rows that renders a table like ``torch.profiler``'s, with units
chosen per cell.

Percentiles have one definition, live and loaded: the nearest rank, P is the
duration at 1-based rank ceil(P/100 * count) of the sorted durations (so P of
one range is its duration, and P99 of fewer than 100 is the maximum).  Rows
from a loaded trace (``load(...).key_averages()``) give it exactly.  Rows
from the live core (``profile().key_averages()``, ``dumps()``, ``mxprof run``)
keep no events, only a log-linear histogram per name (64 buckets per power of
two of clock ticks): they give the midpoint of the ranked duration's bucket,
kept within [min, max], which is within 1/128 (0.79 %) of the exact value
(give or take the nanosecond that ticks round to); the first and last rank
are exact.  So for one run the two agree within 0.79 %.  The loaded side
does not imitate the histogram: its buckets are in ticks of the run's clock
(the TSC on x86), which a trace file does not hold, so buckets in ns would
only add a second error of the same size.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Union

from ._render import display, format_ns, is_own, pad, sort_key, width
from .errors import ConfigError


@dataclass
class Row:
    """One range name's statistics; times in ns.

    Percentiles are None when unknown (for instance a row built from a single
    aggregate without a histogram); exact for a loaded trace, within 0.79 %
    for the live core (see the module docstring).
    """

    name: str
    category: str
    count: int
    total: float
    self: float
    min: float
    max: float
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @property
    def avg(self) -> float:
        """Mean duration in ns."""
        return self.total / self.count if self.count else 0.0

    @property
    def key(self) -> str:
        """The row's name (torch.profiler's attribute for it)."""
        return self.name


_COLUMNS: tuple[tuple[str, Callable[[Row], str]], ...] = (
    ("Count", lambda r: str(r.count)),
    ("Total", lambda r: format_ns(r.total)),
    ("Self", lambda r: format_ns(r.self)),
    ("Avg", lambda r: format_ns(r.avg)),
    ("Min", lambda r: format_ns(r.min)),
    ("Max", lambda r: format_ns(r.max)),
    ("P50", lambda r: format_ns(r.p50)),
    ("P90", lambda r: format_ns(r.p90)),
    ("P99", lambda r: format_ns(r.p99)),
)

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Tally:
    """Sorted durations as their distinct values and, for each, how many
    durations are at most it: the same multiset in a few kB where most
    durations repeat (short ranges, which a file's ns resolution rounds to a
    few hundred values), for sending between processes.

    Attributes:
        values: the distinct durations, ascending (ns).
        upto: ``upto[i]`` durations are <= ``values[i]`` (so ``upto[-1]`` is
            the count).
        total: the durations' sum (ns).
    """

    values: Sequence[int]
    upto: Sequence[int]
    total: int

    def __len__(self) -> int:
        return self.upto[-1] if len(self.upto) else 0

    def at_most(self, value: int) -> int:
        """How many durations are <= value."""
        i = bisect_right(self.values, value)
        return self.upto[i - 1] if i else 0


Run = Union[Sequence[int], Tally]  # sorted durations, listed or tallied
# A run is tallied when at least this share of the neighbours sampled are equal.
_TALLY_REPEATS = 0.5


def tally(ordered: Run) -> Run:
    """Sorted durations as a :class:`Tally` where most of them repeat, else as
    they are (a tally of distinct values would only be larger).

    Whether they repeat is judged from up to 256 neighbouring pairs spread
    over the run, so a run of distinct values costs nearly nothing.

    Example:
        >>> t = tally([3] * 40 + [5] * 30 + [9])
        >>> list(t.values), list(t.upto), t.total, len(t)
        ([3, 5, 9], [40, 70, 71], 279, 71)
        >>> tally([1, 2, 3])
        [1, 2, 3]
    """
    n = len(ordered)
    if isinstance(ordered, Tally) or n < 64:
        return ordered
    step = max(1, (n - 1) // 256)
    pairs = range(0, n - 1, step)
    equal = sum(ordered[i] == ordered[i + 1] for i in pairs)
    if equal < _TALLY_REPEATS * len(pairs):
        return ordered
    try:
        values, upto = _distinct(ordered)
    except OverflowError:  # past int64 ns (a damaged file): sent as it is
        return ordered
    total, below = 0, 0
    for v, at in zip(values, upto):
        total += v * (at - below)
        below = at
    return Tally(values, upto, total)


def _distinct(ordered: Sequence[int]) -> tuple[array[int], array[int]]:
    """(distinct values, how many are at most each) of a sorted run.

    From value to value by bisection (a few hundred distinct values among
    tens of thousands cost a few hundred bisections); past one distinct
    value in 32, a count of every duration costs less, and is taken.
    """
    n = len(ordered)
    values, upto = array("q"), array("q")
    i, most = 0, n // 32 + 1
    while i < n and len(values) <= most:
        v = ordered[i]
        i = bisect_right(ordered, v, i)
        values.append(v)
        upto.append(i)
    if i < n:
        counts = sorted(Counter(ordered).items())
        values = array("q", [v for v, _ in counts])
        upto = array("q", accumulate(c for _, c in counts))
    return values, upto


def _at_most(run: Run, value: int) -> int:
    return run.at_most(value) if isinstance(run, Tally) else bisect_right(run, value)


def _ends(run: Run) -> tuple[int, int]:
    values = run.values if isinstance(run, Tally) else run
    return values[0], values[-1]


def _total(run: Run) -> int:
    return run.total if isinstance(run, Tally) else sum(run)


def nearest_rank(runs: Sequence[Run], percent: int) -> int:
    """The nearest-rank percentile (see the module docstring) of the durations
    of several sorted runs together, without merging them.

    The duration at rank r is the least value v with at least r durations
    <= v: found by bisecting the values between the runs' ends, each step
    counting with one bisection per run (about 64 steps for ns).  A run is
    a sorted sequence or a :class:`Tally` of one.

    Example:
        >>> nearest_rank([[1, 5, 9], [2, 3]], 50), nearest_rank([[1, 5, 9], [2, 3]], 99)
        (3, 9)
    """
    count = sum(len(r) for r in runs)
    rank = max(-(-percent * count // 100), 1)  # ceil without floats
    ends = [_ends(r) for r in runs if len(r)]
    lo = min(first for first, _ in ends)
    hi = max(last for _, last in ends)
    while lo < hi:  # invariant: the answer is in [lo, hi]
        mid = (lo + hi) // 2
        if sum(_at_most(r, mid) for r in runs) >= rank:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True)
class Partial:
    """One file's per-name statistics in a form that merges exactly: per
    (name, category), the self time in all and the durations, sorted (ns).

    What ``mxprof.trace.engine.stats_part`` returns of each file;
    :func:`combine` makes the rows of several.
    """

    groups: dict[tuple[str, str], tuple[int, Run]]


def combine(parts: Iterable[Partial]) -> KeyAverages:
    """The rows of several files' partials together, largest total first: the
    rows ``load().key_averages()`` gives of the files merged into one.

    Example:
        >>> a = Partial({("step", "app"): (4, [1, 5])})
        >>> b = Partial({("step", "app"): (6, [2, 9])})
        >>> r = combine([a, b])[0]
        >>> r.count, r.total, r.self, r.min, r.max, r.p50, r.p99
        (4, 17, 10, 1, 9, 2, 9)
    """
    runs: dict[tuple[str, str], list[Run]] = {}
    selfs: dict[tuple[str, str], int] = {}
    for part in parts:
        for key, (own, durations) in part.groups.items():
            if len(durations):
                runs.setdefault(key, []).append(durations)
                selfs[key] = selfs.get(key, 0) + own
    rows = []
    for (name, category), found in sorted(runs.items()):
        p50, p90, p99 = (nearest_rank(found, p) for p in PERCENTILES)
        rows.append(
            Row(
                name,
                category,
                sum(len(d) for d in found),
                sum(_total(d) for d in found),
                selfs[(name, category)],
                min(_ends(d)[0] for d in found),
                max(_ends(d)[1] for d in found),
                p50,
                p90,
                p99,
            )
        )
    return KeyAverages(rows).sorted("total")


class KeyAverages(list[Row]):
    """A list of Rows with a torch-like ``table()``.

    Example:
        >>> rows = KeyAverages([Row("step", "train", 2, 3e6, 1e6, 1e6, 2e6)])
        >>> print(rows.table(sort_by="total"))  # doctest: +SKIP
    """

    def __init__(self, rows: Iterable[Row] = ()) -> None:
        super().__init__(rows)

    def sorted(self, sort_by: str = "total", ascending: bool = False) -> KeyAverages:
        """Rows ordered by sort_by (descending unless ascending); ties by name."""
        key = sort_key(sort_by)
        sign = 1 if ascending else -1

        def value(r: Row) -> tuple[float, str]:
            v = getattr(r, key)
            return (sign * (v if v is not None else float("-inf")), r.name)

        return KeyAverages(sorted(self, key=value))

    def without_own(self) -> KeyAverages:
        """The rows users are shown: the profiler's own ranges (``_render.is_own``:
        the writer's flush ...) left out, the order kept.

        Example:
            >>> rows = KeyAverages([Row("flush", "mxprof", 1, 5, 5, 5, 5)])
            >>> rows.append(Row("step", "app", 1, 9, 9, 9, 9))
            >>> [r.name for r in rows.without_own()]
            ['step']
        """
        return KeyAverages(r for r in self if not is_own(r.category, r.name))

    def table(self, sort_by: str = "total", row_limit: int | None = 100) -> str:
        """The rows as a text table, sorted, at most row_limit rows (None: all).

        Raises:
            ConfigError: an unknown sort_by or a negative row_limit.
        """
        if row_limit is not None and (
            isinstance(row_limit, bool) or not isinstance(row_limit, int) or row_limit < 0
        ):
            raise ConfigError(f"row_limit must be an int >= 0 or None, got {row_limit!r}")
        rows = self.sorted(sort_by)
        if row_limit is not None:
            rows = KeyAverages(rows[:row_limit])
        names = [display(r.name) for r in rows]
        cats = [display(r.category) for r in rows]
        nwidth = max([len("Name")] + [width(n) for n in names]) + 2
        cwidth = max([len("Category")] + [width(c) for c in cats]) + 2
        cells = [[f(r) for _, f in _COLUMNS] for r in rows]
        widths = [
            max([len(head)] + [len(c[i]) for c in cells]) + 2
            for i, (head, _) in enumerate(_COLUMNS)
        ]
        rule = "-" * (nwidth + cwidth + sum(widths))
        lines = [
            rule,
            f"{'Name':<{nwidth}}{'Category':<{cwidth}}"
            + "".join(f"{h:>{w}}" for (h, _), w in zip(_COLUMNS, widths)),
            rule,
        ]
        for name, cat, row in zip(names, cats, cells):
            lines.append(
                pad(name, nwidth)
                + pad(cat, cwidth)
                + "".join(f"{c:>{w}}" for c, w in zip(row, widths))
            )
        lines.append(rule)
        return "\n".join(lines) + "\n"
