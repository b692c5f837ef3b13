"""Ranges inside asyncio tasks: each task records on a track of its own.

Concurrent tasks interleave on one thread, so a thread's stack of open
ranges cannot pair their begins and ends.  A range begun inside an asyncio
task therefore goes to the task's track (``mxp_track_open``): a timeline
with its own stack, named after the task, on which the task's ranges pair
and nest as they would on a thread.  The track opens at the task's first
range and closes when the task is done (its ranges still open end then,
cut short).

Threads that run no event loop pay nothing for this.  Every event loop
announces itself through ``asyncio.events._set_running_loop`` when it starts
and stops running on a thread; mxprof wraps that function (``install``) to
tell the core, per thread.  Range objects begin and end with the checked
calls (``mxp_range_enter``/``exit``), which answer ``MXP_IN_LOOP`` on such a
thread without recording; only then does Python look for the running task
(``begun``/``ended``).  A loop that bypasses ``_set_running_loop`` (or was
captured before mxprof was imported) leaves its ranges on the thread, as
before.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import sys
import types
from asyncio.events import _get_running_loop as running_loop
from threading import get_ident
from typing import Any, Callable

from . import _native
from ._native import IN_LOOP, NEW_THREAD
from ._native import track_begin as _track_begin
from ._native import track_end as _track_end
from ._threads import register_current

__all__ = ["begun", "ended", "install", "running_loop", "task_key", "track_of"]

_current_task = asyncio.current_task
_tracks: dict[asyncio.Task[Any], int] = {}
# The loop running on each thread (by thread ident), as _set_running_loop
# was told: cheaper to look up than asking asyncio (which, in Python 3.11,
# makes a getpid system call each time).
_loops: dict[int, Any] = {}


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


def task_key(coro: Any) -> int:
    """The key the core's sampler knows a coroutine by (``mxp_sampler_task``):
    the coroutine object's address, or its frame's where frames are objects
    (3.9, 3.10).  0 when it has none (not a native coroutine, or finished)."""
    if sys.version_info >= (3, 11):
        return id(coro) if isinstance(coro, types.CoroutineType) else 0
    frame = getattr(coro, "cr_frame", None)
    return id(frame) if frame is not None else 0


# The key each task with a track was registered under with the sampler, so
# that samples taken while its coroutine runs go to its track.
_keys: dict[asyncio.Task[Any], int] = {}


def _open(task: asyncio.Task[Any]) -> int:
    try:
        name = task.get_name().encode("utf-8", "replace")
    except Exception:  # a Task-like object from another event loop library
        name = b"asyncio task"
    tid = _native.track_open(name)
    if not tid:
        return 0
    _tracks[task] = tid
    get_coro = getattr(task, "get_coro", None)
    key = task_key(get_coro()) if get_coro is not None else 0
    if key and _native.sampler_task(key, tid) == 0:
        _keys[task] = key
    task.add_done_callback(_close)
    return tid


def _close(task: asyncio.Task[Any]) -> None:
    tid = _tracks.pop(task, None)
    key = _keys.pop(task, 0)
    if key:
        _native.sampler_task(key, 0)
    if tid is not None:
        _native.track_close(tid)


def begun(rc: int, rid: int) -> None:
    """After a checked begin of range rid returned rc (not 0): begin it in
    the running task's track (or on the thread, where no task runs)."""
    if rc & IN_LOOP:
        tid = 0
        loop = _loops.get(get_ident())
        task = _current_task(loop) if loop is not None else None
        if task is not None:
            tid = _tracks.get(task) or _open(task)
        rc = _track_begin(tid, rid)
    if rc == NEW_THREAD:
        register_current()


def ended(rc: int, rid: int) -> None:
    """After a checked end of range rid returned rc (not 0): likewise."""
    if rc & IN_LOOP:
        loop = _loops.get(get_ident())
        task = _current_task(loop) if loop is not None else None
        rc = _track_end(_tracks.get(task, 0) if task is not None else 0, rid)
    if rc == NEW_THREAD:
        register_current()


def _announce(loop: Any) -> None:
    if loop is None:
        _loops.pop(get_ident(), None)
    else:
        _loops[get_ident()] = loop
    if _native.thread_loop_set(0 if loop is None else 1) == NEW_THREAD:
        register_current()


def install() -> None:
    """Wrap asyncio's _set_running_loop so the core learns which threads
    run an event loop (idempotent), and tell it about one running here now."""
    original: Callable[[Any], None] = asyncio.events._set_running_loop
    if getattr(original, "_mxprof", False):
        return

    def _set_running_loop(loop: Any) -> None:
        original(loop)
        _announce(loop)

    _set_running_loop._mxprof = True  # type: ignore[attr-defined]
    _set_running_loop.__doc__ = original.__doc__
    asyncio.events._set_running_loop = _set_running_loop
    if getattr(asyncio, "_set_running_loop", None) is original:
        asyncio._set_running_loop = _set_running_loop
    loop = running_loop()
    if loop is not None:
        _announce(loop)


install()
