"""Function shares of stack samples, compared between two profiles (``mxprof diff``).

A function's *inclusive share* is the percentage of a side's samples whose
stack holds it (a recursive function counts once per sample); its *self
share* the percentage whose innermost frame it is.  Shares are program-wide:
every sample of every thread and process of a side, pooled over its traces,
ranges ignored.

Functions are matched by qualified name and file name without its directory
(not by line: a function's line moves when code above it is edited, and a
checkout or environment elsewhere moves its directory).  Two functions that
agree on both are one row.

A share is *flagged* as the diff flags a duration: when the whole
confidence interval of its change, in percentage points, clears
``threshold`` points (the diff's threshold, read as points).  The interval
is the two-proportion one (each side's share with its own binomial
variance) at the diff's alpha divided by the number of functions compared
(Bonferroni): a program has hundreds of functions, and at the diff's alpha
per function two runs of the same code would put some interval off zero by
chance; so corrected, the chance that any interval of the same code misses
stays under alpha.  The interval takes samples as independent draws, which
they are not quite (a function running for 100 ms gives 100 samples in a row
at 1 kHz): the threshold in points is the guard against what it misses, as
it is for durations.  The two-proportion z test's p-value is shown beside.

Shares are relative: when one function takes more of the samples, every
other takes less, even at the same speed.  So a flagged share points at
where the program's time went, and is never a regression by itself:
``--fail-on-regression`` gates on time rows only.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._render import display, grouped_table
from ..trace.samples import Frame, Sample

# Rows the text table shows past the flagged ones (JSON has them all).
TABLE_ROWS = 20

Key = tuple[str, str]  # qualified name, file name without its directory
TEST = "two-proportion-interval"


def key_of(frame: Frame) -> Key:
    """The row a frame counts in: its function and file name.

    Example:
        >>> key_of(("Model.forward", "/srv/a/model.py", 12))
        ('Model.forward', 'model.py')
    """
    return (frame[0], os.path.basename(frame[1]))


@dataclass
class Tally:
    """One side's samples per function: all of them, self and inclusive counts,
    and where each function was seen (the frame a row names)."""

    total: int = 0
    innermost: Counter[Key] = field(default_factory=Counter)  # self samples
    inclusive: Counter[Key] = field(default_factory=Counter)
    frames: dict[Key, Frame] = field(default_factory=dict)

    def add(self, samples: Iterable[Sample]) -> None:
        """Count samples in (each distinct stack's frames are looked at once)."""
        for stack, n in Counter(sample.stack for sample in samples).items():
            self.total += n
            keys = [key_of(frame) for frame in stack]
            if keys:
                self.innermost[keys[-1]] += n
            for key, frame in zip(keys, stack):
                self.frames.setdefault(key, frame)
            for key in set(keys):
                self.inclusive[key] += n


@dataclass(frozen=True)
class ShareChange:
    """One share (self or inclusive) of one function on both sides.

    Example:
        >>> c = ShareChange.of(25, 100, 75, 100)
        >>> c.base_pct, c.new_pct, c.delta_pts, c.p_value < 1e-9
        (25.0, 75.0, 50.0, True)
    """

    base: int  # samples
    new: int
    base_pct: float
    new_pct: float
    delta_pts: float  # new_pct - base_pct
    p_value: float
    low_pts: float  # the change's interval at the row's level, points
    high_pts: float

    @classmethod
    def of(
        cls, base: int, base_total: int, new: int, new_total: int, alpha: float = 0.01
    ) -> ShareChange:
        """The change of base of base_total samples to new of new_total (both
        > 0), its interval at 1 - alpha (two-sided)."""
        p1, p2 = base / base_total, new / new_total
        p = two_proportions(base, base_total, new, new_total)
        z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
        half = 100 * z * math.sqrt(p1 * (1 - p1) / base_total + p2 * (1 - p2) / new_total)
        delta = 100.0 * (p2 - p1)
        return cls(base, new, 100.0 * p1, 100.0 * p2, delta, p, delta - half, delta + half)

    def to_json(self) -> dict[str, float]:
        """The fields as plain data."""
        return {
            "base": self.base,
            "new": self.new,
            "base_pct": self.base_pct,
            "new_pct": self.new_pct,
            "delta_pts": self.delta_pts,
            "low_pts": self.low_pts,
            "high_pts": self.high_pts,
            "p_value": self.p_value,
        }


@dataclass(frozen=True)
class ShareRow:
    """One function's shares on both sides, and whether a change is flagged."""

    function: str
    file: str  # without its directory
    line: int  # the new side's, else the base's
    inclusive: ShareChange
    self: ShareChange
    flagged: bool
    direction: str  # "grew", "shrank" or "same": of the flagged share, else the inclusive one
    why: str

    @property
    def label(self) -> str:
        """``function (file:line)``, as the samples table names a function."""
        where = f" ({self.file}:{self.line})" if self.file else ""
        return display(self.function + where)

    def to_json(self) -> dict[str, Any]:
        """The row as plain data."""
        return {
            "function": self.function,
            "file": self.file,
            "line": self.line,
            "inclusive": self.inclusive.to_json(),
            "self": self.self.to_json(),
            "direction": self.direction,
            "flagged": self.flagged,
            "why": self.why,
        }


@dataclass(frozen=True)
class Shares:
    """The function shares of two sides (see the module docstring for the rule).

    Attributes:
        base_samples, new_samples: each side's samples.
        threshold: points a share must move by to be flagged.
        alpha: the significance level of the whole comparison.
        alpha_row: the level one function's test must reach (alpha over the
            number of rows, Bonferroni).
        rows: one per function sampled on either side, the largest move
            (inclusive or self, in points) first, ties by name.
    """

    base_samples: int
    new_samples: int
    threshold: float
    alpha: float
    alpha_row: float
    rows: list[ShareRow]

    @property
    def grew(self) -> list[ShareRow]:
        """Flagged rows whose share grew, in ``rows`` order."""
        return [r for r in self.rows if r.flagged and r.direction == "grew"]

    @property
    def shrank(self) -> list[ShareRow]:
        """Flagged rows whose share shrank, in ``rows`` order."""
        return [r for r in self.rows if r.flagged and r.direction == "shrank"]

    def to_json(self) -> dict[str, Any]:
        """The comparison as plain data (``mxprof diff --format json``: ``shares``)."""
        return {
            "base_samples": self.base_samples,
            "new_samples": self.new_samples,
            "unit": "percent of samples",
            "threshold_pts": self.threshold,
            "test": {
                "name": TEST,
                "alternative": "two-sided",
                "alpha": self.alpha,
                "correction": "bonferroni",
                "alpha_per_function": self.alpha_row,
            },
            "matched_by": "function and file name",
            "rows": [r.to_json() for r in self.rows],
            "grew": [r.label for r in self.grew],
            "shrank": [r.label for r in self.shrank],
        }

    def table(self) -> list[str]:
        """The text section: the flagged rows and the largest moves, then a summary."""
        return _table(self)


def compare(base: Tally, new: Tally, threshold: float, alpha: float) -> Shares:
    """The shares of every function sampled on either side (each side has samples).

    Example:
        >>> from mxprof.trace.samples import Sample
        >>> a, b = Tally(), Tally()
        >>> a.add([Sample(1, 1, 0, (("f", "x.py", 1),), None)] * 25)
        >>> a.add([Sample(1, 1, 0, (("g", "x.py", 9),), None)] * 75)
        >>> b.add([Sample(1, 1, 0, (("f", "x.py", 1),), None)] * 75)
        >>> b.add([Sample(1, 1, 0, (("g", "x.py", 9),), None)] * 25)
        >>> [(r.function, r.direction) for r in compare(a, b, 5.0, 0.01).grew]
        [('f', 'grew')]
    """
    rows = []
    keys = base.inclusive.keys() | new.inclusive.keys()
    alpha_row = alpha / max(len(keys), 1)
    for key in keys:
        incl = ShareChange.of(
            base.inclusive[key], base.total, new.inclusive[key], new.total, alpha_row
        )
        own = ShareChange.of(
            base.innermost[key], base.total, new.innermost[key], new.total, alpha_row
        )
        flagged, direction, why = _judge(incl, own, threshold, alpha_row)
        line = (new.frames.get(key) or base.frames[key])[2]
        rows.append(ShareRow(key[0], key[1], line, incl, own, flagged, direction, why))
    rows.sort(key=lambda r: (-max(abs(r.inclusive.delta_pts), abs(r.self.delta_pts)), r.label))
    return Shares(base.total, new.total, threshold, alpha, alpha_row, rows)


def two_proportions(x1: int, n1: int, x2: int, n2: int) -> float:
    """Two-sided p-value of a two-proportion z test: x1 of n1 against x2 of n2,
    the variance from the pooled proportion.  1 when the pooled proportion is
    0 or 1 (nothing could have differed).

    Example:
        >>> round(two_proportions(40, 100, 60, 100), 4)
        0.0047
    """
    pooled = (x1 + x2) / (n1 + n2)
    variance = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if variance <= 0:
        return 1.0
    z = abs(x2 / n2 - x1 / n1) / math.sqrt(variance)
    return min(1.0, math.erfc(z / math.sqrt(2)))


def _judge(
    incl: ShareChange, own: ShareChange, threshold: float, alpha: float
) -> tuple[bool, str, str]:
    """Whether a row is flagged, its direction (of the first flagged share,
    inclusive before self, else of the inclusive one), and the sentence that
    says why (or why not) for both shares."""
    chosen: ShareChange | None = None
    said = []
    for what, change in (("inclusive", incl), ("self", own)):
        text = f"{what} {change.delta_pts:+.1f} pts [{change.low_pts:+.1f}, {change.high_pts:+.1f}]"
        if change.low_pts > threshold or change.high_pts < -threshold:
            said.append(f"{text}: the interval clears {threshold:g} pts")
            chosen = chosen or change
        elif abs(change.delta_pts) > threshold:
            said.append(f"{text}: the interval does not clear {threshold:g} pts")
        else:
            said.append(f"{text}: within {threshold:g} pts")
    delta = (chosen or incl).delta_pts
    direction = "grew" if delta > 0 else "shrank" if delta < 0 else "same"
    return chosen is not None, direction, "; ".join(said)


def _p(value: float) -> str:
    return f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


def _flag(row: ShareRow) -> str:
    if row.flagged:
        return row.direction.upper()
    return "noise" if "does not clear" in row.why else ""  # moved, but not its interval


# (group, column, cell of a row)
_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("Samples (incl.)", "base", lambda r: str(r.inclusive.base)),
    ("Samples (incl.)", "new", lambda r: str(r.inclusive.new)),
    ("Inclusive %", "base", lambda r: f"{r.inclusive.base_pct:.1f}"),
    ("Inclusive %", "new", lambda r: f"{r.inclusive.new_pct:.1f}"),
    ("Inclusive %", "pts", lambda r: f"{r.inclusive.delta_pts:+.1f}"),
    ("Inclusive %", "p", lambda r: _p(r.inclusive.p_value)),
    ("Self %", "base", lambda r: f"{r.self.base_pct:.1f}"),
    ("Self %", "new", lambda r: f"{r.self.new_pct:.1f}"),
    ("Self %", "pts", lambda r: f"{r.self.delta_pts:+.1f}"),
    ("Self %", "p", lambda r: _p(r.self.p_value)),
    ("", "flag", _flag),
)


def _shown(shares: Shares) -> list[ShareRow]:
    """The flagged rows, then the largest other moves up to TABLE_ROWS, in rows order."""
    flagged = {id(r) for r in shares.rows if r.flagged}
    others = [r for r in shares.rows if id(r) not in flagged][:TABLE_ROWS]
    keep = flagged | {id(r) for r in others}
    return [r for r in shares.rows if id(r) in keep]


def _table(shares: Shares) -> list[str]:
    rows = _shown(shares)
    cells = [[cell(r) for _, _, cell in _COLUMNS] for r in rows]
    heads = [(group, column) for group, column, _ in _COLUMNS]
    lines = [
        f"Function shares of stack samples: {shares.base_samples} -> {shares.new_samples} "
        f"samples (flagged when a change's interval clears {shares.threshold:g} points; "
        f"two-proportion intervals at {1 - shares.alpha:.0%} over {len(shares.rows)} "
        f"functions: {1 - shares.alpha_row:.4g} each)",
        *grouped_table("Function", [r.label for r in rows], heads, cells),
    ]
    left = len(shares.rows) - len(rows)
    more = f"; {left} more, unflagged, not shown" if left else ""
    lines.append(
        f"{len(shares.grew)} grew, {len(shares.shrank)} shrank: interval beyond "
        f"{shares.threshold:g} points ({len(shares.rows)} functions compared{more})"
    )
    lines.append(
        "Shares are relative (one growing makes the others shrink): flagged, never a "
        "regression for --fail-on-regression."
    )
    return lines
