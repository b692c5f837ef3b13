"""What the adapter's hooks share: the calling thread's open calls, the lock, the core's calls."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..._native import lib
from ..._session import SESSION

if TYPE_CHECKING:
    from ._backward import _Dispatch

_begin = lib.mxp_range_begin_token
_end = lib.mxp_range_end_token
_scope_set = lib.mxp_scope_set
_flags = lib.mxp_flags_update  # (0, 0) reads the core's flags
_clock = lib.mxp_clock_ns


def _imperative_on() -> bool:
    cfg = SESSION.config  # as Config.enabled, without its call: allocations ask this
    return cfg.profile_all or cfg.profile_imperative


class _ThreadState(threading.local):
    def __init__(self) -> None:
        # Open calls, innermost last: [module, task token, contextvar token,
        # parent scope, parent scope id, allocated bytes before, children's growth]
        self.stack: list[list[Any]] = []
        self.on = False  # the outermost call found profile_imperative on
        self.mem = -1  # CUDA ordinal of memory="delta" measurement, -1: none
        self.pass_no = 0  # outermost calls so far
        self.track = 0  # this thread's backward track
        self.nodes: dict[int, tuple[Any, _Dispatch]] = {}  # this pass's hooked nodes


_tls = _ThreadState()
_lock = threading.RLock()  # instrument, remove, attach (re-entered by a finalizer in GC)
