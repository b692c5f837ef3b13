"""Nesting of ranges on a thread: direct parents, self times, and the call tree.

A range's children are the ranges on the same (pid, tid) that lie inside it
(``child.ts >= parent.ts`` and ``child.end <= parent.end``); its self time is
its duration less its direct children's (at least 0). A range that overlaps
the range open before it without fitting inside is not that range's child: it
becomes the child of the innermost open range that does contain it, if any.
Zero-length ranges are never parents (two at one instant are siblings).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._render import format_ns

if TYPE_CHECKING:
    from .model import Event

ThreadKey = tuple[Any, Any]


def structure(events: Sequence[Event]) -> tuple[Sequence[int], Sequence[int]]:
    """Each event's direct parent (an index, -1 for none) and self time in ns.

    ``events`` must be ordered by ts then longest first within each (pid, tid),
    as ``Trace.events`` is. Events that are not ranges get parent -1, self 0.
    Both come as arrays of int64, 16 bytes an event (lists of ints took 72:
    720 MB of a 10 M-event report); as lists only where a time is past int64
    (a damaged file).

    Example:
        >>> from mxprof.trace import Event
        >>> outer = Event("outer", "", "X", 0, 4_000, 1, 1, {})
        >>> inner = Event("inner", "", "X", 1_000, 1_000, 1, 1, {})
        >>> [list(part) for part in structure([outer, inner])]
        [[-1, 0], [3000, 1000]]
    """
    threads: dict[ThreadKey, list[int]] = {}
    for i, event in enumerate(events):
        if event.dur is not None:
            threads.setdefault((event.pid, event.tid), []).append(i)
    runs = [
        ((i, events[i].ts, events[i].dur or 0) for i in indices) for indices in threads.values()
    ]
    return nested(len(events), runs)


def nested(
    n: int, threads: Iterable[Iterable[tuple[int, int, int]]]
) -> tuple[Sequence[int], Sequence[int]]:
    """``structure``'s parents and selfs of n events, given each thread's ranges
    as (index, ts, dur) in ``Trace.events``'s order (``nest``)."""
    parents: MutableSequence[int] = array("q", [-1]) * n
    selfs: MutableSequence[int] = array("q", [0]) * n
    for ranges in threads:
        for i, own in nest(ranges, parents):
            try:
                selfs[i] = own if own > 0 else 0  # children that overlap: at least 0
            except OverflowError:  # past int64 ns (a damaged file): lists hold it
                selfs = list(selfs)
                selfs[i] = own if own > 0 else 0
    return parents, selfs


def nest(
    ranges: Iterable[tuple[int, int, int]], parents: MutableSequence[int] | None = None
) -> Iterator[tuple[int, int]]:
    """The nesting of one thread's ranges: (index, self ns) of each range once
    its children are all seen (self not yet clamped at 0), and with parents
    given, parents[index] = its direct parent's index.

    ``ranges`` are the thread's ranges as (index, ts, dur), ordered by ts then
    longest first. The one walk behind ``structure`` and the statistics.

    Example:
        >>> sorted(nest([(0, 0, 10), (1, 2, 3), (2, 6, 0)]))
        [(0, 7), (1, 3), (2, 0)]
    """
    # The ranges that may still contain what comes: [ts, end, index, self so far].
    stack: list[list[int]] = []
    for i, start, length in ranges:
        end = start + length
        # Ranges that ended before this one starts can parent nothing after it.
        while stack:
            top = stack[-1]
            if start < top[1] or (top[0] <= start and end <= top[1]):
                break
            stack.pop()
            yield top[2], top[3]
        if stack:
            top = stack[-1]
            if top[0] <= start and end <= top[1]:  # the usual case: inside the last open
                top[3] -= length
                if parents is not None:
                    parents[i] = top[2]
            else:  # overlaps it without fitting: the innermost open range that contains it
                for k in range(len(stack) - 2, -1, -1):
                    top = stack[k]
                    if top[0] <= start and end <= top[1]:
                        top[3] -= length
                        if parents is not None:
                            parents[i] = top[2]
                        break
        if length > 0:
            stack.append([start, end, i, length])
        else:
            yield i, length
    while stack:
        top = stack.pop()
        yield top[2], top[3]


def by_key(
    ts: Sequence[int],
    dur: Sequence[int],
    kind: Sequence[int],
    extras: Sequence[tuple[int, Any]],
    no_dur: int,
) -> dict[int, tuple[array[int], list[int]]]:
    """One thread's ranges grouped by key index: (durations, [self total]) each.

    The thread is given as its columns (``trace/_columns.py``: ``ts`` sorted,
    longest first at one ts; ``dur`` with ``no_dur`` for an event that is not
    a range; ``kind`` a key index, or ``-(j + 1)`` for ``extras[j]``'s).
    Self times follow ``nest``'s rule exactly (a range's duration less its
    direct children's, summed where above 0); this is that walk written for
    the columns, as the statistics' inner loop: no Event and no generator
    step per range, the innermost open range in local variables and the ones
    below it in three parallel lists.  Durations are in ts order, in arrays
    of int64 (lists where the columns are: past int64, a damaged file).

    Example:
        >>> got = by_key([0, 2, 6], [10, 3, 0], [0, 1, 1], [], -1)
        >>> {k: (list(d), s) for k, (d, s) in got.items()}
        {0: ([10], [7]), 1: ([3, 0], [3])}
    """
    wide = isinstance(dur, list)
    groups: dict[int, tuple[array[int], list[int]]] = {}
    # kind value -> (its group's durations' append, its group's self total cell)
    entries: dict[int, tuple[Any, list[int]]] = {}
    # The innermost open range: its end, duration less its direct children's
    # so far, and self total cell; at the bottom a root that contains
    # everything (its cell is a spare).
    top_end, top_left, top_cell = _NO_END, 0, [0]
    below: list[tuple[int, int, list[int]]] = []  # the open ranges under it, outermost first
    for start, length, value in zip(ts, dur, kind):
        if length == no_dur:
            continue
        entry = entries.get(value)
        if entry is None:
            k = value if value >= 0 else extras[-value - 1][0]
            if k not in groups:
                groups[k] = ([] if wide else array("q"), [0])  # type: ignore[assignment]
            entry = entries[value] = (groups[k][0].append, groups[k][1])
        entry[0](length)
        end = start + length
        # Ranges that ended before this one starts can parent nothing after
        # it (every open range starts at or before this one: ts order).
        while start >= top_end and end > top_end:
            if top_left > 0:
                top_cell[0] += top_left
            top_end, top_left, top_cell = below.pop()
        if end <= top_end:  # the usual case: inside the innermost open range
            top_left -= length
        else:  # overlaps it without fitting: the innermost open range that contains it
            for j in range(len(below) - 1, -1, -1):
                if end <= below[j][0]:
                    below[j] = (below[j][0], below[j][1] - length, below[j][2])
                    break
        if length > 0:  # zero-length ranges are never parents (and have no self time)
            below.append((top_end, top_left, top_cell))
            top_end, top_left, top_cell = end, length, entry[1]
    while below:  # the root is never closed
        if top_left > 0:
            top_cell[0] += top_left
        top_end, top_left, top_cell = below.pop()
    return groups


_NO_END = 1 << 256  # the root's end in by_key: after any time a trace can hold


@dataclass
class CallNode:
    """One call path on one thread: the ranges with this name under the same path.

    Times are in ns; ``self`` sums the ranges' own self times.
    """

    name: str
    category: str
    count: int = 0
    total: int = 0
    self: int = 0
    children: list[CallNode] = field(default_factory=list)
    _by_key: dict[tuple[str, str], CallNode] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def child(self, name: str) -> CallNode:
        """The first child called name.

        Raises:
            KeyError: no child has that name; the message lists the children.

        Example:
            >>> node = CallNode("outer", "dom")
            >>> node.children.append(CallNode("inner", "dom", count=2))
            >>> node.child("inner").count
            2
        """
        for node in self.children:
            if node.name == name:
                return node
        have = ", ".join(repr(n.name) for n in self.children) or "none"
        raise KeyError(f"{self.name!r} has no child {name!r} (children: {have})")


class CallTree:
    """Per-thread call trees: ``roots[(pid, tid)]`` lists that thread's top-level nodes.

    ``str(tree)`` renders each thread's tree as indented text.

    Example:
        >>> tree = mxprof.load("trace.json").tree()  # doctest: +SKIP
        >>> print(tree)  # doctest: +SKIP
        w0 (pid 26078, tid 1)
          outer    count 1  total 4.000ms  self 2.000ms
            inner  count 2  total 2.000ms  self 2.000ms
    """

    def __init__(
        self,
        roots: dict[ThreadKey, list[CallNode]],
        thread_names: Mapping[ThreadKey, str] | None = None,
    ) -> None:
        self.roots = roots
        self.thread_names = dict(thread_names or {})

    def __repr__(self) -> str:
        return f"CallTree(threads={len(self.roots)})"

    def __str__(self) -> str:
        blocks = []
        for (pid, tid), nodes in sorted(self.roots.items(), key=lambda kv: _thread_order(kv[0])):
            name = self.thread_names.get((pid, tid))
            head = f"{name} (pid {pid}, tid {tid})" if name else f"tid {tid} (pid {pid})"
            rows: list[tuple[str, CallNode]] = []
            _flatten(nodes, 1, rows)
            width = max(len(label) for label, _ in rows)
            cwidth = max(len(str(node.count)) for _, node in rows)
            lines = [head] + [
                f"{label:<{width}}  count {node.count:>{cwidth}}"
                f"  total {format_ns(node.total):>10}  self {format_ns(node.self):>10}"
                for label, node in rows
            ]
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks) + "\n" if blocks else ""


def _thread_order(key: ThreadKey) -> tuple[str, str]:
    return (str(key[0]), str(key[1]))


def _flatten(nodes: list[CallNode], depth: int, out: list[tuple[str, CallNode]]) -> None:
    for node in nodes:
        out.append(("  " * depth + node.name, node))
        _flatten(node.children, depth + 1, out)


def build_tree(
    events: Sequence[Event],
    parents: Sequence[int],
    selfs: Sequence[int],
    thread_names: Mapping[ThreadKey, str],
) -> CallTree:
    """Merge ranges into call paths: same (name, category) under the same path, one node.

    ``parents`` and ``selfs`` are ``structure(events)``'s; a parent must come
    before its children in ``events``, as it does in ``Trace.events``.

    Example:
        >>> from mxprof.trace import Event
        >>> events = [Event("step", "", "X", 0, 9, 1, 1, {}), Event("op", "", "X", 1, 2, 1, 1, {}),
        ...           Event("op", "", "X", 4, 2, 1, 1, {})]
        >>> (step,) = build_tree(events, *structure(events), {}).roots[(1, 1)]
        >>> step.self, [(n.name, n.count, n.total) for n in step.children]
        (5, [('op', 2, 4)])
    """
    roots: dict[ThreadKey, list[CallNode]] = {}
    root_keys: dict[ThreadKey, dict[tuple[str, str], CallNode]] = {}
    node_of: dict[int, CallNode] = {}
    for i, event in enumerate(events):
        if event.dur is None:
            continue
        parent = parents[i]
        if parent < 0:
            thread = (event.pid, event.tid)
            siblings = roots.setdefault(thread, [])
            by_key = root_keys.setdefault(thread, {})
        else:
            siblings = node_of[parent].children
            by_key = node_of[parent]._by_key
        node = by_key.get((event.name, event.category))
        if node is None:
            node = by_key[(event.name, event.category)] = CallNode(event.name, event.category)
            siblings.append(node)
        node.count += 1
        node.total += event.dur
        node.self += selfs[i]
        node_of[i] = node
    return CallTree(roots, thread_names)
