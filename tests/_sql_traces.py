"""Small traces with known numbers for the Parquet, SQL and view tests."""

import json

BASE = 1_700_000_000_000_000_000  # baseTimeNanoseconds of every trace here


def write(path, events, base=BASE, info=None, lines=True):
    """A Chrome trace: mxprof's one-event-per-line object form, or (lines=False)
    a bare JSON array as other tools write it."""
    if not lines:
        path.write_text(json.dumps(events))
        return path
    head = {"displayTimeUnit": "ms", "baseTimeNanoseconds": base}
    body = ",\n".join(json.dumps(e) for e in events)
    tail = {"otherData": {}}
    if info is not None:
        tail["distributedInfo"] = info
    text = json.dumps(head)[:-1] + ',"traceEvents":[\n' + body + "\n]," + json.dumps(tail)[1:]
    path.write_text(text + "\n")
    return path


def steps(pid=7, tid=1):
    """Two frames (steps 0 and 1) of 10 µs with nested forward/backward, in end
    order as the core writes them, a marker and a counter in step 1."""
    x = {"ph": "X", "pid": pid, "tid": tid}
    return [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": "MainThread"}},
        {**x, "name": "forward", "cat": "train", "ts": 1, "dur": 2},
        {**x, "name": "backward", "cat": "train", "ts": 4, "dur": 3},
        {**x, "name": "step", "cat": "train,frame", "ts": 0, "dur": 10, "args": {"frame": 0}},
        {**x, "name": "forward", "cat": "train", "ts": 11, "dur": 2},
        {"name": "mark", "cat": "train", "ph": "i", "s": "p", "ts": 12, "pid": pid, "tid": tid,
         "args": {"scope": "process"}},
        {"name": "queue", "cat": "train", "ph": "C", "ts": 12, "pid": pid, "tid": tid,
         "args": {"queue": 3}},
        {**x, "name": "step", "cat": "train,frame", "ts": 10, "dur": 10, "args": {"frame": 1}},
    ]  # fmt: skip


def rank(rank, pid, calls, offset_ns=0):
    """A worker rank's events: an all_reduce per (start µs, length µs) in calls,
    with distributedInfo (its clock offset_ns ahead of rank 0's)."""
    events = [
        {"name": "all_reduce(float32, 1024 B, group 0)", "cat": "torch.distributed", "ph": "X",
         "ts": ts, "dur": dur, "pid": pid, "tid": 1}
        for ts, dur in calls
    ]  # fmt: skip
    estimates = (
        [{"at_ns": BASE, "offset_ns": offset_ns, "error_ns": 10, "samples": 1}] if offset_ns else []
    )
    info = {"role": "worker", "rank": rank, "host": f"host{rank}", "pid": pid,
            "world_size": 2, "clock": {"estimates": estimates}}  # fmt: skip
    return events, info
