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


def sync_names() -> None:
    """Push every known thread's current name into the core."""
    for tid, thread in list(_known.items()):
        name = thread.name.encode("utf-8", "replace")
        _native.thread_name_set(tid, name, len(name))
        if not thread.is_alive():
            # Its final name is in the core now; let the Thread object go.
            _known.pop(tid, None)
