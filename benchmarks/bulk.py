"""Bulk: write N recorded events as Chrome JSON, and compute dumps() over them."""

from __future__ import annotations

import os
import tempfile
import time

import mxprof
from mxprof import _testing
from mxprof._native import lib


def measure(events: int) -> dict[str, float]:
    """Record events ranges (one event each), then time dump() and dumps()."""
    path = os.path.join(tempfile.mkdtemp(prefix="mxprof-bench-"), "bulk.json")
    _testing.reset()
    mxprof.set_config(
        filename=path,
        aggregate_stats=True,
        continuous_dump=False,
        profile_api=False,
        max_events=0,
    )
    tasks = [mxprof.Domain("bulk").new_task(f"task{i}") for i in range(16)]
    ids = [t._id for t in tasks]
    begin, end = lib.mxp_range_begin, lib.mxp_range_end
    mxprof.set_state("run")
    t0 = time.perf_counter()
    for i in range(events):
        rid = ids[i & 15]
        begin(rid)
        end(rid)
    record_s = time.perf_counter() - t0
    mxprof.set_state("stop")
    t0 = time.perf_counter()
    mxprof.dump()
    write_s = time.perf_counter() - t0
    size = os.path.getsize(path)
    t0 = time.perf_counter()
    table = mxprof.dumps()
    dumps_s = time.perf_counter() - t0
    assert "task15" in table
    os.remove(path)
    _testing.reset()
    return {
        "events": events,
        "record_s": record_s,
        "write_s": write_s,
        "file_bytes": size,
        "write_events_per_s": events / write_s,
        "dumps_s": dumps_s,
    }
