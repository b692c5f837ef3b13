"""dumps(): statistics as MXNet's table or JSON, from the core's aggregates.

Layouts follow MXNet's ``AggregateStats`` (research/mxnet.md §2) so existing
parsers keep working: table blocks in MXNet's order (by title, byte-wise, as
its ``std::map`` sorts them), and in every block and JSON entry MXNet's
columns first, in MXNet's order.  Fixes over MXNet: counters report their
real values in their own blocks (``<domain>,counter``; JSON section
``Counter``: Count, Last, Min, Max, Avg = mean of the samples), markers are
counted (``<domain>,marker``; ``Marker``), long names widen the name column,
rows sort by ``sort_by`` with ties by name ascending, and JSON numbers keep
nanosecond precision instead of 4 significant digits.  The core's tallies of
events it could not record as asked are a ``Profiler`` block, last.

Memory (``Memory`` section, MXNet's layout): one row per device in
``Device Storage`` (``Memory: gpu/0``) and one per scope in ``Scope
Storage``, from the samples of their bytes-in-use counters: Count, Min, Max
and Avg (mean of the samples) in kB (bytes / 1000), then ``Peak``, the most
bytes in use at once since the statistics began, paused time included.

Additions for ranges, after MXNet's columns (after ``Avg`` in the table and
in JSON): self (exclusive) time, its share of the wall time the statistics
cover (``%``), the 50th/90th/99th percentiles of the durations, and for
ranges timed on a GPU (``mxprof.cuda``) ``GPU (ms)``: the GPU time of the
ranges of the same domain and name, in all.  Parsers that read MXNet's
columns by position from the left keep working; the average is no longer
the last column when there are additions.

Rendering costs a few microseconds per row: each name is asked of the core
once per process, rows are plain tuples, and each table row or JSON entry
is one ``str.format`` call.
"""

from __future__ import annotations

import functools
import json
import json.encoder
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any

from . import _native, _render, _sampler
from ._native import (
    KIND_COUNTER,
    KIND_EVENT,
    KIND_FRAME,
    KIND_GPU,
    KIND_MARKER,
    KIND_TASK,
    Stat,
)
from ._render import COL_WIDTH, NAME_WIDTH, SORT_KEYS
from ._session import SESSION, warn
from .config import check_bool
from .errors import ConfigError
from .memory import usage
from .trace import samples as _samples
from .trace.leak import PROCESS_MEMORY

FORMATS = ("table", "json")


# A row: (name, count, values), values in display units, in the order of its
# section's FIELDS (a Time row has a GPU value only when some range has one;
# None: no value, shown as '-').
Row = tuple[str, int, tuple[Any, ...]]

SECTIONS = ("Time", "Memory", "Counter", "Marker")
FIELDS = {
    "Time": ("Total", "Min", "Max", "Avg", "Self", "%", "P50", "P90", "P99", "GPU"),
    "Memory": ("Min", "Max", "Avg", "Peak"),
    "Counter": ("Last", "Min", "Max", "Avg"),
    "Marker": (),
}
MEMORY_DOMAINS = ("Device Storage", "Scope Storage", PROCESS_MEMORY)  # the last: memory_steps


# Integer nanoseconds and bytes are divided, not rounded: n / 1e6 is already
# the double nearest to n / 10**6, which round(..., 6) would give back.
# Quotients of two numbers (averages, shares) are rounded.


def _time_values(s: Stat, wall_ns: int) -> tuple[Any, ...]:
    return (
        s.total / 1e6,
        s.min / 1e6,
        s.max / 1e6,
        round(s.total / s.count / 1e6, 6),
        s.self / 1e6,
        round(100.0 * s.self / wall_ns, 4) if wall_ns > 0 else 0.0,
        s.p50 / 1e6,
        s.p90 / 1e6,
        s.p99 / 1e6,
    )


def _memory_values(s: Stat, peak: int | None) -> tuple[Any, ...]:
    top = s.max if peak is None else max(peak, s.max)
    return (s.min / 1000.0, s.max / 1000.0, round(s.sum / s.count / 1000.0, 6), top / 1000.0)


def _peaks() -> dict[int, int]:
    """Peak bytes in use per memory counter id (they restart with the statistics)."""
    return {u.counter: u.peak for u in usage()}


Sections = dict[str, dict[str, list[Row]]]


# The domain and name of every id rendered so far (ids and names never
# change).  Plain dicts of strings: unlike a cache of tuples, nothing here is
# a container the garbage collector has to scan again and again.
_domains: dict[int, str] = {}
_names: dict[int, str] = {}


def _learn_names(ids: Iterable[int]) -> None:
    """Ask the core for the domain and name of ids, reusing one set of
    out-parameters for all of them (object_info allocates five per call,
    which made the first dumps() over many names cost seconds)."""
    decoded: dict[bytes, str] = {}  # the few domains, decoded once
    for oid, raw, name in _native.object_names(ids):
        domain = decoded.get(raw)
        if domain is None:
            domain = decoded[raw] = raw.decode("utf-8", "replace")
        _domains[oid] = domain
        _names[oid] = name.decode("utf-8", "replace")


def sample_summary(reset: bool = False, top: int = _samples.TOP) -> dict[str, Any] | None:
    """The ``Samples`` section: top functions of the program and of each range
    (``mxprof.trace.samples.summary``, which a loaded trace's samples give
    too); None when sampling never ran in this process."""
    counts, tables = _sampler.snapshot(reset)
    rate = SESSION.config.sample_rate
    if not counts and not rate:
        return None
    ranges = {rid for rid, _ in counts if rid != _native.NO_RANGE}
    _learn_names([rid for rid in ranges if rid not in _names])
    keys: dict[int, tuple[str, str]] = {}
    for rid in ranges:
        kind = _native.object_info(rid).kind
        cat = _render.category(_domains[rid], frame=kind == KIND_FRAME, event=kind == KIND_EVENT)
        keys[rid] = (cat, _names[rid])
    stacks: dict[int, tuple[tuple[str, str, int], ...]] = {}
    frames, nodes = tables.frames, tables.nodes

    def stack_of(sid: int) -> tuple[tuple[str, str, int], ...]:
        got = stacks.get(sid)
        if got is None:
            chain = []
            node = sid
            while node:
                parent, fid = nodes[node]
                chain.append(frames[fid])
                node = parent
            got = stacks[sid] = tuple(reversed(chain))
        return got

    merged: dict[tuple[tuple[str, str] | None, tuple[tuple[str, str, int], ...]], int] = {}
    for (rid, sid), n in counts.items():
        key = (keys.get(rid), stack_of(sid))
        merged[key] = merged.get(key, 0) + n
    out = _samples.summary(merged, top)
    out["Rate"] = rate
    out["Mode"] = SESSION.config.sample_mode
    return out


# The Samples block of the table: the offline tier's renderer, which ``mxprof
# stats`` uses too (``mxprof run`` imports it from here).
render_samples_table = _samples.render_table


def collect(stats: list[Stat], wall_ns: int, peaks: dict[int, int]) -> Sections:
    """Group the core's statistics into sections and categories.

    wall_ns is the recorded wall time the statistics cover (for ``%``);
    peaks the peak bytes per memory counter.
    """
    sections: Sections = {section: {} for section in SECTIONS}
    time, memory, counter, marker = (sections[s] for s in SECTIONS)
    gpu: dict[tuple[str, str], Stat] = {}
    names, domains = _names, _domains
    _learn_names([s.id for s in stats if s.id not in names])
    for s in stats:
        kind, domain, name = s.kind, domains[s.id], names[s.id]
        if kind in (KIND_TASK, KIND_FRAME, KIND_EVENT):
            cats, row = time, (name, s.count, _time_values(s, wall_ns))
            domain = _render.category(domain, frame=kind == KIND_FRAME, event=kind == KIND_EVENT)
        elif kind == KIND_GPU:
            gpu[(domain, name)] = s
            continue
        elif kind == KIND_COUNTER and domain in MEMORY_DOMAINS:
            cats, row = memory, (name, s.count, _memory_values(s, peaks.get(s.id)))
        elif kind == KIND_COUNTER:
            avg = round(s.sum / s.count, 6)
            cats, row = counter, (name, s.count, (s.last, s.min, s.max, avg))
        elif kind == KIND_MARKER:
            cats, row = marker, (name, s.count, ())
        else:
            continue
        rows = cats.get(domain)
        if rows is None:
            rows = cats[domain] = []
        rows.append(row)
    if gpu:
        _add_gpu(time, gpu, wall_ns)
    return sections


def _add_gpu(time: dict[str, list[Row]], gpu: dict[tuple[str, str], Stat], wall_ns: int) -> None:
    """Put GPU time beside the CPU rows of the same domain and name; a GPU
    range without one gets a row of its own in ``<domain>,gpu``."""
    for cat, rows in time.items():
        for i, (name, count, values) in enumerate(rows):
            s = gpu.pop((cat, name), None)
            rows[i] = (name, count, (*values, None if s is None else s.total / 1e6))
    for (domain, name), s in sorted(gpu.items()):
        row = (name, s.count, (*_time_values(s, wall_ns), s.total / 1e6))
        time.setdefault(f"{domain},gpu", []).append(row)


# sort_by -> the field it sorts on, per section; what a section lacks sorts
# by its "total" (a counter's last value, a memory row's peak); markers and
# sort_by='count' sort by the count.
_SORT_FIELDS = {
    "Time": {"total": "Total", "avg": "Avg", "min": "Min", "max": "Max", "self": "Self",
             "p50": "P50", "p90": "P90", "p99": "P99"},
    "Memory": {"total": "Peak", "avg": "Avg", "min": "Min", "max": "Max"},
    "Counter": {"total": "Last", "avg": "Avg", "min": "Min", "max": "Max"},
}  # fmt: skip


def _sorted(section: str, rows: list[Row], sort_by: str, ascending: bool) -> list[Row]:
    """rows by sort_by (descending unless ascending), ties by name ascending."""
    fields = _SORT_FIELDS.get(section)
    key: Callable[[Row], Any]
    if sort_by == "count" or fields is None:
        key = itemgetter(1)
    else:
        index = FIELDS[section].index(fields.get(sort_by, fields["total"]))
        key = lambda row: row[2][index]  # noqa: E731
    # Two stable sorts: by name, then by value (reverse keeps equal values in
    # name order).
    out = sorted(rows, key=itemgetter(0))
    out.sort(key=key, reverse=not ascending)
    return out


# ---- table ----


# Per section: (header, field, format spec) of the columns after Total Count;
# MXNet's first.
_TABLE_COLUMNS = {
    "Time": (
        ("Time (ms)", "Total", ".4f"),
        ("Min Time (ms)", "Min", ".4f"),
        ("Max Time (ms)", "Max", ".4f"),
        ("Avg Time (ms)", "Avg", ".4f"),
        ("Self (ms)", "Self", ".4f"),
        ("%", "%", ".2f"),
        ("P50 (ms)", "P50", ".4f"),
        ("P90 (ms)", "P90", ".4f"),
        ("P99 (ms)", "P99", ".4f"),
        ("GPU (ms)", "GPU", ".4f"),
    ),
    "Memory": (
        ("Min Use  (kB)", "Min", ".4f"),
        ("Max Use  (kB)", "Max", ".4f"),
        ("Avg Use  (kB)", "Avg", ".4f"),
        ("Peak Use  (kB)", "Peak", ".4f"),
    ),
    "Counter": (
        ("Last", "Last", "d"),
        ("Min", "Min", "d"),
        ("Max", "Max", "d"),
        ("Avg", "Avg", ".4f"),
    ),
    "Marker": (),
}
_TABLE_SUFFIX = {"Time": "", "Memory": "", "Counter": ",counter", "Marker": ",marker"}
_PERCENTILE_FIELDS = ("P50", "P90", "P99")


def _table_block(section: str, category: str, rows: list[Row], percentiles: bool) -> list[str]:
    fields = FIELDS[section]
    # GPU column: when _add_gpu gave the rows a GPU slot and one has a value.
    gpu = len(rows[0][2]) == len(FIELDS["Time"]) and any(r[2][-1] is not None for r in rows)
    cols = [
        (head, fields.index(field), spec)
        for head, field, spec in _TABLE_COLUMNS[section]
        if (percentiles or field not in _PERCENTILE_FIELDS) and (gpu or field != "GPU")
    ]
    names = [_render.display(r[0]) for r in rows]
    width = max([NAME_WIDTH] + [_render.width(n) + 2 for n in names])

    def line(first: str, cells: list[str]) -> str:
        return _render.pad(first, width) + "".join(f" {c:>{COL_WIDTH}}" for c in cells)[1:]

    heads = ["Total Count"] + [head for head, _, _ in cols]
    out = [_render.display(category) + _TABLE_SUFFIX[section], "=" * 17]
    out.append(line("Name", heads))
    out.append(line("----", ["-" * len(h) for h in heads]))
    # One format call per row.  The name cell pads by display width, which
    # only names with non-ASCII characters need computed; a missing GPU time
    # is '-'.
    cells = f"{{:>{COL_WIDTH}}}" + "".join(f" {{:>{COL_WIDTH}{spec}}}" for _, _, spec in cols)
    ascii_row = f"{{:<{width}}}" + cells
    picks = [i for _, i, _ in cols]
    take = (lambda v: v[: len(picks)]) if picks == list(range(len(picks))) else itemgetter(*picks)
    for (_, count, values), name in zip(rows, names):
        vals = take(values)
        if gpu and None in vals:
            text = ["-" if v is None else format(v, spec) for v, (_, _, spec) in zip(vals, cols)]
            out.append(line(name, [str(count), *text]))
        elif name.isascii():
            out.append(ascii_row.format(name, count, *vals))
        else:
            out.append(_render.pad(name, width) + cells.format(count, *vals))
    out.append("")
    return out


def render_table(
    sections: Sections,
    tallies: dict[str, int],
    percentiles: bool = False,
    samples: dict[str, Any] | None = None,
) -> str:
    lines = ["", "Profile Statistics:", "\tNote the difference in units for different entries."]
    # One list of blocks in MXNet's order: by title (byte-wise, which for
    # UTF-8 is code point order); equal titles keep the order of SECTIONS.
    blocks = sorted(
        (category + _TABLE_SUFFIX[section], n, section, category)
        for n, section in enumerate(SECTIONS)
        for category in sections[section]
    )
    for _, _, section, category in blocks:
        lines += _table_block(section, category, sections[section][category], percentiles)
    if samples is not None:
        lines += render_samples_table(samples)
    problems = {k: v for k, v in tallies.items() if v}
    if problems:
        width = max([NAME_WIDTH] + [len(k) + 2 for k in problems])
        lines += [
            "Profiler",
            "=" * 17,
            _render.pad("Name", width) + f"{'Total Count':>{COL_WIDTH}}",
        ]
        lines.append(_render.pad("----", width) + f"{'-' * 11:>{COL_WIDTH}}")
        lines += [_render.pad(k, width) + f"{v:>{COL_WIDTH}}" for k, v in problems.items()]
        lines.append("")
    return "\n".join(lines) + "\n"


# ---- JSON ----

# A str as a JSON string literal, non-ASCII kept (json.dumps(s, ensure_ascii=False)).
_quote = json.encoder.encode_basestring


def _json_entries(indent: str, entries: list[tuple[str, list[str]]]) -> list[str]:
    """MXNet's layout: one key per line, siblings separated by a lone comma line."""
    out: list[str] = []
    for i, (key, body) in enumerate(entries):
        if i:
            out.append(indent + ",")
        out.append(f"{indent}{_quote(key)}: {{")
        out += body
        out.append(indent + "}")
    return out


@functools.cache
def _json_template(fields: tuple[str, ...]) -> str:
    """The format string of one JSON entry: its name (already quoted), then
    one key per line.  repr() writes each number: ints as they are, floats
    as the shortest text that reads back the same."""
    indent, pad = " " * 12, " " * 16
    keys = ",\n".join(f'{pad}"{f}": {{!r}}' for f in fields)
    return f"{indent}{{}}: {{{{\n{keys}\n{indent}}}}}"


def _json_rows(section: str, rows: list[Row]) -> list[str]:
    """A category's entries, separated by lone comma lines, one format call each."""
    fields = ("Count",) + FIELDS[section]
    full = _json_template(fields)
    # A Time row without GPU time has no GPU key.
    no_gpu = _json_template(fields[:-1]) if section == "Time" else full
    out: list[str] = []
    for name, count, values in rows:
        if out:
            out.append(" " * 12 + ",")
        if no_gpu is not full and (len(values) < len(FIELDS["Time"]) or values[-1] is None):
            out.append(no_gpu.format(_quote(name), count, *values[: len(FIELDS["Time"]) - 1]))
        else:
            out.append(full.format(_quote(name), count, *values))
    return out


def render_json(
    sections: Sections, tallies: dict[str, int], samples: dict[str, Any] | None = None
) -> str:
    lines = ["{"]
    blocks: list[tuple[str, list[str]]] = []
    for section in SECTIONS:
        cats = sections[section]
        body = _json_entries(" " * 8, [(c, _json_rows(section, cats[c])) for c in sorted(cats)])
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
    if samples is not None:
        text = json.dumps(samples, indent=4, ensure_ascii=False).replace("\n", "\n    ")
        lines += [",", f'    "Samples": {text}']
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

    Statistics are kept while ``aggregate_stats`` is on (``profile_all=True``
    turns it on too); with it off this returns '' and, the first time,
    warns (RuntimeWarning) naming the key.  Statistics come
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
        if not SESSION.config.aggregate_stats:
            _warn_statistics_off()
            return ""
        SESSION.run_write_hooks(False)
        wall_ns = _native.stats_recorded_ns()  # before a reset restarts it
        peaks = _peaks()  # likewise
        samples = sample_summary(reset)  # likewise: the counts restart with the statistics
        sections = collect(_native.stats_snapshot(reset), wall_ns, peaks)
        for section, cats in sections.items():
            for cat, rows in cats.items():
                cats[cat] = _sorted(section, rows, sort_by, ascending)
        # The core keeps the tallies' start with the statistics' (reset too).
        tallies = _native.stats_counts(reset)
        if format == "table":
            return render_table(sections, tallies, percentiles, samples)
        return render_json(sections, tallies, samples)


_warned_off = False


def _warn_statistics_off() -> None:
    """Say once per process why dumps() is empty (a bare '' looks like a bug)."""
    global _warned_off
    if not _warned_off:
        _warned_off = True
        warn(
            "mxprof.dumps() returns '' because statistics are off: turn them on with "
            "mxprof.set_config(aggregate_stats=True) (profile_all=True turns them on too) "
            "before recording"
        )


def reset() -> None:
    """Start new statistics, as ``dumps(reset=True)`` does, without rendering."""
    with SESSION.lock:
        _native.stats_reset()  # the tallies dumps() shows begin again with them
        _sampler.reset()
