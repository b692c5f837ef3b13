"""Two pieces of the report's work at once, on two cores, by fork.

The page's sections and its hints both read every event of the loaded traces
and share nothing while they do; on a machine with a second core the hints
are found in a forked child (which shares the loaded events copy-on-write)
while this process builds the sections, and come back pickled through a pipe.

Serial, with the same result, where the caller says so (``fork=False``:
``mxprof report --jobs 1``) or fork is missing or unsafe: no ``fork``
(Windows), another thread running (a fork copies only the calling thread,
and a lock another thread held stays held in the child), or mxprof's live
tier loaded (its fork hooks would start a profile in the child). A child
that fails is not trusted: the work is then done here.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

A = TypeVar("A")
B = TypeVar("B")


def forking_is_safe() -> bool:
    """Whether ``beside`` forks: fork exists, one thread runs, no live profiler is loaded."""
    return (
        hasattr(os, "fork")
        and (os.cpu_count() or 1) > 1
        and threading.active_count() == 1
        and "mxprof._session" not in sys.modules
    )


def beside(child: Callable[[], A], here: Callable[[], B], *, fork: bool = True) -> tuple[A, B]:
    """(child(), here()): child's in a forked process while here() runs in this one.

    Example:
        >>> beside(lambda: 1 + 1, lambda: "page")
        (2, 'page')
    """
    if not (fork and forking_is_safe()):
        return child(), here()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, leave without running exit hooks
        code = 0
        try:
            os.close(read_end)
            try:
                payload = pickle.dumps((True, child()), pickle.HIGHEST_PROTOCOL)
            except BaseException as e:  # noqa: BLE001 - any failure: the parent redoes the work
                payload = pickle.dumps((False, repr(e)))
            with os.fdopen(write_end, "wb") as f:
                f.write(payload)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        mine = here()
    finally:
        with os.fdopen(read_end, "rb") as f:
            data = f.read()
        os.waitpid(pid, 0)
    result: Any = None
    try:
        ok, result = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a child that died mid-write
        ok = False
    return (result if ok else child()), mine
