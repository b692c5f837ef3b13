"""What the cross-rank analysis reads: communication from ranges, and a step's cut.

A range is communication when it is one of these (``parse`` reads them):

- a collective or point-to-point call of the torch adapter (categories
  ``torch.distributed``, ``torch.distributed.async``, and
  ``torch.distributed,gpu`` for the same calls timed on CUDA streams,
  names ``op(dtype, bytes B, group g)``) or of torch.profiler
  (``gloo:op``, ``nccl:op`` ...);
- an operation of MXNet's distributed kvstore as its engine names it
  (``KVStoreDistDefaultPush``, ``KVStoreDistDefaultPull``,
  ``KVStoreDistRowSparsePull`` ...: ``KVStoreDist...Push`` or ``...Pull``);
- any range of a communication domain: ``kvstore`` or ``comm``, or a
  sub-domain of one (``comm.grads``, ``kvstore.dense``).  This is how a
  program marks its own communication: ``mxprof.Domain("kvstore")``
  for a parameter server's push and pull, ``mxprof.Domain("comm")`` for
  anything else.

Only the torch collectives are matched across ranks (the n-th call of a
name is the same collective everywhere), which is what tells waiting apart;
the others, like point-to-point calls, count whole as communication.

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
# MXNet's engine operations of a distributed kvstore (src/kvstore/kvstore_dist.h).
_KVSTORE_OP = re.compile(r"^KVStoreDist\w*?(?P<op>Push|Pull)")
# Domains whose every range is communication (see the module's docstring).
COMM_DOMAINS = ("kvstore", "comm")

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
    # Whether the n-th call of its name in a step is the same operation on
    # every rank of its group (a collective), so that its waiting can be
    # told apart: not for a kvstore's push and pull, nor a marked range.
    matched: bool = True

    @property
    def p2p(self) -> bool:
        """Whether its waiting is not told apart: a point-to-point call
        (send/recv) or communication that is not a matched collective."""
        return self.op in _P2P or not self.matched


def parse(name: str, category: str, args: dict[str, Any] | None = None) -> Collective | None:
    """The communication a range records, or None when it is not communication.

    Reads the adapter's names (categories ``torch.distributed`` and
    ``torch.distributed.async``), torch.profiler's ``gloo:op`` /
    ``nccl:op`` ranges (group from ``args['Process Group Name']``), MXNet's
    kvstore operations, and the ranges of a communication domain (see the
    module's docstring).

    Example:
        >>> parse("KVStoreDistDefaultPush", "operator").op
        'push'
        >>> c = parse("push", "kvstore")
        >>> c.op, c.group, c.p2p
        ('push', 'kvstore', True)
        >>> parse("push", "worker") is None
        True
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
    if k is not None:
        group = str((args or {}).get("Process Group Name", "0"))
        dtype = str((args or {}).get("dtype", "?"))
        return Collective(k.group("op"), dtype, None, group, None, False)
    kv = _KVSTORE_OP.match(name)
    if kv is not None:
        return Collective(kv.group("op").lower(), "?", None, "kvstore", None, False, matched=False)
    # A domain's frames ("<domain>,frame") are steps, not calls.
    if "," not in category and category.split(".", 1)[0] in COMM_DOMAINS:
        return Collective(name, "?", None, category, None, False, matched=False)
    return None


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
    compute: list[Span],
    comm: list[tuple[Event, Collective]],
    waits: dict[int, int],
) -> tuple[int, int, int, int]:
    """(compute, communication, waiting, idle) of the window [lo, hi); compute:
    the spans of its other ranges, already inside it."""
    layers: list[list[Span]] = [[], [], [], [], []]  # bwait, bcomm, compute, await, acomm
    for e, c in comm:
        a, b = max(e.ts, lo), min(e.end, hi)
        if b <= a:
            continue
        w = e.ts + waits.get(id(e), 0)
        base = 3 if c.is_async else 0
        layers[base].append((a, min(w, b)))
        layers[base + 1].append((max(w, a), b))
    layers[2].extend(compute)
    covered: list[Span] = []
    got = []
    for spans in layers:
        u = union(spans)
        got.append(minus(u, covered))
        covered = union(covered + u)
    waiting, comm_t, comp = got[0] + got[3], got[1] + got[4], got[2]
    idle = (hi - lo) - waiting - comm_t - comp
    return comp, comm_t, waiting, max(0, idle)
