"""Backward: each module call's backward is a task, timed by hooks on autograd nodes."""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, Callable

import torch

from ... import _native
from ..._native import FLAG_RECORD, clock_ns, flags_update, range_add
from ...errors import ProfilerError
from ._state import tls

if TYPE_CHECKING:
    from ._forward import HookedModule

_graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: 0)


class _BackwardCall:
    """The backward of one forward call: begun by the node that made its
    output, ended by the nodes that made its inputs, or by the pass's end."""

    __slots__ = ("id", "inputs", "left", "start", "track")

    def __init__(self, task_id: int, inputs: int) -> None:
        self.id = task_id
        self.inputs = inputs
        self.left = 0
        self.start = 0  # 0: not begun (or already recorded)
        self.track = 0

    def begin(self, now: int, track: int, group: list[_BackwardCall]) -> None:
        if self.start:
            return  # a second output node of the same call
        self.start = now
        self.track = track
        self.left = self.inputs
        group.append(self)  # the pass's end closes it if its inputs never do

    def arrived(self, now: int) -> None:
        """The gradient of one of the call's inputs is ready."""
        self.left -= 1
        if self.left == 0 and self.start:
            self.finish(now)

    def finish(self, now: int) -> None:
        range_add(self.id, self.track, self.start, max(0, now - self.start))
        self.start = 0


class Dispatch:
    """The one pre-hook of an autograd node, run when the gradients of the
    node's outputs are ready: it ends the calls that took one of those
    outputs as input, then begins the calls that returned one, outermost
    first, at one instant so that they nest exactly.  One hook per node and
    forward pass: in a chain, a module's input node is its predecessor's
    output node (a hook costs torch about 2 us)."""

    __slots__ = ("begins", "ends")

    def __init__(self) -> None:
        self.begins: list[_BackwardCall] = []
        self.ends: list[_BackwardCall] = []

    def __call__(self, grad_outputs: Any) -> None:
        now = clock_ns()
        for call in self.ends:
            call.arrived(now)
        if self.begins and flags_update(0, 0) & FLAG_RECORD:
            track = tls.track or _new_track()
            group = _pass_group()
            for call in self.begins:
                call.begin(now, track, group)
        return None


def _dispatch(node: Any) -> Dispatch:
    """node's dispatcher in this forward pass, hooking node on first use."""
    nodes = tls.nodes
    got = nodes.get(id(node))
    if got is not None:
        return got[1]
    d = Dispatch()
    node.register_prehook(d)
    nodes[id(node)] = (node, d)  # holds node (and so its id) until the pass ends
    return d


_passes: dict[int, list[_BackwardCall]] = {}  # graph task id -> calls begun in it
_passes_lock = threading.Lock()


def _pass_group() -> list[_BackwardCall]:
    gid = _graph_task_id()
    with _passes_lock:
        group = _passes.get(gid)
        if group is None:
            while len(_passes) >= 64:  # passes that failed before their end
                del _passes[next(iter(_passes))]
            group = _passes[gid] = []
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(functools.partial(_end_pass, gid))
    return group


def _end_pass(gid: int) -> None:
    with _passes_lock:
        group = _passes.pop(gid, [])
    now = clock_ns()
    for call in reversed(group):  # innermost first
        if call.start:
            call.finish(now)


def _new_track() -> int:
    thread = threading.current_thread()
    who = "autograd" if type(thread).__name__ == "_DummyThread" else thread.name
    try:
        tls.track = _native.new_track(f"torch backward ({who} {threading.get_ident():x})")
    except ProfilerError:  # no track: this thread's backward ranges are not recorded
        tls.track = 0
    return tls.track


def _tensors(obj: Any, out: list[torch.Tensor], depth: int = 0) -> None:
    """The tensors in obj (a tensor, or tuples, lists and dicts of them) that have a grad_fn."""
    if isinstance(obj, torch.Tensor):
        if obj.grad_fn is not None:
            out.append(obj)
    elif depth < 3 and isinstance(obj, (tuple, list)):
        for item in obj:
            _tensors(item, out, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for item in obj.values():
            _tensors(item, out, depth + 1)


def watch_backward(m: HookedModule, args: Any, kwargs: dict[str, Any], out: Any) -> None:
    """After a forward call of m: hook the autograd nodes of its outputs and
    inputs so that the call's backward becomes a range."""
    outs: list[torch.Tensor] = []
    _tensors(out, outs)
    if not outs:
        return
    ins: list[torch.Tensor] = []
    _tensors(args, ins)
    if kwargs:
        _tensors(kwargs, ins)
    for o in outs:
        for i in ins:
            if o is i:
                return  # in place: its backward is not its own
    call = _BackwardCall(m.bw_id, len(ins))
    for i in ins:
        _dispatch(i.grad_fn).ends.append(call)
    for o in outs:
        begins = _dispatch(o.grad_fn).begins
        if call not in begins:
            begins.insert(0, call)  # callers' post-hooks run after their children's
