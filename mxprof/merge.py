"""Merge several Chrome traces onto one timeline.

Each input's timestamps are shifted by the difference between its
``baseTimeNanoseconds`` (the wall-clock time of its ts 0) and the earliest
input's, so events line up by wall-clock time; each input keeps its own
process tracks (pids that two inputs share are renumbered).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from ._version import __version__
from .errors import TraceFormatError
from .trace import base_time_ns, read_raw


def _fresh_pid(pid: Any, used: set[Any]) -> Any:
    """pid itself, or the next integer no input uses yet."""
    if pid not in used:
        return pid
    candidate = max([p for p in used if isinstance(p, int)], default=0) + 1
    while candidate in used:
        candidate += 1
    return candidate


def merge(
    paths: Sequence[str | os.PathLike[str]], output: str | os.PathLike[str]
) -> dict[str, Any]:
    """Write one trace holding every input's events, aligned by wall clock.

    Inputs without a base time are taken as they are (their ts axis is
    assumed to be the earliest input's).

    Args:
        paths: the traces to merge (any form ``mxprof.load`` reads).
        output: the merged file (object form, like mxprof's own).

    Returns:
        A summary: ``{"events": n, "inputs": [{"path", "pids", "shift_us",
        "truncated"}, ...]}``.

    Raises:
        TraceFormatError: fewer than one input, or an input is not a trace.

    Example:
        >>> merge(["worker.json", "server.json"], "job.json")  # doctest: +SKIP
    """
    if not paths:
        raise TraceFormatError("merge: no input traces")
    inputs = [(os.fspath(p), *read_raw(p)) for p in paths]
    bases = [base_time_ns(meta) for _, _, meta, _ in inputs]
    known = [b for b in bases if b is not None]
    ref = min(known) if known else 0
    used: set[Any] = set()
    merged: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    for (path, events, _meta, truncated), base in zip(inputs, bases):
        shift_us = (base - ref) / 1000 if base is not None else 0.0
        pids: dict[Any, Any] = {}
        named: set[Any] = set()
        for ev in events:
            pid = ev.get("pid")
            if pid not in pids:
                pids[pid] = _fresh_pid(pid, used)
                used.add(pids[pid])
            out = dict(ev)
            out["pid"] = pids[pid]
            if "ts" in out and isinstance(out["ts"], (int, float)) and out.get("ph") != "M":
                out["ts"] = round(out["ts"] + shift_us, 3)
            if out.get("ph") == "M" and out.get("name") == "process_name":
                named.add(pid)
                args = dict(out.get("args") or {})
                args["name"] = f"{args.get('name', pid)} [{os.path.basename(path)}]"
                out["args"] = args
            merged.append(out)
        for pid in pids:
            if pid not in named:
                merged.append(
                    {
                        "name": "process_name",
                        "ph": "M",
                        "pid": pids[pid],
                        "tid": 0,
                        "args": {"name": f"{os.path.basename(path)} (pid {pid})"},
                    }
                )
        summary.append(
            {
                "path": path,
                "pids": sorted(map(str, pids.values())),
                "shift_us": shift_us,
                "truncated": truncated,
            }
        )
    doc = {
        "traceEvents": merged,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": ref,
        "otherData": {"mxprof_version": __version__, "merged_from": [s["path"] for s in summary]},
    }
    with open(os.fspath(output), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    return {"events": len(merged), "inputs": summary}
