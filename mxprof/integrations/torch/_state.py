"""What the adapter's hooks share: the calling thread's open calls (tls) and the lock."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..._session import SESSION

if TYPE_CHECKING:
    from ._backward import Dispatch


def imperative_on() -> bool:
    """Whether the configuration asks for module calls (profile_imperative or profile_all)."""
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
        self.nodes: dict[int, tuple[Any, Dispatch]] = {}  # this pass's hooked nodes


tls = _ThreadState()
adapter_lock = threading.RLock()  # instrument, remove, attach (re-entered by a finalizer in GC)
