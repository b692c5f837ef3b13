"""Python thread names for the trace's ``thread_name`` metadata.

The core gives each recording thread a small trace id.  A hot call returns
MXP_NEW_THREAD on a thread's first call; the caller then registers the
thread here, and every trace write pushes each known thread's current name
into the core.  A thread that has exited keeps the name it had last.
"""

from __future__ import annotations

import threading

from . import _native

_known: dict[int, threading.Thread] = {}


def register_current() -> None:
    """Remember the calling thread under its trace id."""
    _known[_native.thread_tid()] = threading.current_thread()


# Threads by OS id as they started (watch_starts): the sampler samples
# threads that never record, and may be done before the next write names them.
_started: dict[int, threading.Thread] = {}


def watch_starts() -> None:
    """Note every thread started from now on under its OS id, so that the
    timeline the sampler makes for it can be named even after it ended
    (idempotent).  Wraps ``threading.Thread._set_native_id``, which a new
    thread calls first, once, and returns from before it runs its target:
    no frame of mxprof's stays on its stack.  The cost is one dict store per
    thread."""
    original = getattr(threading.Thread, "_set_native_id", None)
    if original is None or getattr(original, "_mxprof", False):
        return  # no OS thread ids here (the sampler names threads as it finds them)

    def _set_native_id(self: threading.Thread) -> None:
        original(self)
        if len(_started) > 1024:  # threads that never got a timeline: let the dead go
            for k, t in list(_started.items()):
                if not t.is_alive():
                    _started.pop(k, None)
        if self.native_id is not None:
            _started[self.native_id] = self

    _set_native_id._mxprof = True  # type: ignore[attr-defined]
    threading.Thread._set_native_id = _set_native_id  # type: ignore[attr-defined]


def sync_names() -> None:
    """Push every known thread's current name into the core, and name the
    timelines the sampler made for threads that never recorded."""
    unnamed = _native.thread_unnamed()
    if unnamed:
        by_os_id: dict[int | None, threading.Thread] = dict(_started.items())
        by_os_id.update((t.native_id, t) for t in threading.enumerate())
        for tid, os_tid in unnamed:
            thread = by_os_id.get(os_tid)
            if thread is not None:
                _known.setdefault(tid, thread)
                _started.pop(os_tid, None)
    for tid, thread in list(_known.items()):
        name = thread.name.encode("utf-8", "replace")
        _native.thread_name_set(tid, name, len(name))
        if not thread.is_alive():
            # Its final name is in the core now; let the Thread object go.
            _known.pop(tid, None)
