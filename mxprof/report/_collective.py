"""What the cross-rank analysis reads: collectives from range names, and a step's cut.

See :mod:`mxprof.report.ranks` for the terms.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..trace import Event

COMM_DOMAIN = "torch.distributed"
ASYNC_DOMAIN = "torch.distributed.async"
GPU_CATEGORY = "torch.distributed,gpu"  # the same calls timed on their CUDA streams

_NAME = re.compile(
    r"^(?P<op>\w+)\((?P<dtype>[\w.]+), (?P<bytes>\d+|\?) B, group (?P<group>[^,)]*)"
    r"(?:, peer (?P<peer>[^)]*))?\)(?P<label>.*)$"
)
_KINETO = re.compile(r"^(?:gloo|nccl|ucc|mpi|xccl|c10d):(?P<op>\w+)")
_P2P = frozenset({"send", "recv", "isend", "irecv"})

Span = tuple[int, int]


@dataclass(frozen=True)
class Collective:
    """What a communication range's name and category say.

    Example:
        >>> parse("all_reduce(float32, 1024 B, group 0)", "torch.distributed")
        Collective(op='all_reduce', dtype='float32', bytes=1024, group='0', peer=None, \
is_async=False, label='')
    """

    op: str
    dtype: str
    bytes: int | None
    group: str
    peer: str | None
    is_async: bool
    label: str = ""

    @property
    def p2p(self) -> bool:
        """Whether it is a point-to-point call (send/recv)."""
        return self.op in _P2P


def parse(name: str, category: str, args: dict[str, Any] | None = None) -> Collective | None:
    """The collective a range records, or None when it is not communication.

    Reads the adapter's names (categories ``torch.distributed`` and
    ``torch.distributed.async``) and torch.profiler's ``gloo:op`` /
    ``nccl:op`` ranges (group from ``args['Process Group Name']``).
    """
    if category in (COMM_DOMAIN, ASYNC_DOMAIN, GPU_CATEGORY):
        m = _NAME.match(name)
        if m is None:
            return None
        size = m.group("bytes")
        return Collective(
            m.group("op"),
            m.group("dtype"),
            None if size == "?" else int(size),
            m.group("group"),
            m.group("peer"),
            category == ASYNC_DOMAIN,
            m.group("label").strip(),
        )
    k = _KINETO.match(name)
    if k is None:
        return None
    group = str((args or {}).get("Process Group Name", "0"))
    dtype = str((args or {}).get("dtype", "?"))
    return Collective(k.group("op"), dtype, None, group, None, False)


# ---- interval arithmetic ----


def union(spans: Iterable[Span]) -> list[Span]:
    out: list[list[int]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def minus(xs: list[Span], ys: list[Span]) -> int:
    """Measure of xs less ys (both disjoint and sorted)."""
    total, j = 0, 0
    for a, b in xs:
        cur = a
        while j < len(ys) and ys[j][1] <= cur:
            j += 1
        k = j
        while k < len(ys) and ys[k][0] < b:
            lo, hi = ys[k]
            if lo > cur:
                total += lo - cur
            cur = max(cur, hi)
            if cur >= b:
                break
            k += 1
        if cur < b:
            total += b - cur
    return total


def cut(
    lo: int,
    hi: int,
    compute: list[Event],
    comm: list[tuple[Event, Collective]],
    waits: dict[int, int],
) -> tuple[int, int, int, int]:
    """(compute, communication, waiting, idle) of the window [lo, hi)."""
    layers: list[list[Span]] = [[], [], [], [], []]  # bwait, bcomm, compute, await, acomm
    for e, c in comm:
        a, b = max(e.ts, lo), min(e.end, hi)
        if b <= a:
            continue
        w = e.ts + waits.get(id(e), 0)
        base = 3 if c.is_async else 0
        layers[base].append((a, min(w, b)))
        layers[base + 1].append((max(w, a), b))
    for e in compute:
        a, b = max(e.ts, lo), min(e.end, hi)
        if b > a:
            layers[2].append((a, b))
    covered: list[Span] = []
    got = []
    for spans in layers:
        u = union(spans)
        got.append(minus(u, covered))
        covered = union(covered + u)
    waiting, comm_t, comp = got[0] + got[3], got[1] + got[4], got[2]
    idle = (hi - lo) - waiting - comm_t - comp
    return comp, comm_t, waiting, max(0, idle)
