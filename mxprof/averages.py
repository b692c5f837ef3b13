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

from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

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


def nearest_rank(runs: Sequence[Sequence[int]], percent: int) -> int:
    """The nearest-rank percentile (see the module docstring) of the durations
    of several sorted runs together, without merging them.

    The duration at rank r is the least value v with at least r durations
    <= v: found by bisecting the values between the runs' ends, each step
    counting with one bisection per run (about 64 steps for ns).

    Example:
        >>> nearest_rank([[1, 5, 9], [2, 3]], 50), nearest_rank([[1, 5, 9], [2, 3]], 99)
        (3, 9)
    """
    count = sum(len(r) for r in runs)
    rank = max(-(-percent * count // 100), 1)  # ceil without floats
    lo = min(r[0] for r in runs if len(r))
    hi = max(r[-1] for r in runs if len(r))
    while lo < hi:  # invariant: the answer is in [lo, hi]
        mid = (lo + hi) // 2
        if sum(bisect_right(r, mid) for r in runs) >= rank:
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

    groups: dict[tuple[str, str], tuple[int, Sequence[int]]]


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
    runs: dict[tuple[str, str], list[Sequence[int]]] = {}
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
                sum(sum(d) for d in found),
                selfs[(name, category)],
                min(d[0] for d in found),
                max(d[-1] for d in found),
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
