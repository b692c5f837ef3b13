"""Ranges inside asyncio tasks: each task records on a track of its own.

Concurrent tasks interleave on one thread, so a thread's stack of open
ranges cannot pair their begins and ends.  A range begun inside an asyncio
task therefore goes to the task's track (``mxp_track_open``): a timeline
with its own stack, named after the task, on which the task's ranges pair
and nest as they would on a thread.  The track opens at the task's first
range and closes when the task is done (its ranges still open end then,
cut short).

Outside a running event loop nothing here runs: ``ranges`` checks
``running_loop()`` (a C function reading the thread state) and takes the
thread's path when it is None.
"""

from __future__ import annotations

import asyncio
from asyncio.events import _get_running_loop as running_loop
from typing import Any

from ._native import ffi, lib

__all__ = ["running_loop", "track_of"]

_current_task = asyncio.current_task
_tracks: dict[asyncio.Task[Any], int] = {}


def track_of(loop: asyncio.AbstractEventLoop, create: bool) -> int:
    """The track of the task running on loop (0: none, or no task runs).

    create opens it when the task has none yet.  Never raises: a track the
    core cannot make leaves the task's ranges on its thread.
    """
    task = _current_task(loop)
    if task is None:
        return 0
    tid = _tracks.get(task)
    if tid is None:
        if not create:
            return 0
        tid = _open(task)
    return tid


def _open(task: asyncio.Task[Any]) -> int:
    try:
        name = task.get_name().encode("utf-8", "replace")
    except Exception:  # a Task-like object from another event loop library
        name = b"asyncio task"
    out = ffi.new("uint32_t *")
    if lib.mxp_track_open(name, len(name), out) < 0:
        return 0
    tid = int(out[0])
    _tracks[task] = tid
    task.add_done_callback(_close)
    return tid


def _close(task: asyncio.Task[Any]) -> None:
    tid = _tracks.pop(task, None)
    if tid is not None:
        lib.mxp_track_close(tid)


def begin(rid: int, loop: asyncio.AbstractEventLoop, thread_begin: Any) -> int:
    """Begin range rid in the running task's track, or on the thread
    (thread_begin, returning its rc) where no task runs."""
    tid = track_of(loop, True)
    if tid:
        lib.mxp_track_begin(tid, rid)
        return 0
    return int(thread_begin(rid))


def end(rid: int, loop: asyncio.AbstractEventLoop) -> int:
    """End range rid in the running task's track, or on the thread."""
    tid = track_of(loop, False)
    if tid:
        lib.mxp_track_end(tid, rid)
        return 0
    return int(lib.mxp_range_end(rid))
