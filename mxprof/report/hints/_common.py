"""What every hint rule shares: ``Hint``, the job the rules read, and text and
interval helpers.  A leaf of the hints package: the rule modules and the
package's face import it, it imports none of them.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from ..._render import display
from ...trace import Event, Trace
from ...trace.processes import Process

MIN_STEPS = 5  # steps a rule over step times needs (variance, memory growth)
MAX_LINES = 8  # evidence lines of one kind before "... and N more"
SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

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

    def to_dict(self) -> dict[str, Any]:
        """The hint as plain data (JSON's types): rule, severity, title,
        evidence and subjects as lists, suggestion.

        Example:
            >>> Hint("misuse", "low", "t", ("e",), "s").to_dict()["evidence"]
            ['e']
        """
        out = asdict(self)
        out["evidence"] = list(self.evidence)
        out["subjects"] = list(self.subjects)
        return out


@dataclass(frozen=True)
class Job:
    """What the rules read: the loaded inputs and their processes
    (``trace.processes.job``: one model of identity, steps and memory)."""

    traces: list[Trace]
    procs: list[Process]

    def where(self, p: Process) -> str:
        """The process's label as an evidence line's prefix, when several have
        ranges (a Kineto file has pseudo-processes holding only its metadata)."""
        return f"{p.label}: " if sum(1 for q in self.procs if q.threads) > 1 else ""


Rule = Callable[[Job], Optional[Hint]]


def hint(
    rule: str,
    severity: str,
    title: str,
    evidence: Iterable[str],
    suggestion: str,
    subjects: Iterable[str],
) -> Hint:
    """A Hint, its evidence a tuple and its subjects without repeats (in order)."""
    return Hint(rule, severity, title, tuple(evidence), suggestion, tuple(dict.fromkeys(subjects)))


def capped(lines: list[str], limit: int = MAX_LINES) -> list[str]:
    """At most limit lines, then one saying how many more there were."""
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"... and {len(lines) - limit} more"]


def pct(share: float) -> str:
    """A share as a percentage: one decimal below 10 %, none above."""
    return f"{share * 100:.1f} %" if share < 0.1 else f"{share * 100:.0f} %"


def plural(n: int, noun: str) -> str:
    """``1 range``, ``2 ranges`` (thousands grouped)."""
    return f"{n:,} {noun}{'s' * (n != 1)}"


def quoted(name: str) -> str:
    """A name in quotes, shown escaped (``_render.display``)."""
    return f"'{display(name)}'"


def words(text: str) -> set[str]:
    """A name's words: parts split at non-letters and camelCase humps,
    lower-cased, plus each two neighbours joined (``DataLoader.__next__``:
    data, loader, next, dataloader, loadernext)."""
    parts = [w.lower() for w in _WORD.findall(text)]
    return set(parts) | {a + b for a, b in zip(parts, parts[1:])}


def file_label(trace: Trace, i: int) -> str:
    """An input's name in evidence: its file's name, else ``trace N``."""
    return os.path.basename(trace.path) if trace.path else f"trace {i + 1}"


def tally(trace: Trace, key: str) -> int:
    """A core tally of the trace's ``otherData`` (0 when absent or not a count)."""
    other = trace.metadata.get("otherData")
    value = other.get(key) if isinstance(other, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def written_by_mxprof(trace: Trace) -> bool:
    """Whether mxprof wrote the trace (its ``otherData`` names mxprof's version)."""
    other = trace.metadata.get("otherData")
    return isinstance(other, dict) and "mxprof_version" in other


# ---- interval arithmetic on spans sorted by start ----


def union(spans: Iterable[Span]) -> list[Span]:
    """Spans sorted by start merged where they touch or overlap."""
    out: list[list[int]] = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def measure(spans: Iterable[Span] | Iterable[list[int]]) -> int:
    """The total length of disjoint spans."""
    return sum(b - a for a, b in spans)


def overlap(xs: list[Span], ys: list[Span]) -> int:
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


def clipped(ranges: Iterable[Event], lo: int, hi: int) -> Iterator[Span]:
    """The parts of ranges inside [lo, hi), in their order."""
    for e in ranges:
        if e.end > lo and e.ts < hi:
            yield max(e.ts, lo), min(e.end, hi)


def sampled_in_no_range(job: Job, p: Process, lo: int, hi: int) -> tuple[int, list[str]]:
    """What p's stack samples on its steps' thread in [lo, hi) that were in no
    range (or in the step alone) were doing: (samples, the three commonest
    innermost frames as ``function (file:line) N %``; a blocked thread's
    ``<waiting>`` shown with the frame that waits)."""
    s = p.steps
    if s is None:
        return 0, []
    step = (s.category, s.ranges[0].name)
    found: Counter[str] = Counter()
    for sample in job.traces[p.source].samples.samples:
        if (
            sample.pid != p.pid
            or sample.tid != s.tid
            or not lo <= sample.ts < hi
            or not sample.stack
            or (sample.range is not None and sample.range != step)
        ):
            continue
        found[frame_text(sample.stack)] += 1
    total = sum(found.values())
    return total, [f"{what} {pct(n / total)}" for what, n in found.most_common(3)]


def frame_text(stack: tuple[tuple[str, str, int], ...]) -> str:
    """A stack's innermost frame as ``function (file:line)``; a blocked
    thread's ``<waiting>`` with the frame that waits."""
    function, file, line = stack[-1]
    if function == "<waiting>" and len(stack) > 1:
        return f"<waiting> in {frame_text(stack[:-1])}"
    return f"{function} ({os.path.basename(file)}:{line})" if file else function
