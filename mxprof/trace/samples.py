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
the stack; a recursive function counts once per sample).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RawEvent = dict[str, Any]

CATEGORY = "mxprof.sample"
DEFINITIONS = ("mxprof_frame", "mxprof_stack", "mxprof_range")
TOP = 20  # functions listed per range
PROGRAM = "<program>"  # summary key of the whole program

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
        """Samples per (range, stack)."""
        return Counter((s.range, s.stack) for s in self.samples)

    def summary(self, top: int = TOP) -> dict[str, Any]:
        """The statistics ``dumps(format="json")`` has under ``Samples``.

        Example:
            >>> Samples().summary()["Count"]
            0
        """
        return summary(self.counts(), top)


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
    per (range (category, name) or None, stack outermost first).

    Example:
        >>> s = summary({(("d", "phase"), (("main", "a.py", 1), ("f", "a.py", 5))): 3})
        >>> s["Ranges"]["d"]["phase"]["Functions"][0]["Function"], s["Count"]
        ('f', 3)
    """
    program = _top(((stack, n) for (_, stack), n in counts.items()), top)
    per: dict[RangeKey, list[tuple[tuple[Frame, ...], int]]] = {}
    for (key, stack), n in counts.items():
        if key is not None:
            per.setdefault(key, []).append((stack, n))
    ranges: dict[str, dict[str, Any]] = {}
    for cat, name in sorted(per):
        ranges.setdefault(cat, {})[name] = _top(per[(cat, name)], top)
    return {"Count": program["Count"], "Program": program["Functions"], "Ranges": ranges}


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
