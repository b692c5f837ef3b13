"""SIGTERM and SIGINT: write the trace first, then do what was done before.

When a profile begins (in the main thread, with ``flush_on_signal`` on), a
handler is put in front of the handlers in place.  On the signal it writes
everything buffered, so the trace file is complete, then hands over: the
default action is re-raised (the exit status still says the signal killed
the process), an ignored signal stays ignored, a Python handler (Python's own
SIGINT handler raises KeyboardInterrupt) is called as it would have been.
The profile is not ended: a program that survives the signal keeps
profiling, and exit completes the file as usual.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any, Callable

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_previous: dict[int, Any] = {}
_flush: Callable[[], None] | None = None


def install(flush: Callable[[], None]) -> None:
    """Put the handler in front of SIGTERM's and SIGINT's, once per process.

    Only possible from the main thread; elsewhere nothing is installed.
    """
    global _flush
    _flush = flush
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current is _handler or current is None:  # None: set from C, not ours to wrap
            continue
        _previous[sig] = current
        signal.signal(sig, _handler)


def _handler(signum: int, frame: FrameType | None) -> None:
    try:
        if _flush is not None:
            _flush()
    finally:
        previous = _previous.get(signum, signal.SIG_DFL)
        if previous is signal.SIG_IGN:
            pass
        elif previous is signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        else:
            previous(signum, frame)
