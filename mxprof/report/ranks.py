"""Cross-rank analysis: where each rank's steps go, and the rank the others wait for.

``analyze(traces)`` reads one merged trace or several per-rank files (loaded
with ``mxprof.load``) and gives, per step and per rank, the step's time cut
into four parts that add up to it:

- *waiting*: inside a collective, before the last rank arrived at it;
- *communication*: inside a collective or point-to-point call, the rest;
- *compute*: inside any other range (not a step itself);
- *idle*: in no range at all (unrecorded work, sleeps, Python between ranges).

A step is a range of a frame or a ``ProfilerStep#N`` (as in the report),
the one with the most ranges on each process; time between steps is in no
step.  Without steps, each rank's whole trace is one window.

Each instant counts once, by the first of: a blocking call's waiting, a
blocking call's communication, compute, an asynchronous handle's waiting
(DDP's buckets in flight), its communication, idle; so a handle that
overlaps computation costs only where nothing else ran.

Collectives are what the torch adapter records (categories
``torch.distributed`` and ``torch.distributed.async``, names
``op(dtype, bytes B, group g)``) and torch.profiler's ``gloo:``/``nccl:``
ranges.  Where a process has them timed on CUDA streams (category
``torch.distributed,gpu``), those are its collectives (the host call of a
CUDA collective returns at its launch) and count as blocking.  MXNet's
kvstore push and pull, and every range of a ``kvstore`` or ``comm``
domain, are communication too (``mxprof.report._collective``), counted
whole like point-to-point calls.

The ranks are the processes that communicate (else those that step, else
all).  A parameter-server job's servers (role ``server``) are listed after
them, each trace whole as one window (they have no steps): their compute is
the work they do for the workers, their idle the time they wait for it.
They are left out of the spread and the straggler, which compare ranks
doing the same work.

The n-th call of a name in a step on one process group is the same
collective on every rank.  A collective ends on every rank at about
the same moment (no rank leaves before the last one's data is in), so a
rank's *wait* in it is its duration less the shortest duration any rank
had in it: no clock needs to agree between the files.  The rank with the
shortest duration arrived last: the others waited for it, unless the
durations differ by less than ``LATE_NOISE_NS`` (20 us, timer and
scheduling jitter), where no rank is late.  Point-to-point calls count as
communication; their waiting is not told apart.

The *straggler* is the rank the others wait for: the one the others'
waiting is blamed on most (the sum, over collectives where it arrived last,
of the others' median wait), named when that is at least
``STRAGGLER_MIN_SHARE`` of all the blame, ``STRAGGLER_LEAD`` x the next
rank's, and ``STRAGGLER_MIN_WAIT`` of the median step (or 1 ms without
steps): a balanced job spreads its small waits over every rank, so a
majority of the blame, twice the next rank's, is a pattern and not chance,
and 2 % of a step is the least worth a look.  A slow
rank waits *least*, so per-rank step or busy times miss it; its evidence
is how often it arrived last, how long the others waited for it, how
little it waited itself, and which part of its step (a range, or idle
time) is longer than on the others.

The *spread* of a range name is its time per step on each rank: min,
median and max across ranks, with the ranks at the ends.

Example:
    >>> import mxprof
    >>> from mxprof.report.ranks import analyze
    >>> result = analyze([mxprof.load(f"rank{r}.json") for r in range(4)])  # doctest: +SKIP
    >>> result.straggler.label  # doctest: +SKIP
    'worker 3'
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Union

from .._render import format_ns
from ..trace import Event, Trace, dataloader, load
from ..trace.merge import JOB_KEYS, JobInput, one_job
from ..trace.processes import Process, in_job, job, processes
from ..trace.steps import is_frame, is_profiler_step
from ._collective import GPU_CATEGORY, Collective, Span, cut, parse, union

__all__ = [
    "Collective",
    "RankAnalysis",
    "RankStep",
    "RanksPart",
    "Spread",
    "Straggler",
    "analyze",
    "parse",
    "rank_part",
    "reduce",
]

STRAGGLER_MIN_SHARE = 0.5
STRAGGLER_LEAD = 2.0
STRAGGLER_MIN_WAIT = 0.02  # of the median step
STRAGGLER_MIN_WAIT_NS = 1_000_000  # without steps
LATE_NOISE_NS = 20_000  # duration spread below this names no late rank
EVIDENCE_SHARE = 0.05  # of the median step: a part or range this much longer is evidence


@dataclass(frozen=True)
class RankStep:
    """One step of one rank, in ns: its four parts add up to ``total``."""

    step: int | None
    rank: str
    total: int
    compute: int
    communication: int
    waiting: int
    idle: int


@dataclass(frozen=True)
class Spread:
    """A range name's time per step across ranks (ns), with the ranks at the ends."""

    name: str
    category: str
    min: float
    median: float
    max: float
    min_rank: str
    max_rank: str


@dataclass(frozen=True)
class Straggler:
    """The rank the others wait for, and why we say so."""

    label: str
    late: int  # collectives it arrived last at
    collectives: int  # collectives with a late rank
    waited_for: float  # the others' waiting blamed on it, per step (ns)
    own_wait: float  # its own waiting per step (ns)
    others_wait: float  # median of the others' waiting per step (ns)
    evidence: tuple[str, ...]
    ranges: tuple[str, ...] = ()  # names of ranges longer on it than on the others


@dataclass
class RankAnalysis:
    """What :func:`analyze` found; ``table()`` and ``to_json()`` render it."""

    ranks: list[str]
    step_name: str | None
    steps: list[RankStep]
    spread: list[Spread]
    straggler: Straggler | None
    collectives: dict[str, dict[str, Any]] = field(default_factory=dict)
    matched: int = 0  # collectives found on >= 2 ranks
    servers: list[str] = field(default_factory=list)  # of ranks: a parameter server's
    # torch's DataLoader: data wait per step, each worker's busy/idle (trace.dataloader)
    loader: dataloader.Loader | None = None

    def per_rank(self) -> dict[str, dict[str, float]]:
        """Each rank's mean step: total, compute, communication, waiting, idle (ns)."""
        out: dict[str, dict[str, float]] = {}
        for rank in self.ranks:
            rows = [s for s in self.steps if s.rank == rank]
            if rows:
                out[rank] = {
                    k: sum(getattr(s, k) for s in rows) / len(rows)
                    for k in ("total", "compute", "communication", "waiting", "idle")
                }
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data (times in ns), as ``to_json`` writes it."""
        return {
            "ranks": self.ranks,
            "step_name": self.step_name,
            "per_rank": self.per_rank(),
            "steps": [asdict(s) for s in self.steps],
            "spread": [asdict(s) for s in self.spread],
            "straggler": None if self.straggler is None else asdict(self.straggler),
            "collectives": self.collectives,
            "matched": self.matched,
            "servers": self.servers,
            "dataloader": None if self.loader is None else dataloader.to_dict(self.loader),
            "unit": "ns",
        }

    def to_json(self) -> str:
        """The analysis as JSON text."""
        return json.dumps(self.to_dict(), indent=1)

    def table(self, spread_rows: int = 10, last_steps: int | None = None) -> str:
        """The analysis as text: per rank, per step and rank, spread, straggler.

        Args:
            spread_rows: rows of the spread table (the widest first).
            last_steps: per-step rows of the last N steps only (None: all).
        """
        lines: list[str] = []
        what = f"steps of {self.step_name!r}" if self.step_name else "the whole trace as one step"
        lines.append(f"Ranks: {len(self.ranks)} ({what})")
        if self.servers:
            lines.append(
                f"Servers: {', '.join(self.servers)} (no steps: each trace whole as one window)"
            )
        parts = ("compute", "communication", "waiting", "idle")
        width = max([len(r) for r in self.ranks] + [8])
        head = f"{'':{width}}  {'step':>12}" + "".join(f"  {p:>13}" for p in parts)
        lines += ["", "Mean step per rank", head]
        for rank, mean in self.per_rank().items():
            lines.append(
                f"{rank:{width}}  {format_ns(mean['total']):>12}"
                + "".join(f"  {format_ns(mean[p]):>13}" for p in parts)
            )
        rows = self.steps
        if last_steps is not None:
            keep = sorted({st.step for st in rows}, key=lambda n: (n is None, n or 0))
            kept = set(keep[len(keep) - last_steps :] if last_steps else [])
            rows = [st for st in rows if st.step in kept]
        lines += ["", "Per step and rank", f"{'step':>6}  " + head]
        for st in rows:
            lines.append(
                f"{'-' if st.step is None else st.step:>6}  {st.rank:{width}}  "
                f"{format_ns(st.total):>12}"
                + "".join(f"  {format_ns(getattr(st, p)):>13}" for p in parts)
            )
        if self.spread:
            lines += ["", "Spread across ranks (time per step)"]
            names = self.spread[:spread_rows]
            nw = max(len(s.name) for s in names)
            lines.append(
                f"{'name':{nw}}  {'min':>12}  {'median':>12}  {'max':>12}  ranks (min, max)"
            )
            for s in names:
                lines.append(
                    f"{s.name:{nw}}  {format_ns(s.min):>12}  {format_ns(s.median):>12}  "
                    f"{format_ns(s.max):>12}  {s.min_rank}, {s.max_rank}"
                )
        if self.loader is not None:
            lines += [
                "",
                *dataloader.render(self.loader, None),
            ]
        lines.append("")
        if self.straggler is None:
            lines.append("Straggler: none (no rank is the one the others wait for)")
        else:
            lines.append(f"Straggler: {self.straggler.label}")
            lines += [f"  {e}" for e in self.straggler.evidence]
        return "\n".join(lines) + "\n"


# ---- the map: one input's processes, cut down to what the analysis needs ----


Window = tuple[Union[int, None], int, int]  # (step number or None, start, end), ns


@dataclass
class _Rank:
    """A process of one input, reduced to what ``analyze`` needs of it: its
    ``trace.processes`` model without its ranges (label, identity, steps), its
    collectives whole, per window (a step, or the whole trace without steps)
    the time its other ranges cover, and their time per name over the
    windows (a few numbers a window: a part stays small)."""

    process: Process
    comm: list[tuple[Event, Collective]] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    compute: dict[int | None, list[Span]] = field(default_factory=dict)
    names: dict[tuple[str, str], int] = field(default_factory=dict)  # over every window
    empty: bool = False  # no range: only its label counts (``job``'s labels are unique)

    @property
    def label(self) -> str:
        return self.process.label

    @property
    def steps(self) -> list[Window]:
        """(number, start, end) of each step, in time order."""
        s = self.process.steps
        if s is None:
            return []
        return [(n, e.ts, e.end) for n, e in zip(s.index, s.ranges)]

    @property
    def step_name(self) -> str | None:
        s = self.process.steps
        return s.name if s is not None else None


@dataclass(frozen=True)
class RanksPart:
    """What :func:`rank_part` returns of one input: its file's name, its job
    (``distributedInfo``'s world_size, num_workers, num_servers and backend
    where it says) and its processes reduced (``_Rank``)."""

    path: str
    file: str
    job: dict[str, Any]
    ranks: list[_Rank]


def rank_part(path: str) -> RanksPart:
    """The map of ``mxprof ranks``: one input loaded and reduced to a part.

    Pure (a path in, a value out) and importable by name, so that spawned
    processes and Dask workers can run it (``mxprof.trace.engine``).
    """
    return _part(load(path), 0)


def _part(trace: Trace, i: int) -> RanksPart:
    info = trace.metadata.get("distributedInfo")
    job_info = {k: info[k] for k in JOB_KEYS if k in info} if isinstance(info, dict) else {}
    file = os.path.basename(trace.path) if trace.path else f"trace {i + 1}"
    return RanksPart(trace.path or file, file, job_info, _reduced(processes(trace)))


def _reduced(procs: Sequence[Process]) -> list[_Rank]:
    out: list[_Rank] = []
    for p in procs:
        if not p.threads:  # no range: nothing to cut into parts (kept for the labels)
            out.append(_Rank(dataclasses.replace(p, counters={}, memory=[]), empty=True))
            continue
        r = _Rank(p)
        ranges: list[Event] = []
        gpu: list[tuple[Event, Collective]] = []
        for thread in p.threads.values():
            for e in thread:
                if is_frame(e.category) or is_profiler_step(e.name):
                    continue
                c = parse(e.name, e.category, e.args)
                if c is not None:
                    (gpu if e.category == GPU_CATEGORY else r.comm).append((e, c))
                else:
                    ranges.append(e)
        if gpu:  # a CUDA call returns at its launch: its stream says how long it took
            r.comm = gpu
        r.windows = r.steps or [(None, *_extent(ranges, r.comm))]
        step_index = p.step_at
        spans: dict[int | None, list[Span]] = {n: [] for n, _, _ in r.windows}
        names: dict[tuple[str, str], int] = {}
        bounds = {n: (lo, hi) for n, lo, hi in r.windows}
        for e in ranges:
            n = step_index(e.ts)
            if n not in bounds:
                continue
            lo, hi = bounds[n]
            a, b = max(e.ts, lo), min(e.end, hi)
            if b > a:
                spans[n].append((a, b))
            key = (e.name, e.category)
            names[key] = names.get(key, 0) + (e.dur or 0)
        r.compute = {n: union(s) for n, s in spans.items()}
        r.names = names
        # What the reduce needs of the process is its identity and steps: its
        # ranges stay here (a part is sent between processes).
        r.process = dataclasses.replace(p, threads={}, counters={}, memory=[], _durations=None)
        out.append(r)
    return out


def _one_job(parts: Sequence[RanksPart]) -> None:
    """Refuse inputs that are not one job (``merge.one_job``), each input's
    ranks as the process model identified them."""
    one_job(
        [
            JobInput(
                part.path,
                part.file,
                part.job,
                [
                    (r.process.role, r.process.rank)
                    for r in part.ranks
                    if r.process.rank is not None and r.process.role
                ],
            )
            for part in parts
        ]
    )


def _index(p: _Rank) -> Callable[[int], int | None]:
    """The number of the step of p that holds an instant (None: between steps)."""
    return p.process.step_at


# ---- waiting inside collectives ----


def _waits(procs: list[_Rank]) -> tuple[dict[int, int], list[dict[str, Any]]]:
    """Each collective range's wait (by id of its Event), and per collective
    matched on >= 2 ranks: its name, the ranks' durations and the late rank."""
    instances: dict[tuple[Any, ...], list[tuple[int, Event]]] = {}
    for r, p in enumerate(procs):
        step = _index(p)
        counts: dict[tuple[Any, ...], int] = {}
        for e, c in sorted(p.comm, key=lambda ec: ec[0].ts):
            if c.p2p:
                continue
            key = (c.group, step(e.ts), e.name)
            n = counts.get(key, 0)
            counts[key] = n + 1
            instances.setdefault((*key, n), []).append((r, e))
    waits: dict[int, int] = {}
    found: list[dict[str, Any]] = []
    for key, members in instances.items():
        if len({r for r, _ in members}) < 2:
            continue
        shortest = min(e.dur or 0 for _, e in members)
        longest = max(e.dur or 0 for _, e in members)
        for _, e in members:
            waits[id(e)] = (e.dur or 0) - shortest
        late = None
        if longest - shortest >= LATE_NOISE_NS:
            late = min(members, key=lambda m: m[1].dur or 0)[0]
        found.append(
            {
                "name": key[2],
                "step": key[1],
                "late": late,
                "waits": {r: (e.dur or 0) - shortest for r, e in members},
            }
        )
    return waits, found


# ---- the analysis ----

Inputs = Union[Trace, Sequence[Trace]]


def analyze(traces: Inputs) -> RankAnalysis:
    """Per step and rank compute / communication / waiting / idle, the spread
    per range across ranks, and the straggler with its evidence.

    Args:
        traces: one merged trace (a process per rank) or one trace per rank.

    Raises:
        TypeError: an item is not a loaded Trace.
        TraceFormatError: the inputs are not one job (``reduce``).

    Example:
        >>> import mxprof
        >>> from mxprof.report.ranks import analyze
        >>> print(analyze(mxprof.load("merged.json")).table())  # doctest: +SKIP
    """
    items = [traces] if isinstance(traces, Trace) else list(traces)
    for t in items:
        if not isinstance(t, Trace):
            raise TypeError(f"analyze takes loaded Traces (mxprof.load), got {t!r}")
    result = reduce([_part(t, i) for i, t in enumerate(items)])
    # The DataLoader reads the processes' ranges, which the parts do not keep.
    result.loader = dataloader.loader(job(items))
    return result


def reduce(parts: Sequence[RanksPart]) -> RankAnalysis:
    """The analysis of inputs read apart (``rank_part`` of each, in order):
    what ``analyze`` gives of the same inputs loaded.

    Raises:
        TraceFormatError: inputs of different jobs (their ``distributedInfo``
            disagrees on the world), or one rank in two inputs.

    Example:
        >>> from mxprof.report.ranks import rank_part, reduce
        >>> result = reduce([rank_part("rank0.json"), rank_part("rank1.json")])  # doctest: +SKIP
    """
    if len(parts) > 1:
        _one_job(parts)
        labelled = in_job([[r.process for r in p.ranks] for p in parts], [p.file for p in parts])
        procs = [dataclasses.replace(r, process=q) for r, q in zip(_all(parts), labelled)]
    else:
        procs = _all(parts)
    procs = [p for p in procs if not p.empty]
    with_comm = [p for p in procs if p.comm]
    stepped = [p for p in procs if p.steps]
    workers = with_comm or stepped or procs  # ranks: processes that communicate (or step)
    chosen = {id(p) for p in workers}
    servers = [p for p in procs if id(p) not in chosen and _is_server(p)]
    procs = workers + servers
    waits, found = _waits(workers)
    steps: list[RankStep] = []
    per_step_names: list[dict[tuple[str, str], float]] = []
    for p in procs:
        step_index = _index(p)
        by_step: dict[int | None, list[tuple[Event, Collective]]] = {n: [] for n, _, _ in p.windows}
        for ec in p.comm:
            n = step_index(ec[0].ts)
            if n in by_step:
                by_step[n].append(ec)
        names: dict[tuple[str, str], float] = dict(p.names)
        for n, lo, hi in p.windows:
            comm = by_step[n]
            comp, comm_t, waiting, idle = cut(lo, hi, p.compute[n], comm, waits)
            steps.append(RankStep(n, p.label, hi - lo, comp, comm_t, waiting, idle))
            for e, _ in comm:
                names[(e.name, e.category)] = names.get((e.name, e.category), 0) + (e.dur or 0)
        per_step_names.append({k: v / len(p.windows) for k, v in names.items()})
    labels = [p.label for p in procs]
    order = {label: k for k, label in enumerate(labels)}
    steps.sort(key=lambda st: (st.step is None, st.step or 0, order[st.rank]))
    compared = labels[: len(workers)]  # the servers do other work than the ranks
    spread = _spread(compared, per_step_names[: len(workers)])
    result = RankAnalysis(
        labels,
        next((p.step_name for p in procs if p.step_name), None),
        steps,
        spread,
        None,
        _collective_summary(procs),
        len(found),
        [p.label for p in servers],
    )
    result.straggler = _straggler(result, found, compared, spread)
    return result


def _all(parts: Sequence[RanksPart]) -> list[_Rank]:
    return [r for p in parts for r in p.ranks]


def _is_server(p: _Rank) -> bool:
    """Whether a process is a parameter server: its role, from structured
    metadata (``trace.processes``)."""
    return p.process.role == "server"


def _extent(ranges: list[Event], comm: list[tuple[Event, Collective]]) -> tuple[int, int]:
    events = ranges + [e for e, _ in comm]
    return min(e.ts for e in events), max(e.end for e in events)


def _spread(labels: list[str], per: list[dict[tuple[str, str], float]]) -> list[Spread]:
    if len(labels) < 2:
        return []
    keys = set().union(*per)
    out = []
    for key in keys:
        values = [d.get(key, 0.0) for d in per]
        lo, hi = min(values), max(values)
        out.append(
            Spread(
                key[0],
                key[1],
                lo,
                statistics.median(values),
                hi,
                labels[values.index(lo)],  # ties: the first rank
                labels[values.index(hi)],
            )
        )
    out.sort(key=lambda s: (-(s.max - s.min), s.name))
    return out


def _collective_summary(procs: list[_Rank]) -> dict[str, dict[str, Any]]:
    """Per rank: per recorded name, count, bytes, op, dtype, group, total time."""
    out: dict[str, dict[str, Any]] = {}
    for p in procs:
        mine: dict[str, Any] = {}
        for e, c in p.comm:
            row = mine.get(e.name)
            if row is None:
                row = mine[e.name] = {
                    "op": c.op,
                    "dtype": c.dtype,
                    "bytes": c.bytes,
                    "group": c.group,
                    "peer": c.peer,
                    "async": c.is_async,
                    "count": 0,
                    "total_ns": 0,
                }
            row["count"] += 1
            row["total_ns"] += e.dur or 0
        out[p.label] = mine
    return out


def _straggler(
    result: RankAnalysis, found: list[dict[str, Any]], labels: list[str], spread: list[Spread]
) -> Straggler | None:
    n_ranks = len(labels)
    if n_ranks < 2:
        return None
    blame = [0.0] * n_ranks
    late = [0] * n_ranks
    judged = 0
    for inst in found:
        r = inst["late"]
        if r is None:
            continue
        judged += 1
        late[r] += 1
        others = [w for q, w in inst["waits"].items() if q != r]
        blame[r] += statistics.median(others) if others else 0.0
    total = sum(blame)
    if not judged or total <= 0:
        return None
    order = sorted(range(n_ranks), key=lambda r: -blame[r])
    top = order[0]
    runner = blame[order[1]] if n_ranks > 1 else 0.0
    mean = {k: v for k, v in result.per_rank().items() if k in labels}  # no servers
    n_steps = max(1, len({s.step for s in result.steps if s.rank in labels}))
    per_step = blame[top] / n_steps
    step_med = statistics.median(m["total"] for m in mean.values()) if result.step_name else 0
    floor = STRAGGLER_MIN_WAIT * step_med if step_med else STRAGGLER_MIN_WAIT_NS
    if blame[top] < STRAGGLER_MIN_SHARE * total or blame[top] < STRAGGLER_LEAD * runner:
        return None
    if per_step < floor:
        return None
    label = labels[top]
    own = mean.get(label, {}).get("waiting", 0.0)
    others_wait = statistics.median(
        mean[lab]["waiting"] for lab in labels if lab != label and lab in mean
    )
    evidence = [
        f"{label} arrived last at {late[top]} of {judged} collectives that had a late rank "
        f"(the next rank: {max((late[r] for r in order[1:]), default=0)})",
        f"the other ranks waited {format_ns(per_step)} per step for it "
        f"({_share(blame[top], total)} of all the waiting blamed on a late rank)",
        f"{label} waited {format_ns(own)} per step inside collectives; the median of the "
        f"others {format_ns(others_wait)}",
    ]
    notable = EVIDENCE_SHARE * step_med if step_med else STRAGGLER_MIN_WAIT_NS
    if label in mean:
        others = [mean[lab] for lab in labels if lab != label and lab in mean]
        for part in ("compute", "idle"):
            typical = statistics.median(m[part] for m in others)
            if mean[label][part] - typical >= notable:
                evidence.append(
                    f"{part} on {label}: {format_ns(mean[label][part])} per step against a "
                    f"median of {format_ns(typical)} on the others "
                    f"(+{format_ns(mean[label][part] - typical)})"
                )
    grew = [
        s for s in spread if s.max_rank == label and s.max - s.median >= notable and not _is_comm(s)
    ][:3]
    for s in grew:
        evidence.append(
            f"{s.name!r} on {label}: {format_ns(s.max)} per step against a median of "
            f"{format_ns(s.median)} (+{format_ns(s.max - s.median)})"
        )
    return Straggler(
        label,
        late[top],
        judged,
        per_step,
        own,
        others_wait,
        tuple(evidence),
        tuple(s.name for s in grew),
    )


def _is_comm(s: Spread) -> bool:
    return parse(s.name, s.category) is not None


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"
