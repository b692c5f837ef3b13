"""torch's DataLoader read back: batches, the waits for them, per step and worker.

``mxprof.integrations.torch.instrument_dataloader`` records, in domain
``dataloader``: in each worker process a ``DataLoader batch`` range per
batch (``DataLoader getitem`` and ``DataLoader collate`` inside it) with
the counters ``DataLoader batch index`` and ``DataLoader worker`` sampled
at its start; in the main process a ``DataLoader wait`` range around each
``next()`` with ``DataLoader wait index``, and ``DataLoader pin`` ranges
(with ``DataLoader pin index``) on the pin-memory thread.  A counter
sample inside a range gives that range its number (a range carries no
arguments in the core).

This module pairs each wait with the batch it waited for (same number;
numbers restart every epoch, so the latest batch of that number that began
before the wait ended), gives ``merge`` the flow arrows between them, and
measures per step of the waiting process: its data wait, and each worker's
busy and idle time in the step's window (from the end of the step before
to the end of this one, so that the wait before a step counts for it).
It reads the one model of processes and steps (``trace.processes``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._render import format_ns
from .model import Event
from .processes import Id, Process, counter_value

DOMAIN = "dataloader"
BATCH, GETITEM, COLLATE, PIN, WAIT = (
    "DataLoader batch",
    "DataLoader getitem",
    "DataLoader collate",
    "DataLoader pin",
    "DataLoader wait",
)
BATCH_INDEX, WORKER, WAIT_INDEX, PIN_INDEX = (
    "DataLoader batch index",
    "DataLoader worker",
    "DataLoader wait index",
    "DataLoader pin index",
)
FLOW_NAME = "DataLoader batch"  # the flow events' name and (with DOMAIN) category


@dataclass
class Batch:
    """One batch as its worker made it; times in ns on the trace's axis."""

    index: int
    worker: int  # the loader's worker id (-1: not recorded)
    proc: Process
    tid: Id
    ts: int
    end: int
    getitem: int = 0  # ns in getitem ranges inside it
    samples: int = 0  # getitem ranges inside it
    collate: int = 0
    pin: int = 0  # ns in the main process's pin range for it (0: none)


@dataclass
class Wait:
    """One ``next()`` of the main process on the loader's iterator."""

    index: int
    proc: Process
    tid: Id
    ts: int
    end: int
    batch: Batch | None = None  # the batch it returned (None: unmatched, or end of epoch)


@dataclass
class StepLoad:
    """One step of the waiting process: its data wait and each worker's busy time."""

    number: int
    # From the end of the step before to this one's end (the first step's:
    # from the first wait for it, else its start).
    window: tuple[int, int]
    wait: int  # ns in DataLoader waits assigned to this step
    busy: dict[int, int] = field(default_factory=dict)  # worker id -> ns producing batches
    # worker id -> ns of the wait spent on that worker's batch (-1: no batch joined)
    waited_for: dict[int, int] = field(default_factory=dict)

    def idle(self, worker: int) -> int:
        """ns the worker spent not producing in this step's window."""
        return max(0, self.window[1] - self.window[0] - self.busy.get(worker, 0))


@dataclass
class Loader:
    """What a job's DataLoader did: its waits, batches, workers and steps."""

    main: Process
    waits: list[Wait]
    batches: list[Batch]
    workers: dict[int, Process]  # worker id -> its process
    steps: list[StepLoad]

    @property
    def wait_ns(self) -> int:
        """Total ns the main process waited."""
        return sum(w.end - w.ts for w in self.waits)


def _numbered(ranges: list[tuple[int, int]], samples: Sequence[Event]) -> list[int | None]:
    """The value of the first counter sample inside each range (None: none)."""
    times = [s.ts for s in samples]
    out: list[int | None] = []
    for ts, end in ranges:
        k = bisect.bisect_left(times, ts)
        value = counter_value(samples[k]) if k < len(samples) and times[k] <= end else None
        out.append(None if value is None else int(value))
    return out


def _ranges(p: Process, name: str) -> list[tuple[Id, int, int, list[tuple[str, int]]]]:
    """(tid, ts, end, direct-and-deeper named children) of p's ranges of name in DOMAIN."""
    found: list[tuple[Id, int, int, list[tuple[str, int]]]] = []
    for tid, ranges in p.threads.items():
        thread = ranges.thread
        names, categories = thread.keys.names, thread.keys.categories
        keys = {k for k in range(len(names)) if names[k] == name and categories[k] == DOMAIN}
        if not keys:
            continue
        inner = {
            k: names[k]
            for k in range(len(names))
            if categories[k] == DOMAIN and names[k] in (GETITEM, COLLATE)
        }
        current: list[tuple[str, int]] | None = None
        cur_end = -1
        for _, ts, d, k in thread.range_columns():
            if k in keys:
                current = []
                cur_end = ts + d
                found.append((tid, ts, ts + d, current))
            elif current is not None and k in inner and ts < cur_end:
                current.append((inner[k], d))
    found.sort(key=lambda r: r[1])
    return found


def loader(procs: Sequence[Process]) -> Loader | None:
    """The DataLoader of a job, None when no process waited on an instrumented one.

    The waiting process is the one with the most wait time; every process
    with batch ranges is a worker (by its ``DataLoader worker`` counter).
    """
    best: tuple[int, Process, list[Wait]] | None = None
    batches: list[Batch] = []
    workers: dict[int, Process] = {}
    pins: list[tuple[int, int, int]] = []  # (index, ts, dur)
    for p in procs:
        waits_raw = _ranges(p, WAIT)
        if waits_raw:
            nums = _numbered(
                [(r[1], r[2]) for r in waits_raw], p.counters.get((DOMAIN, WAIT_INDEX), [])
            )
            waits = [
                Wait(-1 if n is None else n, p, tid, ts, end)
                for (tid, ts, end, _), n in zip(waits_raw, nums)
            ]
            total = sum(w.end - w.ts for w in waits)
            if best is None or total > best[0]:
                best = (total, p, waits)
        pin_raw = _ranges(p, PIN)
        if pin_raw:
            nums = _numbered(
                [(r[1], r[2]) for r in pin_raw], p.counters.get((DOMAIN, PIN_INDEX), [])
            )
            pins += [(n, r[1], r[2] - r[1]) for r, n in zip(pin_raw, nums) if n is not None]
        made = _ranges(p, BATCH)
        if not made:
            continue
        spans = [(r[1], r[2]) for r in made]
        nums = _numbered(spans, p.counters.get((DOMAIN, BATCH_INDEX), []))
        ids = _numbered(spans, p.counters.get((DOMAIN, WORKER), []))
        for (tid, ts, end, inner), n, w in zip(made, nums, ids):
            b = Batch(-1 if n is None else n, -1 if w is None else w, p, tid, ts, end)
            for name, d in inner:
                if name == GETITEM:
                    b.getitem += d
                    b.samples += 1
                else:
                    b.collate += d
            batches.append(b)
            if b.worker >= 0:
                workers.setdefault(b.worker, p)
    if best is None:
        return None
    _, main, waits = best
    batches = [b for b in batches if b.proc is not main or b.worker >= 0 or not workers]
    batches.sort(key=lambda b: b.ts)
    _pair(waits, batches)
    _pin(pins, waits)
    return Loader(main, waits, batches, workers, _steps(main, waits, batches))


def _pair(waits: list[Wait], batches: list[Batch]) -> None:
    """Each wait's batch: same number, the latest begun before the wait ended."""
    by_index: dict[int, list[Batch]] = {}
    for b in batches:  # in ts order
        by_index.setdefault(b.index, []).append(b)
    for w in waits:
        candidates = by_index.get(w.index)
        if not candidates or w.index < 0:
            continue
        starts = [b.ts for b in candidates]
        k = bisect.bisect_left(starts, w.end) - 1
        if k >= 0:
            w.batch = candidates[k]


def _pin(pins: list[tuple[int, int, int]], waits: list[Wait]) -> None:
    """Give each waited-for batch its pin range's time (same number, before the wait ended)."""
    by_index: dict[int, list[tuple[int, int]]] = {}
    for n, ts, d in sorted(pins, key=lambda x: x[1]):
        by_index.setdefault(n, []).append((ts, d))
    for w in waits:
        if w.batch is None or w.index not in by_index:
            continue
        found = by_index[w.index]
        k = bisect.bisect_left([ts for ts, _ in found], w.end) - 1
        if k >= 0:
            w.batch.pin = found[k][1]


def _steps(main: Process, waits: list[Wait], batches: list[Batch]) -> list[StepLoad]:
    """Per step of the waiting process: data wait and each worker's busy ns."""
    s = main.steps
    if s is None:
        return []
    out: list[StepLoad] = []
    prev_end: int | None = None
    for k, e in enumerate(s.ranges):
        lo = e.ts if prev_end is None else min(prev_end, e.ts)
        out.append(StepLoad(s.index[k], (lo, e.end), 0))
        prev_end = e.end
    ends = [st.window[1] for st in out]
    for w in waits:
        k = bisect.bisect_left(ends, w.end)  # the first step ending at or after the wait
        if k < len(out):
            out[k].wait += w.end - w.ts
            who = w.batch.worker if w.batch is not None else -1
            out[k].waited_for[who] = out[k].waited_for.get(who, 0) + w.end - w.ts
            if k == 0 and w.ts < out[0].window[0]:  # the wait before the first step
                out[0].window = (w.ts, out[0].window[1])
    for b in batches:
        if b.worker < 0:
            continue
        k = max(0, bisect.bisect_right(ends, b.ts) - 1)
        for st in out[k:]:
            lo, hi = st.window
            if lo >= b.end:
                break
            both = min(hi, b.end) - max(lo, b.ts)
            if both > 0:
                st.busy[b.worker] = st.busy.get(b.worker, 0) + both
    return out


class FlowCollector:
    """Sees a merge's events as written and makes the flow arrows from each
    batch's range to the wait that returned it (Chrome JSON ``s``/``f``).

    ``see`` takes events after merge moved them (ts in µs on the merged
    clock, pids renumbered); only ``dataloader`` events are kept.
    """

    def __init__(self) -> None:
        self.ranges: dict[tuple[Any, str], list[tuple[float, float, Any]]] = {}
        self.counters: dict[tuple[Any, str], list[tuple[float, Any]]] = {}

    def see(self, events: Iterable[dict[str, Any]]) -> None:
        """Keep the dataloader ranges and counter samples among events."""
        # A comprehension first: most of a merge's events are not the loader's.
        for e in [e for e in events if e.get("cat") == DOMAIN]:
            ph, name, pid = e.get("ph"), e.get("name"), e.get("pid")
            ts = e.get("ts")
            if not isinstance(ts, (int, float)) or not isinstance(name, str):
                continue
            if ph == "X" and name in (BATCH, WAIT, GETITEM, COLLATE):
                dur = e.get("dur")
                if isinstance(dur, (int, float)):
                    self.ranges.setdefault((pid, name), []).append((ts, ts + dur, e.get("tid")))
            elif ph == "C" and name in (BATCH_INDEX, WAIT_INDEX):
                args = e.get("args")
                value = args.get(name) if isinstance(args, dict) else None
                if isinstance(value, int) and not isinstance(value, bool):
                    self.counters.setdefault((pid, name), []).append((ts, value))

    def _numbered(self, pid: Any, name: str, counter: str) -> list[tuple[int, float, float, Any]]:
        ranges = sorted(self.ranges.get((pid, name), []))
        samples = sorted(self.counters.get((pid, counter), []))
        times = [t for t, _ in samples]
        out = []
        for ts, end, tid in ranges:
            k = bisect.bisect_left(times, ts)
            if k < len(samples) and times[k] <= end:
                out.append((samples[k][1], ts, end, tid))
        return out

    def flows(self) -> list[dict[str, Any]]:
        """One ``s`` (inside the batch range, before its first sample) and one
        ``f`` (``bp: e``, inside the wait, near its end) per paired wait."""
        pids = {pid for pid, _ in self.ranges}
        batches: dict[int, list[tuple[float, float, Any, Any]]] = {}
        for pid in pids:
            inner = sorted(
                t for n in (GETITEM, COLLATE) for t, _, _ in self.ranges.get((pid, n), [])
            )
            for n, ts, end, tid in self._numbered(pid, BATCH, BATCH_INDEX):
                # Before the first child range starts, so Perfetto binds to the batch itself.
                k = bisect.bisect_right(inner, ts)
                first = inner[k] if k < len(inner) and inner[k] < end else end
                batches.setdefault(n, []).append(((ts + first) / 2, ts, pid, tid))
        for found in batches.values():
            found.sort()
        out: list[dict[str, Any]] = []
        flow_id = 0
        for pid in sorted(pids, key=str):
            for n, ts, end, tid in self._numbered(pid, WAIT, WAIT_INDEX):
                made = batches.get(n)
                if not made:
                    continue
                k = bisect.bisect_left([b[1] for b in made], end) - 1
                if k < 0 or made[k][2] == pid:
                    continue  # none begun before the wait ended; in the waiter itself
                at, _, bpid, btid = made[k]
                flow_id += 1
                head = {"name": FLOW_NAME, "cat": DOMAIN, "id": flow_id}
                out.append({**head, "ph": "s", "ts": at, "pid": bpid, "tid": btid})
                into = end - min((end - ts) / 2, 0.001)
                out.append({**head, "ph": "f", "bp": "e", "ts": into, "pid": pid, "tid": tid})
        return out


def to_dict(ld: Loader) -> dict[str, Any]:
    """The loader as plain data (ns): totals, per worker, per step.

    Example: ``to_dict(loader(job([trace])))["steps"][0]["wait"]``.
    """
    workers = sorted(ld.workers)
    return {
        "main": ld.main.label,
        "workers": {str(w): ld.workers[w].label for w in workers},
        "waits": len(ld.waits),
        "wait": ld.wait_ns,
        "batches": len(ld.batches),
        "paired": sum(1 for w in ld.waits if w.batch is not None),
        "steps": [
            {
                "step": s.number,
                "window": s.window[1] - s.window[0],
                "wait": s.wait,
                "waited_for": {str(w): ns for w, ns in sorted(s.waited_for.items())},
                "busy": {str(w): s.busy.get(w, 0) for w in workers},
                "idle": {str(w): s.idle(w) for w in workers},
            }
            for s in ld.steps
        ],
        "unit": "ns",
    }


def render(ld: Loader, rows: int | None = 20) -> list[str]:
    """The loader as text lines: a summary, then data wait and each worker's
    busy/idle per step (the first ``rows`` steps; None: all), for ``mxprof
    stats`` and ``mxprof ranks``."""
    workers = sorted(ld.workers)
    paired = sum(1 for w in ld.waits if w.batch is not None)
    names = ", ".join(f"{w}: {ld.workers[w].label}" for w in workers) or "none recorded"
    lines = [
        f"DataLoader: {ld.main.label} waited {format_ns(ld.wait_ns)} in {len(ld.waits)} "
        f"waits; {len(ld.batches)} batches, {paired} joined to their wait; workers {names}"
    ]
    if not ld.steps:
        return lines
    head = f"{'step':>6}  {'data wait':>11}" + "".join(
        f"  {f'w{w} busy':>10}  {f'w{w} idle':>10}" for w in workers
    )
    lines.append(head)
    shown = ld.steps if rows is None else ld.steps[:rows]
    for s in shown:
        lines.append(
            f"{s.number:>6}  {format_ns(s.wait):>11}"
            + "".join(
                f"  {format_ns(s.busy.get(w, 0)):>10}  {format_ns(s.idle(w)):>10}" for w in workers
            )
        )
    if len(shown) < len(ld.steps):
        lines.append(f"... and {len(ld.steps) - len(shown)} more steps")
    return lines
