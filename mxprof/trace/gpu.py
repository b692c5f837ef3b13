"""GPU work per range, and an NVIDIA database's clock set by an mxprof trace of the same run.

``gpu_rows(trace)`` sums the GPU events of a loaded trace (those imported from
an nvprof or Nsight Systems database, categories ``cuda_kernel``,
``cuda_memcpy``, ``cuda_memset``) by the range that launched them
(``args["range"]``; ``(no range)`` for work launched outside every range).
Each unit of GPU work counts once, under its innermost range, so the rows add
up to the trace's whole GPU time.  ``mxprof stats`` prints them after the
range table, and ``--format json`` adds them under ``"GPU"``.

``align_inputs`` moves a database's events onto an mxprof trace's clock when
both are merged: the NVTX ranges mxprof emits (``set_config(nvtx=True)``) carry
the names of its own ranges, so each ``forward`` in the database is a
``forward`` in the trace, and the offset under which their names, order and
spacing agree is the clocks' offset (see ``align``).

Example:
    >>> import mxprof
    >>> from mxprof.trace.gpu import gpu_rows, gpu_table
    >>> print(gpu_table(gpu_rows(mxprof.load("run.sqlite"))))  # doctest: +SKIP
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Any

from .._render import display, format_ns, pad, width
from .model import Trace, base_time_ns, ns_ratio, round_ratio

GPU_CATEGORIES = ("cuda_kernel", "cuda_memcpy", "cuda_memset")
NO_RANGE = "(no range)"


@dataclass
class GpuRow:
    """The GPU work launched inside one range (times in ns, sizes in bytes)."""

    range: str
    count: int = 0  # kernel executions
    total: int = 0  # kernel time
    min: int = 0
    max: int = 0
    copies: int = 0
    bytes: int = 0
    copy_time: int = 0
    memsets: int = 0
    memset_bytes: int = 0
    by_kernel: dict[str, list[int]] = field(default_factory=dict)  # name -> [count, total]

    @property
    def kernels(self) -> int:
        """How many different kernels ran."""
        return len(self.by_kernel)

    @property
    def avg(self) -> float:
        """Mean kernel time in ns."""
        return self.total / self.count if self.count else 0.0

    def to_json(self) -> dict[str, Any]:
        """dumps()-style members, times in ns."""
        return {
            "Kernels": self.kernels,
            "Count": self.count,
            "Total": self.total,
            "Avg": self.avg,
            "Min": self.min,
            "Max": self.max,
            "Copies": self.copies,
            "Bytes": self.bytes,
            "Copy Time": self.copy_time,
            "Memsets": self.memsets,
            "Memset Bytes": self.memset_bytes,
            "By Kernel": {
                name: {"Count": n, "Total": t, "Avg": t / n}
                for name, (n, t) in sorted(self.by_kernel.items(), key=lambda i: (-i[1][1], i[0]))
            },
        }


def gpu_rows(trace: Trace) -> list[GpuRow]:
    """One row per launching range, most kernel time first (ties by name); [] without GPU work.

    Example:
        >>> rows = gpu_rows(mxprof.load("run.sqlite"))  # doctest: +SKIP
        >>> rows[0].range, rows[0].count, rows[0].total  # doctest: +SKIP
        ('forward', 3, 30000)
    """
    if trace.categories().isdisjoint(GPU_CATEGORIES):
        return []  # without reading the events: mxprof stats needs none of them
    rows: dict[str, GpuRow] = {}
    for e in trace:
        if e.category not in GPU_CATEGORIES or e.dur is None:
            continue
        label = e.args.get("range")
        row = rows.setdefault(label if isinstance(label, str) else NO_RANGE, GpuRow(""))
        size = e.args.get("bytes")
        size = size if isinstance(size, int) and not isinstance(size, bool) else 0
        if e.category == "cuda_kernel":
            row.min = e.dur if not row.count else min(row.min, e.dur)
            row.max = max(row.max, e.dur)
            row.count += 1
            row.total += e.dur
            tally = row.by_kernel.setdefault(e.name, [0, 0])
            tally[0] += 1
            tally[1] += e.dur
        elif e.category == "cuda_memcpy":
            row.copies += 1
            row.bytes += size
            row.copy_time += e.dur
        else:
            row.memsets += 1
            row.memset_bytes += size
    for name, row in rows.items():
        row.range = name
    return sorted(rows.values(), key=lambda r: (-r.total, -r.copy_time, r.range))


def gpu_json(rows: list[GpuRow]) -> dict[str, Any]:
    """``{"Ranges": {range: {...}}, "Unit": {...}}``, as ``mxprof stats --format json`` adds it."""
    return {
        "Ranges": {r.range: r.to_json() for r in rows},
        "Unit": {"Time": "ns", "Size": "B"},
    }


_COLUMNS = ("Kernels", "Count", "Total", "Avg", "Copies", "Bytes")


def gpu_table(rows: list[GpuRow], row_limit: int | None = None) -> str:
    """The rows as a text table: kernels, count, total and avg kernel time, copies and bytes.

    Example:
        >>> print(gpu_table([GpuRow("fwd", 2, 3000, 1000, 2000, 1, 4096, 500,
        ...                         by_kernel={"k": [2, 3000]})]), end="")
        GPU work by launching range
        -------------------------------------------------------
        Range  Kernels  Count    Total      Avg  Copies   Bytes
        -------------------------------------------------------
        fwd          1      2  3.000us  1.500us       1  4.0KiB
        -------------------------------------------------------
    """
    shown = rows if row_limit is None else rows[:row_limit]
    names = [display(r.range) for r in shown]
    cells = [
        [str(r.kernels), str(r.count), format_ns(r.total), format_ns(r.avg), str(r.copies),
         _size(r.bytes)]
        for r in shown
    ]  # fmt: skip
    nwidth = max([len("Range")] + [width(n) for n in names]) + 2
    widths = [max([len(h)] + [len(c[i]) for c in cells]) + 2 for i, h in enumerate(_COLUMNS)]
    widths[0] -= 2  # the first column sits right after the name's padding
    rule = "-" * (nwidth + sum(widths))
    lines = ["GPU work by launching range", rule]
    lines.append(pad("Range", nwidth) + "".join(f"{h:>{w}}" for h, w in zip(_COLUMNS, widths)))
    lines.append(rule)
    for name, row in zip(names, cells):
        lines.append(pad(name, nwidth) + "".join(f"{c:>{w}}" for c, w in zip(row, widths)))
    lines.append(rule)
    return "\n".join(lines) + "\n"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n}B" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{n}B"  # not reached


@dataclass(frozen=True)
class Alignment:
    """A database's clock against an mxprof trace's: db ts - offset_ns = trace ts (ns).

    ``pairs`` is how many database ranges found their trace range,
    ``spread_ns`` how far the pairs' differences lie apart (max - min): the
    clocks' drift over the run, plus the time between the two clocks' reads.
    """

    offset_ns: int
    pairs: int
    spread_ns: int


def _starts(events: list[dict[str, Any]], *, nvtx: bool) -> dict[str, list[int]]:
    """Range start times (ns on the file's axis) by name, ascending."""
    out: dict[str, list[int]] = {}
    for ev in events:
        if ev.get("ph") not in ("X", "b") or not isinstance(ev.get("name"), str):
            continue
        if nvtx != (ev.get("cat") == "nvtx"):
            continue
        ts = ns_ratio(ev.get("ts"))
        if ts is not None:
            out.setdefault(ev["name"], []).append(round_ratio(*ts))
    for times in out.values():
        times.sort()
    return out


# How far apart a database's range start and the trace's may lie and still be
# one range: both clocks are read in the same call, so only their drift over
# the run separates them.
MATCH_NS = 100_000
_CANDIDATE_NAMES = 8  # the rarest shared names propose offsets ...
_CANDIDATES_PER_NAME = 16  # ... from their first occurrences on each side
_SCORED = 4000  # range starts a candidate offset is tried on


def align(db_events: list[dict[str, Any]], trace_events: list[dict[str, Any]]) -> Alignment | None:
    """The offset that puts a database's NVTX ranges on the mxprof trace's same-named ranges.

    The rarest names shared by both propose offsets (an occurrence in the
    database against one in the trace); the offset under which most database
    ranges land within ``MATCH_NS`` of a same-named trace range wins, ties
    to the smaller total distance, so the order and spacing of the ranges
    decide even when one side holds only part of the run (an Nsight capture
    range, an mxprof schedule).  It is then refined to the median of the
    matched pairs' differences.  None when no range name is shared.

    Example:
        >>> align([{"ph": "X", "cat": "nvtx", "name": "step", "ts": 1005, "dur": 1}],
        ...       [{"ph": "X", "cat": "train", "name": "step", "ts": 5, "dur": 1}])
        Alignment(offset_ns=1000000, pairs=1, spread_ns=0)
    """
    ours, theirs = _starts(db_events, nvtx=True), _starts(trace_events, nvtx=False)
    shared = sorted((n for n in ours if n in theirs), key=lambda n: (len(ours[n]), n))
    if not shared:
        return None
    candidates = {
        a - b
        for name in shared[:_CANDIDATE_NAMES]
        for a in ours[name][:_CANDIDATES_PER_NAME]
        for b in theirs[name][:_CANDIDATES_PER_NAME]
    }
    starts = [(name, a) for name in shared for a in ours[name]]
    step = max(1, len(starts) // _SCORED)
    sample = starts[::step]

    def score(offset: int) -> tuple[int, int]:
        found = _residuals(sample, theirs, offset)
        return len(found), -sum(abs(r) for r in found)

    best = max(sorted(candidates), key=score)
    residuals = _residuals(starts, theirs, best)
    deltas = [best + r for r in residuals]
    return Alignment(int(statistics.median(deltas)), len(deltas), max(deltas) - min(deltas))


def _residuals(
    starts: list[tuple[str, int]], theirs: dict[str, list[int]], offset: int
) -> list[int]:
    """For each start with a same-named trace start within MATCH_NS of start - offset: how far."""
    found = []
    for name, a in starts:
        times = theirs[name]
        want = a - offset
        i = bisect.bisect_left(times, want)
        near = [times[j] for j in (i - 1, i) if 0 <= j < len(times)]
        if near:
            b = min(near, key=lambda t: abs(t - want))
            if abs(b - want) <= MATCH_NS:
                found.append(want - b)
    return found


def align_inputs(
    inputs: list[tuple[str, list[dict[str, Any]], dict[str, Any], bool]],
) -> list[tuple[str, list[dict[str, Any]], dict[str, Any], bool]]:
    """Merge's inputs, each NVIDIA database set onto the clock of the mxprof trace it matches best.

    A database's ``baseTimeNanoseconds`` becomes the trace's base minus the
    offset (so merge's wall-clock alignment does the rest); where the trace
    has no base, the database's events are shifted onto the trace's axis
    instead.  The alignment is noted in the database's
    ``otherData.nvidia.alignment``.
    """
    traces = [i for i in inputs if _is_mxprof(i[2]) and not is_nvidia(i[2])]
    out = []
    for path, events, meta, truncated in inputs:
        if is_nvidia(meta) and traces:
            found = [(a, t) for t in traces if (a := align(events, t[1])) is not None]
            if found:
                best, (trace_path, _, trace_meta, _) = max(found, key=lambda f: f[0].pairs)
                meta = _aligned_meta(meta, best, trace_path)
                base = base_time_ns(trace_meta)
                if base is None:
                    meta.pop("baseTimeNanoseconds", None)
                    events = [_shifted(e, best.offset_ns) for e in events]
                else:
                    meta["baseTimeNanoseconds"] = base - best.offset_ns
        out.append((path, events, meta, truncated))
    return out


def is_nvidia(meta: dict[str, Any]) -> bool:
    """Whether a trace's metadata is that of an NVIDIA database read as a trace."""
    other = meta.get("otherData")
    return isinstance(other, dict) and isinstance(other.get("nvidia"), dict)


def _is_mxprof(meta: dict[str, Any]) -> bool:
    other = meta.get("otherData")
    return isinstance(other, dict) and "mxprof_version" in other


def _aligned_meta(meta: dict[str, Any], found: Alignment, trace: str) -> dict[str, Any]:
    other = dict(meta.get("otherData") or {})
    nvidia = dict(other.get("nvidia") or {})
    nvidia["alignment"] = {
        "trace": trace, "offset_ns": found.offset_ns, "pairs": found.pairs,
        "spread_ns": found.spread_ns,
    }  # fmt: skip
    other["nvidia"] = nvidia
    return {**meta, "otherData": other}


def _shifted(event: dict[str, Any], offset_ns: int) -> dict[str, Any]:
    ts = ns_ratio(event.get("ts"))
    if ts is None or event.get("ph") == "M":
        return event
    return {**event, "ts": (round_ratio(*ts) - offset_ns) / 1000}
