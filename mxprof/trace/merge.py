"""Merge several Chrome traces onto one timeline.

Each input's timestamps are shifted by the difference between its
``baseTimeNanoseconds`` (the wall-clock time of its ts 0) and the earliest
input's, so events line up by wall-clock time; each input keeps its own
process tracks (pids that two inputs share are renumbered).

Inputs from a distributed job (``mxprof.distributed``) carry
``distributedInfo`` with their clock's offset estimates: their events are
moved onto the rank-0 worker's clock (``ClockModel.offset_at``; a drift is
applied only where it exceeds its error bound), their processes are named
by role, rank, host and pid, and the merged file's ``distributedInfo``
lists every process with its clock.

Times are moved in integer ns, both ends of a range: an event's start and
its end (``ts + dur``, rounded from the exact values in the file, as
``mxprof.load`` does) each go through the input's mapping, which never
decreases.  So on every thread track, ranges nested in an input stay
nested, back-to-back ranges do not overlap, and instants, counters, async
and flow events keep their order and stay inside the ranges they fell in.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._version import __version__
from ..errors import TraceFormatError
from .clock import IDENTITY, ClockModel
from .gpu import align_inputs
from .model import base_time_ns, ns_ratio, round_ratio
from .reader import read_raw
from .writer import encode, file_format

_ROLE_ORDER = {"worker": 0, "server": 1}


def _distributed(path: str, meta: dict[str, Any]) -> tuple[dict[str, Any], ClockModel] | None:
    """An input's distributedInfo and clock model (None: not from a distributed job)."""
    info = meta.get("distributedInfo")
    if not isinstance(info, dict):
        return None
    try:
        clock = ClockModel.from_json(info.get("clock", {"estimates": []}))
    except ValueError as e:
        raise TraceFormatError(f"{path}: bad distributedInfo.clock: {e}") from None
    return info, clock


def _process_label(info: dict[str, Any], pid: Any) -> str:
    return f"{info.get('role')} {info.get('rank')} ({info.get('host')}, pid {pid})"


def _fresh_pid(pid: Any, used: set[Any]) -> Any:
    """pid itself, or the next integer no input uses yet."""
    if pid not in used:
        return pid
    candidate = max([p for p in used if isinstance(p, int)], default=0) + 1
    while candidate in used:
        candidate += 1
    return candidate


@dataclass(frozen=True)
class _Move:
    """One input's time mapping: ns on its own axis to ns on the merged one."""

    base: int | None  # the input's ts 0 on its wall clock; None: taken as it is
    clock: ClockModel  # its wall clock to the reference clock
    ref: int  # the merged file's ts 0 on the reference clock

    def __call__(self, t_ns: int) -> int:
        if self.base is None:
            return t_ns
        wall = self.base + t_ns
        return wall + self.clock.offset_at(wall) - self.ref


def _moved(event: dict[str, Any], move: _Move) -> dict[str, Any]:
    """A copy of event with its start and, if it has a length, its end moved."""
    out = dict(event)
    ts = ns_ratio(event.get("ts"))
    if ts is None or event.get("ph") == "M":
        return out
    start = move(round_ratio(*ts))
    out["ts"] = start / 1000
    length = ns_ratio(event["dur"]) if "dur" in event else None
    if length is not None:
        end = round_ratio(ts[0] * length[1] + length[0] * ts[1], ts[1] * length[1])
        out["dur"] = (move(end) - start) / 1000
    return out


def merge(
    paths: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    sources: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Write one trace holding every input's events, aligned by wall clock.

    Inputs without a base time are taken as they are (their ts axis is
    assumed to be the earliest input's).

    Args:
        paths: the traces to merge (any form ``mxprof.load`` reads).
        output: the merged file, in the format its suffix names (as for
            ``set_config(filename=...)``): ``.json`` (object form, like
            mxprof's own), ``.json.gz`` (gzip-compressed), ``.pftrace`` or
            ``.perfetto-trace`` (Perfetto protobuf: ranges, instants,
            counters and names; the JSON metadata has no place there).
        sources: what the merged file's ``otherData.merged_from`` names for
            each input, in order (default: the paths as given).
            ``distributed.collect`` merges temporary copies and passes each
            process's label and file name instead.

    Returns:
        A summary: ``{"events": n, "inputs": [{"path", "pids", "shift_us",
        "truncated"}, ...]}``.

    Raises:
        TraceFormatError: fewer than one input, or an input is not a trace.
        ValueError: sources does not name every input.

    Example:
        >>> merge(["worker.json", "server.json"], "job.json")  # doctest: +SKIP
    """
    if not paths:
        raise TraceFormatError("merge: no input traces")
    if sources is not None and len(sources) != len(paths):
        raise ValueError(f"merge: {len(sources)} sources named for {len(paths)} inputs")
    inputs = [(os.fspath(p), *read_raw(p)) for p in paths]
    inputs = align_inputs(inputs)  # NVIDIA-IMPORT HOOK: databases onto an mxprof trace's clock
    dist = [_distributed(path, meta) for path, _, meta, _ in inputs]
    bases = [base_time_ns(meta) for _, _, meta, _ in inputs]
    clocks = [d[1] if d is not None else IDENTITY for d in dist]
    # Each base on the reference clock: the rank-0 worker's for distributed inputs.
    corrected = [None if b is None else b + c.offset_at(b) for b, c in zip(bases, clocks)]
    known = [b for b in corrected if b is not None]
    ref = min(known) if known else 0
    used: set[Any] = set()
    merged: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    for (path, events, _meta, truncated), base, clock, d in zip(inputs, bases, clocks, dist):
        move = _Move(base, clock, ref)
        pids: dict[Any, Any] = {}
        named: set[Any] = set()
        for ev in events:
            pid = ev.get("pid")
            if pid not in pids:
                pids[pid] = _fresh_pid(pid, used)
                used.add(pids[pid])
            out = _moved(ev, move)
            out["pid"] = pids[pid]
            if out.get("ph") == "M" and out.get("name") == "process_name":
                named.add(pid)
                args = dict(out.get("args") or {})
                if d is not None:
                    args["name"] = _process_label(d[0], pid)
                else:
                    args["name"] = f"{args.get('name', pid)} [{os.path.basename(path)}]"
                out["args"] = args
            merged.append(out)
        for pid in pids:
            if pid not in named:
                label = (
                    _process_label(d[0], pid)
                    if d is not None
                    else f"{os.path.basename(path)} (pid {pid})"
                )
                merged.append(
                    {
                        "name": "process_name",
                        "ph": "M",
                        "pid": pids[pid],
                        "tid": 0,
                        "args": {"name": label},
                    }
                )
        if d is not None:
            info = d[0]
            order = _ROLE_ORDER.get(str(info.get("role")), 2) * 100000 + int(info.get("rank") or 0)
            for pid in pids.values():
                merged.append(
                    {
                        "name": "process_sort_index",
                        "ph": "M",
                        "pid": pid,
                        "tid": 0,
                        "args": {"sort_index": order},
                    }
                )
            ranks.append(
                {k: info.get(k) for k in ("role", "rank", "host", "pid") if k in info}
                # The clock as this merge applied it, derived again from the estimates.
                | {"clock": d[1].to_json(), "file": os.path.basename(path)}
            )
        summary.append(
            {
                "path": path,
                "pids": sorted(map(str, pids.values())),
                "shift_us": move(0) / 1000,
                "truncated": truncated,
                "clock": d[1].to_json() if d is not None else None,
            }
        )
    doc: dict[str, Any] = {
        "traceEvents": merged,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": ref,
    }
    if ranks:
        first = next(d[0] for d in dist if d is not None)
        doc["distributedInfo"] = {
            "world_size": first.get("world_size"),
            "num_workers": first.get("num_workers"),
            "num_servers": first.get("num_servers"),
            "backend": first.get("backend"),
            "ranks": sorted(
                ranks, key=lambda r: (_ROLE_ORDER.get(str(r.get("role")), 2), r.get("rank"))
            ),
        }
    doc["otherData"] = {
        "mxprof_version": __version__,
        "merged_from": list(sources) if sources is not None else [s["path"] for s in summary],
    }
    payload = encode(doc, file_format(output))
    with open(output, "wb") as f:
        f.write(payload)
    return {"events": len(merged), "inputs": summary}
