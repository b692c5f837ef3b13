"""Stack samples in trace files (``sample_rate``): read, and summarised as ``dumps()`` does.

The Chrome JSON writer records a sample as a thread-scoped instant of
category ``mxprof.sample`` with ``args {"stack": node id, "range": object
id}``, and defines the ids by metadata events ``mxprof_frame`` {id,
function, file, line}, ``mxprof_stack`` {id, parent, frame} and
``mxprof_range`` {id, name, cat} (ids are per process).  The Perfetto
writer records PerfSample packets with interned frames and callstacks;
:class:`PerfettoSamples` turns them into the same raw events, so one reader
(:func:`split`) serves both formats.

:func:`summary` is the one definition of the statistics ``dumps()`` shows
(section ``Samples``) and a loaded trace gives (``Trace.samples.summary()``):
per range (and for the whole program) the functions with the most samples,
by self samples (the function was innermost) and inclusive ones (it was on
the stack; a recursive function counts once per sample).  A sample taken in
one of the profiler's own ranges (``_render.is_own``) counts as in no range.
:func:`render_table` is the one text rendering of a summary, for ``dumps()``,
``mxprof run`` and ``mxprof stats``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._render import COL_WIDTH, NAME_WIDTH, display, is_own, pad, width

RawEvent = dict[str, Any]

CATEGORY = "mxprof.sample"
DEFINITIONS = ("mxprof_frame", "mxprof_stack", "mxprof_range")
TOP = 20  # functions listed per range
PROGRAM = "<program>"  # summary key of the whole program
TABLE_TOP = 10  # functions per range in the text table
MODES = ("wall", "cpu")  # sample_mode: every thread at each tick, or only those on a CPU

Frame = tuple[str, str, int]  # function, file, line
RangeKey = tuple[str, str]  # category, name ("", "") for samples in no range


@dataclass
class Sample:
    """One sample: where (pid, tid), when (ts in ns from the trace start),
    its stack (outermost frame first) and the range it was attributed to."""

    pid: Any
    tid: Any
    ts: int
    stack: tuple[Frame, ...]
    range: RangeKey | None


@dataclass
class Samples:
    """The samples of a loaded trace, in file order."""

    samples: list[Sample] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.samples)

    def counts(self) -> Counter[tuple[RangeKey | None, tuple[Frame, ...]]]:
        """Samples per (range, stack); the range by :func:`attributed`."""
        return Counter((attributed(s.range), s.stack) for s in self.samples)

    def summary(self, top: int = TOP) -> dict[str, Any]:
        """The statistics ``dumps(format="json")`` has under ``Samples``.

        Example:
            >>> Samples().summary()["Count"]
            0
        """
        return summary(self.counts(), top)


def attributed(key: RangeKey | None) -> RangeKey | None:
    """The range a sample counts in for the user: its own, or None when it was
    taken in no range or in one of the profiler's own (``_render.is_own``).

    Example:
        >>> attributed(("train", "step")), attributed(("mxprof", "flush"))
        (('train', 'step'), None)
    """
    return None if key is None or is_own(*key) else key


def settings(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """How a trace's samples were taken, for the ``Samples`` block: ``Rate``
    (samples per second, None when the file does not say) and, when it does,
    ``Mode`` (``sample_mode``; traces written before it existed sampled wall
    time).  Read from ``otherData.config``, where mxprof records its settings;
    Perfetto and merged files carry none.

    Example:
        >>> settings({"otherData": {"config": {"sample_rate": 1000.0}}})
        {'Rate': 1000.0, 'Mode': 'wall'}
    """
    other = metadata.get("otherData")
    config = other.get("config") if isinstance(other, dict) else None
    rate = config.get("sample_rate") if isinstance(config, dict) else None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        return {"Rate": None}
    assert isinstance(config, dict)
    mode = config.get("sample_mode", "wall")
    return {"Rate": float(rate), "Mode": mode if mode in MODES else "wall"}


def _row(frame: Frame, self_n: int, incl: int, total: int) -> dict[str, Any]:
    return {
        "Function": frame[0],
        "File": frame[1],
        "Line": frame[2],
        "Self": self_n,
        "Inclusive": incl,
        "Self %": round(100.0 * self_n / total, 2) if total else 0.0,
        "Inclusive %": round(100.0 * incl / total, 2) if total else 0.0,
    }


def _top(counts: Iterable[tuple[tuple[Frame, ...], int]], top: int) -> dict[str, Any]:
    selfs: Counter[Frame] = Counter()
    incls: Counter[Frame] = Counter()
    total = 0
    for stack, n in counts:
        total += n
        if stack:
            selfs[stack[-1]] += n
        for frame in set(stack):
            incls[frame] += n
    order = sorted(incls, key=lambda f: (-selfs[f], -incls[f], f))
    return {
        "Count": total,
        "Functions": [_row(f, selfs[f], incls[f], total) for f in order[:top]],
    }


def summary(
    counts: Mapping[tuple[RangeKey | None, tuple[Frame, ...]], int], top: int = TOP
) -> dict[str, Any]:
    """Top functions of the whole program and of each range, from sample counts
    per (range (category, name) or None, stack outermost first).  Samples in
    one of the profiler's own ranges count in the program only (:func:`attributed`).

    Example:
        >>> s = summary({(("d", "phase"), (("main", "a.py", 1), ("f", "a.py", 5))): 3})
        >>> s["Ranges"]["d"]["phase"]["Functions"][0]["Function"], s["Count"]
        ('f', 3)
    """
    program = _top(((stack, n) for (_, stack), n in counts.items()), top)
    per: dict[RangeKey, list[tuple[tuple[Frame, ...], int]]] = {}
    for (given, stack), n in counts.items():
        key = attributed(given)
        if key is not None:
            per.setdefault(key, []).append((stack, n))
    ranges: dict[str, dict[str, Any]] = {}
    for cat, name in sorted(per):
        ranges.setdefault(cat, {})[name] = _top(per[(cat, name)], top)
    return {"Count": program["Count"], "Program": program["Functions"], "Ranges": ranges}


def _label(function: dict[str, Any]) -> str:
    return display(
        f"{function['Function']} ({os.path.basename(function['File'])}:{function['Line']})"
    )


def render_table(summary: Mapping[str, Any], top: int = TABLE_TOP) -> list[str]:
    """The ``Samples`` block of a statistics table: per range (the whole program
    first), its top functions by self samples, with self and inclusive counts
    and shares.  The title gives ``Rate`` and ``Mode`` when the summary has them.

    Args:
        summary: a :func:`summary`, with ``Rate`` (and ``Mode``) added by its
            caller (``dumps()``: the session's; ``mxprof stats``: :func:`settings`).
        top: functions listed per range.

    Returns:
        The lines, the last one empty.

    Example:
        >>> s = summary({(("d", "step"), (("main", "a.py", 1), ("f", "a.py", 5))): 3})
        >>> lines = render_table({**s, "Rate": 100.0, "Mode": "wall"}, top=1)
        >>> lines[0]
        'Samples (100 Hz wall, 3 samples; top 1 functions per range)'
        >>> lines[5].split()
        ['f', '(a.py:5)', '3', '100.00', '3', '100.00']
    """
    rate = summary.get("Rate")
    mode = summary.get("Mode")
    how = f"{rate:g} Hz{f' {mode}' if mode else ''}, " if rate else ""
    blocks: list[tuple[str, Mapping[str, Any]]] = [
        (PROGRAM, {"Count": summary["Count"], "Functions": summary["Program"]})
    ]
    for cat, names in summary["Ranges"].items():
        blocks += [(display(f"{cat}::{name}"), body) for name, body in names.items()]
    titles = [f"{title} ({body['Count']} samples)" for title, body in blocks]
    labels = [_label(f) for _, body in blocks for f in body["Functions"][:top]]
    columns = max([NAME_WIDTH] + [width(t) + 4 for t in labels] + [width(t) + 2 for t in titles])
    heads = ("Self", "Self %", "Inclusive", "Inclusive %")
    lines = [
        f"Samples ({how}{summary['Count']} samples; top {top} functions per range)",
        "=" * 17,
        pad("Name", columns) + "".join(f"{h:>{COL_WIDTH}}" for h in heads),
        pad("----", columns) + "".join(f"{'-' * len(h):>{COL_WIDTH}}" for h in heads),
    ]
    for title, (_, body) in zip(titles, blocks):
        lines.append(title)
        for f in body["Functions"][:top]:
            lines.append(
                pad(f"  {_label(f)}", columns)
                + f"{f['Self']:>{COL_WIDTH}}{f['Self %']:>{COL_WIDTH}.2f}"
                + f"{f['Inclusive']:>{COL_WIDTH}}{f['Inclusive %']:>{COL_WIDTH}.2f}"
            )
    lines.append("")
    return lines


# ---- Chrome JSON (and Perfetto, converted) ----


def split(events: Iterable[RawEvent]) -> tuple[list[RawEvent], Samples]:
    """The raw events other than samples and their definitions, and the samples.

    Example:
        >>> others, found = split([{"ph": "X", "name": "a", "ts": 0, "dur": 1}])
        >>> len(others), len(found)
        (1, 0)
    """
    others: list[RawEvent] = []
    frames: dict[tuple[Any, Any], Frame] = {}
    nodes: dict[tuple[Any, Any], tuple[Any, Any]] = {}
    ranges: dict[tuple[Any, Any], RangeKey] = {}
    raw: list[RawEvent] = []
    for e in events:
        if not isinstance(e, dict):
            others.append(e)
            continue
        ph, name = e.get("ph"), e.get("name")
        if ph == "M" and name in DEFINITIONS:
            args = e.get("args")
            if not isinstance(args, dict):
                continue
            key = (e.get("pid"), args.get("id"))
            if name == "mxprof_frame":
                frames[key] = (
                    str(args.get("function", "")),
                    str(args.get("file", "")),
                    int(args.get("line") or 0),
                )
            elif name == "mxprof_stack":
                nodes[key] = (args.get("parent"), args.get("frame"))
            else:
                ranges[key] = (str(args.get("cat", "")), str(args.get("name", "")))
        elif ph == "i" and e.get("cat") == CATEGORY:
            raw.append(e)
        else:
            others.append(e)
    stacks: dict[tuple[Any, Any], tuple[Frame, ...]] = {}

    def stack_of(pid: Any, sid: Any) -> tuple[Frame, ...]:
        key = (pid, sid)
        got = stacks.get(key)
        if got is not None:
            return got
        chain: list[Frame] = []
        seen = 0
        while sid and (pid, sid) in nodes and seen < 100_000:
            parent, fid = nodes[(pid, sid)]
            chain.append(frames.get((pid, fid), ("?", "", 0)))
            sid, seen = parent, seen + 1
        got = stacks[key] = tuple(reversed(chain))
        return got

    found = Samples()
    for e in raw:
        got = e.get("args")
        given: dict[str, Any] = got if isinstance(got, dict) else {}
        pid = e.get("pid")
        ts = e.get("ts")
        rid = given.get("range")
        sid = given.get("stack")
        found.samples.append(
            Sample(
                pid,
                e.get("tid"),
                round(ts * 1000) if isinstance(ts, (int, float)) else 0,
                stack_of(pid, sid),
                ranges.get((pid, rid)) if rid is not None else None,
            )
        )
    return others, found


class PerfettoSamples:
    """The Perfetto reader's hook: interned frames and callstacks, and
    PerfSample packets as the raw events the JSON writer would have written."""

    def __init__(self) -> None:
        self.functions: dict[int, str] = {}
        self.frames: dict[int, int] = {}  # frame iid -> function name iid
        self.callstacks: dict[int, list[int]] = {}
        self.defined: set[tuple[Any, str, int]] = set()
        self.nodes: dict[tuple[Any, tuple[int, ...]], int] = {}

    def clear(self) -> None:
        """The sequence's incremental state was cleared."""
        self.functions.clear()
        self.frames.clear()
        self.callstacks.clear()

    def interned(self, field_no: int, entry: dict[int, list[Any]]) -> None:
        """One InternedData entry (fields by number, repeated values in lists)."""
        iid = entry.get(1, [0])[0]
        if field_no == 5:
            value = entry.get(2, [b""])[0]
            self.functions[iid] = value.decode("utf-8", "replace") if value else ""
        elif field_no == 6:
            self.frames[iid] = entry.get(2, [0])[0]
        elif field_no == 7:
            self.callstacks[iid] = list(entry.get(2, []))

    def sample(
        self,
        entry: dict[int, list[Any]],
        ts: Any,
        names: Mapping[int, str],
        categories: Mapping[int, str],
    ) -> list[RawEvent]:
        """A PerfSample's raw events: definitions new to the file, then the sample."""
        pid, tid = entry.get(2, [0])[0], entry.get(3, [0])[0]
        iid = entry.get(4, [0])[0]
        out: list[RawEvent] = []
        parent = 0
        frames = self.callstacks.get(iid, [])
        leaf = ""
        for depth in range(len(frames)):
            fid = frames[depth]
            text = self.functions.get(self.frames.get(fid, 0), "")
            leaf = _frame_of(text)[0]
            if (pid, "f", fid) not in self.defined:
                self.defined.add((pid, "f", fid))
                function, file, line = _frame_of(text)
                out.append(
                    _define(pid, "mxprof_frame", fid, function=function, file=file, line=line)
                )
            path = (pid, tuple(frames[: depth + 1]))
            node = self.nodes.get(path)
            if node is None:
                node = self.nodes[path] = len(self.nodes) + 1
                out.append(_define(pid, "mxprof_stack", node, parent=parent, frame=fid))
            parent = node
        args: dict[str, Any] = {"stack": parent}
        rid = (iid >> 32) - 1
        if rid >= 0:
            args["range"] = rid
            if (pid, "r", rid) not in self.defined:
                self.defined.add((pid, "r", rid))
                out.append(
                    _define(
                        pid,
                        "mxprof_range",
                        rid,
                        name=names.get(rid, ""),
                        cat=categories.get(rid, ""),
                    )
                )
        out.append(
            {
                "name": leaf,
                "cat": CATEGORY,
                "ph": "i",
                "s": "t",
                "ts": ts,
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )
        return out


def _define(pid: Any, what: str, ident: int, **args: Any) -> RawEvent:
    return {"name": what, "ph": "M", "pid": pid, "tid": 0, "args": {"id": ident, **args}}


def _frame_of(text: str) -> Frame:
    """ "function (file:line)", as the Perfetto writer names a frame."""
    head, sep, tail = text.rpartition(" (")
    if not sep or not tail.endswith(")"):
        return (text, "", 0)
    file, _, line = tail[:-1].rpartition(":")
    return (head, file, int(line) if line.isdigit() else 0)
