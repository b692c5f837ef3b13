"""Text rendering shared by ``dumps()``, ``KeyAverages`` tables and trace analysis.

Cells of a terminal table (names shown escaped, padded by display width),
durations with a readable unit, the category a range is listed under, which
ranges are the profiler's own (``is_own``), and the keys statistics sort by.
Pure Python: the offline tier (``mxprof.trace``, ``mxprof.averages``)
renders with it without loading the compiled core.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from .errors import ConfigError

# sort_by of dumps() and of statistics rows; a descending sort by the value,
# ties by name ascending.
SORT_KEYS = ("total", "avg", "min", "max", "count", "self", "p50", "p90", "p99")

# torch.profiler's names for the same columns: KeyAverages takes them too, so
# that code ported from torch.profiler keeps working.
TORCH_SORT_KEYS = {"cpu_time_total": "total", "self_cpu_time_total": "self", "cpu_time": "avg"}

# Every sort_by a statistics row takes, mapped to the row attribute it sorts on.
ROW_SORT_KEYS = {**{key: key for key in SORT_KEYS}, **TORCH_SORT_KEYS}

# Column widths of dumps()'s table: MXNet's minimum name width (longer names
# widen the column) and its value width.
NAME_WIDTH = 25
COL_WIDTH = 16

# The domain of the profiler's own ranges: the writer's ``flush`` task, and the
# ``run <script>`` range older versions of ``mxprof run`` opened around a script.
OWN_DOMAIN = "mxprof"
# The name the core gives ranges past its registry's capacity, in OWN_DOMAIN:
# they are the user's work, lumped together, so they are shown.
OVERFLOW = "<overflow>"


def sort_key(sort_by: object) -> str:
    """The row attribute sort_by names (torch.profiler's names included).

    Raises:
        ConfigError: sort_by is not one of ``ROW_SORT_KEYS``; the message lists them.

    Example:
        >>> sort_key("self_cpu_time_total")
        'self'
    """
    key = ROW_SORT_KEYS.get(sort_by) if isinstance(sort_by, str) else None
    if key is None:
        raise ConfigError(f"sort_by must be one of {', '.join(ROW_SORT_KEYS)}; got {sort_by!r}")
    return key


def category(domain: str, *, frame: bool = False, event: bool = False) -> str:
    """The category a range is listed under, as the trace's ``cat`` names it:
    ``event`` for an Event, ``<domain>,frame`` for a Frame, its domain for a Task.

    Example:
        >>> category("train"), category("train", frame=True), category("", event=True)
        ('train', 'train,frame', 'event')
    """
    if event:
        return "event"
    if frame:
        return f"{domain},frame"
    return domain


def is_own(category: str, name: str) -> bool:
    """Whether a range (its category and name) is the profiler's own work.

    The one rule for what users are not shown: tables, diffs, the report and
    sample summaries leave these ranges out, and samples taken inside one count
    as samples in no range.  Trace files keep them, and ``dumps()``'s table of
    ranges (MXNet's layout) shows them.

    Example:
        >>> is_own("mxprof", "flush"), is_own("train", "flush"), is_own("mxprof", "<overflow>")
        (True, False, False)
    """
    return category == OWN_DOMAIN and name != OVERFLOW


def display(name: str) -> str:
    """The name as one table cell: control characters shown escaped.

    Example:
        >>> display("line\\nbreak")
        'line\\\\nbreak'
    """
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in name)


def visible(text: str) -> str:
    """The text with every character that would not show as itself escaped
    (controls, bidirectional overrides, zero-width and other format
    characters: ``\\u202e``), line breaks and tabs kept: a name from a trace
    someone else wrote cannot reverse or hide what the page shows.

    Example:
        >>> visible("abc\\u202edef"), visible("two\\nlines")
        ('abc\\\\u202edef', 'two\\nlines')
    """
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c in "\n\t" else c.encode("unicode_escape").decode() for c in text
    )


def plot_text(text: str) -> str:
    """Text for plotly's labels, legends and titles, shown as text.

    plotly draws a pseudo-HTML subset (``<a href>``, ``<span style>``,
    ``<b>``, ``<br>``) in every label; with ``&``, ``<`` and ``>`` as
    entities (which it draws as the characters) a name is only text, and
    invisible characters are shown escaped (``visible``).

    Example:
        >>> plot_text('<a href="x">y</a>')
        '&lt;a href="x"&gt;y&lt;/a&gt;'
    """
    shown = visible(text)
    return shown.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def width(text: str) -> int:
    """Columns text takes on a terminal: East Asian wide characters take two.

    Example:
        >>> width("step"), width("数据")
        (4, 4)
    """
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text: str, columns: int) -> str:
    """text left-aligned in a cell of columns terminal columns (by ``width``).

    Example:
        >>> pad("数据", 6) + "|"
        '数据  |'
    """
    return text + " " * max(0, columns - width(text))


def grouped_table(
    first: str,
    labels: Sequence[str],
    heads: Sequence[tuple[str, str]],
    cells: Sequence[Sequence[str]],
) -> list[str]:
    """A text table whose value columns sit under group titles: a rule, the
    titles, the heads, a rule, one line per row, a rule.  Labels are padded by
    display width; a group's last column widens when its title is wider than
    its columns.

    Args:
        first: the head of the label column.
        labels: each row's label (already ``display``-ed).
        heads: per value column, (group title, head); equal titles next to
            each other form one group ("" for none).
        cells: per row, its value cells, right-aligned.

    Example:
        >>> heads = [("Avg", "base"), ("Avg", "new")]
        >>> for line in grouped_table("Name", ["a"], heads, [["1", "2"]]):
        ...     print(line)
        -----------------
                      Avg
        Name    base  new
        -----------------
        a          1    2
        -----------------
    """
    nwidth = max([len(first)] + [width(n) for n in labels]) + 2
    widths = [
        max([len(head)] + [len(row[i]) for row in cells]) + 2 for i, (_, head) in enumerate(heads)
    ]
    groups: list[tuple[str, list[int]]] = []
    for i, (group, _) in enumerate(heads):
        if groups and groups[-1][0] == group:
            groups[-1][1].append(i)
        else:
            groups.append((group, [i]))
    for group, columns in groups:
        short = len(group) + 2 - sum(widths[i] for i in columns)
        if short > 0:
            widths[columns[-1]] += short
    rule = "-" * (nwidth + sum(widths))
    titles = " " * nwidth + "".join(
        f"{group:>{sum(widths[i] for i in columns)}}" for group, columns in groups
    )
    lines = [
        rule,
        titles.rstrip(),
        f"{first:<{nwidth}}" + "".join(f"{h:>{w}}" for (_, h), w in zip(heads, widths)),
        rule,
    ]
    for label, row in zip(labels, cells):
        lines.append(pad(label, nwidth) + "".join(f"{c:>{w}}" for c, w in zip(row, widths)))
    lines.append(rule)
    return lines


def format_ns(ns: float | None) -> str:
    """A duration with a readable unit; None (unknown) is '-'.

    Example:
        >>> [format_ns(v) for v in (812, 12_345, 1_234_000, 2.5e9, None)]
        ['812ns', '12.345us', '1.234ms', '2.500s', '-']
    """
    if ns is None:
        return "-"
    if ns < 1_000:
        return f"{ns:.0f}ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.3f}us"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.3f}ms"
    return f"{ns / 1e9:.3f}s"


def format_bytes(n: float | None) -> str:
    """A size in binary units (B, KiB, MiB, GiB, TiB: powers of 1024); None is '-'.

    The one unit convention of the report and its hints, so that one page
    never shows a peak in MB in one place and MiB in another.  (``dumps()``
    keeps MXNet's kB = 1000 B in its memory table.)

    Example:
        >>> [format_bytes(v) for v in (512, 1536, 3 * 2**20, -2**31, None)]
        ['512 B', '1.50 KiB', '3.00 MiB', '-2.00 GiB', '-']
    """
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} TiB"
