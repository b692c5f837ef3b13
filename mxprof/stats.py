"""dumps(): statistics as MXNet's table or JSON, from the core's aggregates.

Layouts follow MXNet's ``AggregateStats`` (research/mxnet.md §2) so existing
parsers keep working, with these fixes: counters report their real values in
their own section (``Counter``: Count, Last, Min, Max, Avg = mean of the
samples), markers are counted (``Marker``), long names widen the name column,
rows sort by ``sort_by`` with ties by name ascending, and JSON numbers keep
nanosecond precision instead of 4 significant digits.  The core's tallies of
events it could not record as asked are a ``Profiler`` section.

Memory (``Memory`` section, MXNet's layout): one row per device in
``Device Storage`` (``Memory: gpu/0``) and one per scope in ``Scope
Storage``, from the samples of their bytes-in-use counters: Count, Min, Max
and Avg (mean of the samples) in kB (bytes / 1000), plus ``Peak``, the most
bytes in use at once since the statistics began, paused time included.

Ranges timed on a GPU (``mxprof.cuda``) add a ``GPU (ms)`` column to the row
of the task of the same domain and name: the GPU time of its ranges in all.

Additions for ranges: self (exclusive) time, its share of the wall time the
statistics cover (``%``), and the 50th/90th/99th percentiles of the
durations.  In the table they stand between ``Max`` and ``Avg``, so parsers
that read MXNet's columns from the left, or the average as the last column,
keep working; in JSON they follow ``Avg``.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import _native
from ._native import (
    COUNT_FIELDS,
    KIND_COUNTER,
    KIND_EVENT,
    KIND_FRAME,
    KIND_GPU,
    KIND_MARKER,
    KIND_TASK,
    Stat,
    lib,
)
from ._session import SESSION, run_sync_hooks
from .config import check_bool
from .errors import ConfigError

FORMATS = ("table", "json")
SORT_KEYS = ("total", "avg", "min", "max", "count", "self", "p50", "p90", "p99")

NAME_WIDTH = 25  # MXNet's minimum; longer names widen the column
COL_WIDTH = 16


@dataclass
class Row:
    name: str
    count: int
    values: dict[str, Any]  # already in display units (None: no value, shown as '-')


def _category(kind: int, domain: str) -> str:
    if kind == KIND_EVENT:
        return "event"
    if kind == KIND_FRAME:
        return f"{domain},frame"
    return domain


def _ms(ns: float) -> float:
    return round(ns / 1e6, 6)  # ms, to the nanosecond


def _time_row(s: Stat, name: str, wall_ns: int) -> Row:
    return Row(
        name,
        s.count,
        {
            "Total": _ms(s.total),
            "Min": _ms(s.min),
            "Max": _ms(s.max),
            "Avg": _ms(s.total / s.count),
            "Self": _ms(s.self),
            "%": round(100.0 * s.self / wall_ns, 4) if wall_ns > 0 else 0.0,
            "P50": _ms(s.p50),
            "P90": _ms(s.p90),
            "P99": _ms(s.p99),
        },
    )


def _counter_row(s: Stat, name: str) -> Row:
    return Row(name, s.count, {"Last": s.last, "Min": s.min, "Max": s.max, "Avg": s.sum / s.count})


MEMORY_DOMAINS = ("Device Storage", "Scope Storage")


def _kb(nbytes: float) -> float:
    return round(nbytes / 1000.0, 6)


def _memory_row(s: Stat, name: str, peak: int | None) -> Row:
    return Row(
        name,
        s.count,
        {
            "Min": _kb(s.min),
            "Max": _kb(s.max),
            "Peak": _kb(s.max if peak is None else max(peak, s.max)),
            "Avg": _kb(s.sum / s.count),
            "Last": _kb(s.last),
        },
    )


def _peaks() -> dict[int, int]:
    """Peak bytes in use per memory counter id (they restart with the statistics)."""
    from .memory import usage

    return {u.counter: u.peak for u in usage()}


# sort_by -> the value it sorts on, per section; what a section lacks sorts
# by its "total" (a counter's last value).
_SORT_FIELDS = {
    "Time": {"total": "Total", "avg": "Avg", "min": "Min", "max": "Max", "self": "Self"},
    "Memory": {"total": "Peak", "avg": "Avg", "min": "Min", "max": "Max"},
    "Counter": {"total": "Last", "avg": "Avg", "min": "Min", "max": "Max"},
}


def _sort_value(section: str, row: Row, sort_by: str) -> float:
    if sort_by == "count" or section not in _SORT_FIELDS:
        return row.count
    fields = _SORT_FIELDS[section]
    key = fields.get(sort_by)
    if key is None:  # a percentile: ranges have it, the others sort by their "total"
        key = sort_by.upper() if section == "Time" else fields["total"]
    return float(row.values[key])


Sections = dict[str, dict[str, list[Row]]]


def collect(stats: Iterable[Stat], wall_ns: int, peaks: dict[int, int]) -> Sections:
    """Group the core's statistics into sections and categories.

    wall_ns is the recorded wall time the statistics cover (for ``%``);
    peaks the peak bytes per memory counter.
    """
    sections: Sections = {"Time": {}, "Memory": {}, "Counter": {}, "Marker": {}}
    gpu: dict[tuple[str, str], Stat] = {}
    for s in stats:
        info = _native.object_info(s.id)
        if s.kind in (KIND_TASK, KIND_FRAME, KIND_EVENT):
            row, section = _time_row(s, info.name, wall_ns), "Time"
        elif s.kind == KIND_GPU:
            gpu[(info.domain, info.name)] = s
            continue
        elif s.kind == KIND_COUNTER and info.domain in MEMORY_DOMAINS:
            row, section = _memory_row(s, info.name, peaks.get(s.id)), "Memory"
        elif s.kind == KIND_COUNTER:
            row, section = _counter_row(s, info.name), "Counter"
        elif s.kind == KIND_MARKER:
            row, section = Row(info.name, s.count, {}), "Marker"
        else:
            continue
        sections[section].setdefault(_category(s.kind, info.domain), []).append(row)
    if gpu:
        _add_gpu(sections["Time"], gpu, wall_ns)
    return sections


def _add_gpu(time: dict[str, list[Row]], gpu: dict[tuple[str, str], Stat], wall_ns: int) -> None:
    """Put GPU time beside the CPU rows of the same domain and name; a GPU
    range without one gets a row of its own in ``<domain>,gpu``."""
    for cat, rows in time.items():
        for row in rows:
            s = gpu.pop((cat, row.name), None)
            row.values["GPU"] = _ms(s.total) if s is not None else None
    for (domain, name), s in sorted(gpu.items()):
        row = _time_row(s, name, wall_ns)
        row.values["GPU"] = _ms(s.total)
        time.setdefault(f"{domain},gpu", []).append(row)


def _sorted(section: str, rows: list[Row], sort_by: str, ascending: bool) -> list[Row]:
    sign = 1 if ascending else -1
    return sorted(rows, key=lambda r: (sign * _sort_value(section, r, sort_by), r.name))


# ---- table ----


def _display(name: str) -> str:
    """The name as one table cell: control characters shown escaped."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in name)


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - _width(text))


_TABLE_COLUMNS = {
    "Time": (
        ("Time (ms)", "Total", "{:.4f}"),
        ("Min Time (ms)", "Min", "{:.4f}"),
        ("Max Time (ms)", "Max", "{:.4f}"),
        ("Self (ms)", "Self", "{:.4f}"),
        ("%", "%", "{:.2f}"),
        ("P50 (ms)", "P50", "{:.4f}"),
        ("P90 (ms)", "P90", "{:.4f}"),
        ("P99 (ms)", "P99", "{:.4f}"),
        ("Avg Time (ms)", "Avg", "{:.4f}"),
    ),
    "Memory": (
        ("Min Use  (kB)", "Min", "{:.4f}"),
        ("Max Use  (kB)", "Max", "{:.4f}"),
        ("Peak Use  (kB)", "Peak", "{:.4f}"),
        ("Avg Use  (kB)", "Avg", "{:.4f}"),
    ),
    "Counter": (
        ("Last", "Last", "{:d}"),
        ("Min", "Min", "{:d}"),
        ("Max", "Max", "{:d}"),
        ("Avg", "Avg", "{:.4f}"),
    ),
    "Marker": (),
}
_TABLE_SUFFIX = {"Time": "", "Memory": "", "Counter": ",counter", "Marker": ",marker"}
_GPU_COLUMN = ("GPU (ms)", "GPU", "{:.4f}")


_PERCENTILE_COLUMNS = ("P50", "P90", "P99")


def _table_block(section: str, category: str, rows: list[Row], percentiles: bool) -> list[str]:
    cols = [c for c in _TABLE_COLUMNS[section] if percentiles or c[1] not in _PERCENTILE_COLUMNS]
    if any(r.values.get("GPU") is not None for r in rows):
        cols.insert(len(cols) - 1, _GPU_COLUMN)  # Avg stays the last column
    names = [_display(r.name) for r in rows]
    width = max([NAME_WIDTH] + [_width(n) + 2 for n in names])

    def line(first: str, cells: list[str]) -> str:
        return (
            _pad(first, width)
            + f"{cells[0]:>{COL_WIDTH}}"
            + "".join(f" {c:>{COL_WIDTH}}" for c in cells[1:])
        )

    heads = ["Total Count"] + [c[0] for c in cols]
    out = [_display(category) + _TABLE_SUFFIX[section], "=" * 17]
    out.append(line("Name", heads))
    out.append(line("----", ["-" * len(h) for h in heads]))
    for row, name in zip(rows, names):
        cells = [str(row.count)] + [
            "-" if row.values[key] is None else fmt.format(row.values[key]) for _, key, fmt in cols
        ]
        out.append(line(name, cells))
    out.append("")
    return out


def render_table(sections: Sections, tallies: dict[str, int], percentiles: bool = False) -> str:
    lines = ["", "Profile Statistics:", "\tNote the difference in units for different entries."]
    for section in ("Time", "Memory", "Counter", "Marker"):
        for category in sorted(sections[section]):
            lines += _table_block(section, category, sections[section][category], percentiles)
    problems = {k: v for k, v in tallies.items() if v}
    if problems:
        width = max([NAME_WIDTH] + [len(k) + 2 for k in problems])
        lines += ["Profiler", "=" * 17, _pad("Name", width) + f"{'Total Count':>{COL_WIDTH}}"]
        lines.append(_pad("----", width) + f"{'-' * 11:>{COL_WIDTH}}")
        lines += [_pad(k, width) + f"{v:>{COL_WIDTH}}" for k, v in problems.items()]
        lines.append("")
    return "\n".join(lines) + "\n"


# ---- JSON ----


def _num(value: Any) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


def _json_entries(indent: str, entries: list[tuple[str, list[str]]]) -> list[str]:
    """MXNet's layout: one key per line, siblings separated by a lone comma line."""
    out: list[str] = []
    for i, (key, body) in enumerate(entries):
        if i:
            out.append(indent + ",")
        out.append(f"{indent}{json.dumps(key, ensure_ascii=False)}: {{")
        out += body
        out.append(indent + "}")
    return out


def _json_row(section: str, row: Row) -> list[str]:
    pad = " " * 16
    fields: list[tuple[str, Any]] = [("Count", row.count)]
    if section == "Time":
        keys = ("Total", "Min", "Max", "Avg", "Self", "%", "P50", "P90", "P99")
        fields += [(k, row.values[k]) for k in keys]
        if row.values.get("GPU") is not None:
            fields.append(("GPU", row.values["GPU"]))
    elif section == "Memory":
        fields += [(k, row.values[k]) for k in ("Min", "Max", "Avg", "Peak")]
    elif section == "Counter":
        fields += [(k, row.values[k]) for k in ("Last", "Min", "Max", "Avg")]
    return [
        f'{pad}"{key}": {_num(value)}' + ("," if i < len(fields) - 1 else "")
        for i, (key, value) in enumerate(fields)
    ]


def render_json(sections: Sections, tallies: dict[str, int]) -> str:
    lines = ["{"]
    blocks: list[tuple[str, list[str]]] = []
    for section in ("Time", "Memory", "Counter", "Marker"):
        cats = sections[section]
        body = _json_entries(
            " " * 8,
            [
                (cat, _json_entries(" " * 12, [(r.name, _json_row(section, r)) for r in cats[cat]]))
                for cat in sorted(cats)
            ],
        )
        blocks.append((section, body))
    blocks.append(
        (
            "Profiler",
            [
                f'        "{k}": {v}' + ("," if i < len(tallies) - 1 else "")
                for i, (k, v) in enumerate(tallies.items())
            ],
        )
    )
    lines += _json_entries(" " * 4, blocks)
    lines += [",", '    "Unit": {', '        "Time": "ms",', '        "Memory": "kB"', "    }", "}"]
    return "\n".join(lines) + "\n"


def dumps(
    reset: bool = False,
    format: str = "table",
    sort_by: str = "total",
    ascending: bool = False,
    percentiles: bool = False,
) -> str:
    """Statistics of everything recorded since the last reset.

    Returns '' unless ``set_config(aggregate_stats=True)``.  Statistics come
    from the core's per-thread aggregates, not from re-reading events.  For
    ranges they include self time (``Self``: total minus the time of ranges
    nested inside), ``%`` (self time as a percentage of the wall time spent
    recording since the statistics began; threads add up, so the column can
    sum past 100), and the percentiles ``P50``/``P90``/``P99`` (within 1 %).

    Args:
        reset: clear the statistics after rendering them.
        format: 'table' (MXNet's text table) or 'json'.
        sort_by: 'total', 'avg', 'min', 'max', 'count', 'self', 'p50', 'p90'
            or 'p99' (rows within each category; counters sort 'total' and
            the keys they lack by their last value, memory rows by their
            peak).
        ascending: sort ascending instead of descending.
        percentiles: add the percentile columns to the table (JSON always
            has them).

    Raises:
        ConfigError: a bad format, sort_by, reset, ascending or percentiles
            (checked even when statistics are off).

    Example:
        >>> import json, mxprof
        >>> mxprof.set_config(aggregate_stats=True)
        >>> stats = json.loads(mxprof.dumps(format="json"))
        >>> sorted(stats)[:2]
        ['Counter', 'Marker']
    """
    reset = check_bool("reset", reset)
    ascending = check_bool("ascending", ascending)
    percentiles = check_bool("percentiles", percentiles)
    if format not in FORMATS:
        raise ConfigError(f"format must be 'table' or 'json', got {format!r}")
    if sort_by not in SORT_KEYS:
        raise ConfigError(f"sort_by must be one of {', '.join(SORT_KEYS)}; got {sort_by!r}")
    with SESSION.lock:
        if not SESSION.config["aggregate_stats"]:
            return ""
        run_sync_hooks(False)
        wall_ns = lib.mxp_stats_recorded_ns()  # before a reset restarts it
        peaks = _peaks()  # likewise
        sections = collect(_native.stats_snapshot(reset), wall_ns, peaks)
        for section, cats in sections.items():
            for cat, rows in cats.items():
                cats[cat] = _sorted(section, rows, sort_by, ascending)
        now = _native.counts()
        tallies = {k: now[k] - SESSION.baseline[k] for k in COUNT_FIELDS}
        if format == "table":
            text = render_table(sections, tallies, percentiles)
        else:
            text = render_json(sections, tallies)
        if reset:
            SESSION.baseline = now
        return text


def reset() -> None:
    """Start new statistics, as ``dumps(reset=True)`` does, without rendering."""
    with SESSION.lock:
        now = _native.counts()
        lib.mxp_stats_reset()
        SESSION.baseline = now
