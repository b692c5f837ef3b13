"""Write the fixture perfetto_v1.pftrace (one scenario recorded on a frozen
clock) and perfetto_v1.expected.json: what the reader of the same commit
loaded from it (``mxprof.load``: events, thread and process names).

The .pftrace was written by the core's first Perfetto encoding (one packet
sequence per file, absolute MONOTONIC timestamps with a clock_id on every
packet, an explicit track_uuid on every event), as of commit a5fabf3, by

    PYTHONPATH=/work/main python tests/data/make_perfetto_v1.py tests/data

The reader must keep reading such files: tests/test_perfetto.py loads the
.pftrace and compares with the expected events.  Rerunning this with a later
core writes the current encoding instead, so the committed files are kept.
"""

import json
import os
import sys
import threading

import mxprof
from mxprof import _testing, memory

MS = 1_000_000


def body(clock):
    d = mxprof.Domain("fx")
    outer, inner, item = d.new_task("outer"), d.new_task("inner"), d.new_task("item")
    step, ev = d.new_frame("step"), mxprof.Event("ev")
    ctr, mk = d.new_counter("ctr"), d.new_marker("mk")
    left_open = d.new_task("left open")
    with outer:
        clock(MS)
        with inner:
            clock(2 * MS)
            ctr.set_value(5)
        for _ in range(2):
            with step:
                clock(700_000)
        ev.start()
        clock(300_000)
        ev.stop()
        for scope in ("global", "process", "thread", "task", "marker"):
            mk.mark(scope)
            clock(10_000)
        ctr.increment(3)
        with mxprof.scope("enc"):
            w = memory.record_alloc(4096, "gpu:0", tag="w")
            clock(10_000)
        memory.record_free(w)
        item.start()
        clock(MS)

        def worker():
            with outer:
                clock(250_000)
                with inner:
                    clock(1_500_000)
                mk.mark("thread")
            item.stop()  # ended on another thread: an async range

        t = threading.Thread(target=worker, name="worker")
        t.start()
        t.join(10)
        clock(100_000)
    left_open.start()  # still open at the stop: cut there
    clock(MS)


def record(path):
    with _testing.fake_clock(1_000_000_000) as clock:
        mxprof.set_config(filename=path, profile_api=False, profile_memory=True, memory_events=True)
        mxprof.set_state("run")
        body(clock)
        mxprof.set_state("stop")
        mxprof.dump()


if __name__ == "__main__":
    folder = sys.argv[1]
    path = os.path.join(folder, "perfetto_v1.pftrace")
    record(path)
    trace = mxprof.load(path)
    expected = {
        "events": [
            [e.name, e.category, e.ph, e.ts, e.dur, e.pid, e.tid, e.args] for e in trace.events
        ],
        "threads": sorted([pid, tid, name] for (pid, tid), name in trace.thread_names.items()),
        "processes": sorted([pid, name] for pid, name in trace.process_names.items()),
    }
    with open(os.path.join(folder, "perfetto_v1.expected.json"), "w") as f:
        json.dump(expected, f, indent=0)
        f.write("\n")
