"""Forward: each module call is a task inside the module's scope."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

# The core's calls made per module call, imported by name: one global load
# and the cffi call each.  flags_update(0, 0) reads the core's flags.
from ..._native import (
    FLAG_MEMORY,
    FLAG_RECORD,
    NEW_THREAD,
    flags_update,
    range_begin_token,
    range_end_token,
    scope_set,
)
from ..._threads import register_current
from ...scope import CURRENT, DEFAULT, scope_id
from . import _memory  # through the module, so that a test can replace its functions
from ._backward import watch_backward
from ._state import imperative_on, tls

if TYPE_CHECKING:
    from . import Handle

_grad_enabled = torch.is_grad_enabled


class HookedModule:
    """One hooked module: its task ids and scope names, made at instrument time."""

    __slots__ = (
        "__weakref__",
        "bw_id",
        "delta",
        "handle",
        "held",
        "leaf",
        "path",
        "probe",
        "ref",
        "scopes",
        "task_id",
    )

    def __init__(self, handle: Handle, module: torch.nn.Module, path: str, leaf: str) -> None:
        self.handle = handle
        self.ref = weakref.ref(module)
        self.path = path
        self.leaf = leaf + ":"
        self.task_id: int = handle._domain.new_task(path).id
        self.bw_id = 0  # 0: no backward task
        self.probe: weakref.ref[torch.Tensor] | None = None  # a tensor that tells the device
        self.delta = handle.memory == "delta"
        self.scopes: dict[str, tuple[str, int, str, int]] = {}
        self.held: dict[int, tuple[int, list[int]]] = {}  # thread -> (pass, delta handles)

    def scope_in(self, parent: str) -> tuple[str, int, str, int]:
        full = self.leaf if parent == DEFAULT else parent + self.leaf
        entry = (full, scope_id(full), parent, scope_id(parent))
        if len(self.scopes) >= 256:  # parents that never repeat (a scope per step)
            self.scopes.clear()
        self.scopes[parent] = entry
        return entry

    def pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        st = tls
        stack = st.stack
        if not stack:
            _outermost(self, module, args)
        if not st.on:
            stack.append([self, 0, None])
            return None
        parent = CURRENT.get()
        sc = self.scopes.get(parent) or self.scope_in(parent)
        ctx = CURRENT.set(sc[0])
        if scope_set(sc[1]) == NEW_THREAD:
            register_current()
        before = _memory.cuda_allocated(st.mem) if self.delta and st.mem >= 0 else -1
        token = range_begin_token(self.task_id)
        if token & NEW_THREAD:
            register_current()
        stack.append([self, token, ctx, sc[2], sc[3], before, 0])
        return None

    def post(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> None:
        stack = tls.stack
        if not stack or stack[-1][0] is not self:
            return None  # our pre-hook did not run (an earlier hook raised)
        entry = stack.pop()
        if entry[2] is not None:
            range_end_token(self.task_id, entry[1])
            if entry[5] >= 0:
                _memory.record_growth(self, entry, stack)
            restore_scope(entry)
            if self.bw_id and _grad_enabled() and flags_update(0, 0) & FLAG_RECORD:
                watch_backward(self, args, kwargs, out)
        if not stack:
            tls.nodes.clear()
        return None


def restore_scope(entry: list[Any]) -> None:
    """Put back the scope that was current before entry's call."""
    try:
        CURRENT.reset(entry[2])
    except (ValueError, RuntimeError):  # another context, or reset twice
        CURRENT.set(entry[3])
    scope_set(entry[4])


def _outermost(m: HookedModule, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    """The first call on a thread's empty stack: read the switches once."""
    st = tls
    st.on = on = imperative_on()
    st.pass_no += 1
    st.mem = -1
    mode = m.handle.memory
    if on and mode is not None and flags_update(0, 0) & FLAG_MEMORY:
        ordinal = _memory.cuda_ordinal(m, module, args)
        if ordinal >= 0:
            if mode == "allocator":
                _memory.TRACKER.attach()
            else:
                st.mem = ordinal
