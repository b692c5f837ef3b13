"""The DataLoader stage rule (``dataloader-stage``): which stage of torch's
DataLoader the steps wait for, with the numbers and what to change.

It reads what ``mxprof.integrations.torch.instrument_dataloader`` recorded,
through ``trace.dataloader`` (batches paired to the waits for them, per step
and worker).  It fires when the waiting process's ``DataLoader wait``
ranges cover ``LOADING_SHARE`` of its step time (the input rule's
threshold, ``loading``: the same "the loop waits for its input"), high
from ``LOADING_SHARE_HIGH``; then it names the stage:

- the workers are busy ``SATURATED`` (80 %) of the time the loop waits
  (each worker from its first batch to its last: one still starting is not
  idle): they are the bottleneck, and the slow stage is the larger of getitem and collate in a
  batch's production (per worker; the slowest worker is named).  Where
  ``num_workers`` workers make a batch less often than a step takes one,
  *too few workers* is said with the number that would keep up
  (``ceil(batch time / step compute time)``);
- else, where the main process's pin-memory time per batch exceeds a
  step's compute time, *pin* (one thread pins every batch);
- else the workers sit idle while the loop waits: *prefetch too small*
  (the batches in flight per worker do not cover the loop's pace).
"""

from __future__ import annotations

import math
import statistics

from ..._render import format_ns
from ...trace.dataloader import Batch, Loader, Wait, loader
from ._common import Hint, Job, hint, measure, overlap, pct, union
from .loading import LOADING_SHARE, LOADING_SHARE_HIGH

SATURATED = 0.80  # the workers' busy share of the waits: past it they are the bottleneck


def _median(values: list[int]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _span(ld: Loader) -> tuple[int, int, str]:
    """The waiting process's step span (else from its first wait to its last)."""
    if ld.main.steps is not None:
        lo, hi = ld.main.steps.span
        return lo, hi, "step time"
    return ld.waits[0].ts, ld.waits[-1].end, "the time from the first wait to the last"


def _busy_while_waited(waits: list[Wait], per: dict[int, list[Batch]]) -> float:
    """The workers' busy share of the loop's waits, each worker counted from
    its first batch to its last (a worker still starting is not idle)."""
    waited = union(sorted((w.ts, w.end) for w in waits))
    busy = alive = 0
    for bs in per.values():
        window = [(bs[0].ts, max(b.end for b in bs))]
        mine = [(max(a, window[0][0]), min(b, window[0][1])) for a, b in waited]
        mine = [(a, b) for a, b in mine if b > a]
        alive += measure(mine)
        busy += overlap(union((b.ts, b.end) for b in bs), mine)
    return busy / alive if alive else 0.0


def dataloader_stage(job: Job) -> Hint | None:
    """The steps wait on the DataLoader: name its slow stage (module docstring)."""
    ld = loader(job.procs)
    if ld is None or not ld.waits:
        return None
    lo, hi, basis = _span(ld)
    if hi <= lo:
        return None
    inside = [w for w in ld.waits if w.end > lo and w.ts < hi]
    waited = sum(min(w.end, hi) - max(w.ts, lo) for w in inside)
    share = waited / (hi - lo)
    if share < LOADING_SHARE:
        return None
    made = [b for b in ld.batches if b.worker >= 0 and b.end > lo and b.ts < hi]
    n_workers = len(ld.workers)
    main = ld.main
    step_ns = _median(main.steps.durations) if main.steps is not None else 0.0
    evidence = [
        f"{main.label}: DataLoader waits cover {format_ns(waited)} of {format_ns(hi - lo)} "
        f"{basis} ({pct(share)}) over {len(inside)} waits"
        + (f"; a step computes for {format_ns(step_ns)} (median)" if step_ns else "")
    ]
    subjects = ["DataLoader wait", main.label]
    if not made:
        evidence.append(
            "no worker batches in the trace: num_workers=0, or worker processes not "
            "profiled (set_config(follow_children=True)) or not merged into this file"
        )
        return hint(
            "dataloader-stage",
            "high" if share >= LOADING_SHARE_HIGH else "medium",
            f"Steps wait on data {pct(share)} of {basis}; the batches' stages are not in the trace",
            evidence,
            "Profile the workers too (follow_children=True, then mxprof merge the "
            "files) so that the slow stage can be named; with num_workers=0 every "
            "batch is made inside the wait: use num_workers > 0.",
            subjects,
        )
    per: dict[int, list[Batch]] = {}
    for b in made:
        per.setdefault(b.worker, []).append(b)
    saturation = _busy_while_waited(inside, per)
    batch_ns = _median([b.end - b.ts for b in made])
    rows: list[tuple[float, int, str, float, float, float]] = []
    for w, bs in sorted(per.items()):
        total = sum(b.end - b.ts for b in bs)
        getitem = sum(b.getitem for b in bs) / total if total else 0.0
        collate = sum(b.collate for b in bs) / total if total else 0.0
        samples = sum(b.samples for b in bs)
        per_sample = sum(b.getitem for b in bs) / samples if samples else 0.0
        rows.append((total / len(bs), w, ld.workers[w].label, getitem, collate, per_sample))
        w_busy = sum(min(b.end, hi) - max(b.ts, lo) for b in bs)
        evidence.append(
            f"worker {w} ({ld.workers[w].label}): {len(bs)} batches, "
            f"{format_ns(total / len(bs))} per batch: getitem {pct(getitem)} "
            f"({format_ns(per_sample)} per sample), collate {pct(collate)}; "
            f"busy {pct(w_busy / (hi - lo))} of {basis}"
        )
    slowest = max(rows)
    mean_ns, w, label, getitem, collate, per_sample = slowest
    pins = [b.pin for b in ld.batches if b.pin]
    pin_ns = _median(pins)
    if pins:
        evidence.append(f"pin memory: {format_ns(pin_ns)} per batch (median, main process)")
    needed = math.ceil(batch_ns / step_ns) if step_ns else n_workers + 1
    subjects += [f"worker {w}", label]
    if saturation >= SATURATED:
        stage = "getitem" if getitem >= collate else "collate"
        stage_share = getitem if stage == "getitem" else collate
        title = (
            f"Steps wait on data {pct(share)} of {basis}: the slow stage is {stage} "
            f"({pct(stage_share)} of worker {w}'s {format_ns(mean_ns)} per batch)"
        )
        fix = (
            f"make Dataset.__getitem__ faster ({format_ns(per_sample)} per sample: cache, "
            "pre-decode or move work to the GPU)"
            if stage == "getitem"
            else "make collate_fn cheaper (pre-stack samples, avoid Python loops over fields)"
        )
        if needed > n_workers:
            title += f"; too few workers ({n_workers} for {needed})"
            fix += (
                f", or raise num_workers from {n_workers} to {needed}: a batch takes "
                f"{format_ns(batch_ns)} and a step {format_ns(step_ns)}, so {needed} "
                "workers keep up where there are cores for them"
            )
        evidence.append(
            f"the workers are busy {pct(saturation)} of the time the loop waits "
            f"(>= {pct(SATURATED)}): they are the bottleneck"
        )
        subjects.append(f"DataLoader {stage}")
    elif pins and step_ns and pin_ns > step_ns:
        stage = "pin"
        title = (
            f"Steps wait on data {pct(share)} of {basis}: pinning memory takes "
            f"{format_ns(pin_ns)} per batch, more than a step's {format_ns(step_ns)}"
        )
        fix = (
            "one thread pins every batch: pin in the workers' collate_fn (return pinned "
            "tensors), send smaller batches, or copy without pinning"
        )
        subjects.append("DataLoader pin")
    else:
        stage = "prefetch"
        title = (
            f"Steps wait on data {pct(share)} of {basis} while the workers are busy only "
            f"{pct(saturation)} of the wait: prefetch too small"
        )
        fix = (
            "the workers sit idle while the loop waits: raise prefetch_factor (batches "
            "in flight per worker), keep workers alive between epochs "
            "(persistent_workers=True) so each epoch does not start empty"
        )
    return hint(
        "dataloader-stage",
        "high" if share >= LOADING_SHARE_HIGH else "medium",
        title,
        evidence,
        f"{fix[0].upper()}{fix[1:]}; a new profile should show the DataLoader wait shrink "
        f"(stage: {stage}).",
        subjects,
    )
