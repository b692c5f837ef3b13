"""PyTorch adapter: every ``nn.Module`` call is a task, inside the module's scope.

Example::

    import mxprof
    from mxprof.integrations.torch import instrument

    mxprof.set_config(filename="trace.json", aggregate_stats=True)
    with instrument(model):                 # or: handle = instrument(model) ... handle.remove()
        mxprof.set_state("run")
        model(x).sum().backward()
        mxprof.set_state("stop")
    print(mxprof.dumps())

What is recorded for the module and each submodule (``named_modules()``; a
submodule registered under two names is hooked once, under its first):

* **forward**: a Task named by the module's path (``model.layer1.0.conv1``)
  in domain ``torch``, on the calling thread; calls nest like the modules.
  Each call runs inside ``mxprof.scope(<last path component>)`` in append
  mode, so scopes nest like Gluon's: ``model:layer1:0:conv1:``, or
  ``train:model:...`` inside ``mxprof.scope("train")``.  A forward that
  raises still closes its task and restores the scope (torch runs hooks
  registered with ``always_call`` for ``Exception``; a ``KeyboardInterrupt``
  skips them: ``Handle.remove()`` then closes what the calling thread left
  open).
* **backward**: a Task ``<path>.backward`` from the moment the gradient of
  the module's output reaches autograd until the gradients of its inputs are
  ready; for a module none of whose inputs needs a gradient (the first layer,
  the whole model) until the backward pass ends.  Autograd may run these on
  another thread than the forward (CUDA) and may end them on a third, so
  they are recorded whole on a track per autograd thread, named
  ``torch backward (<thread>)``.  They come from hooks on autograd nodes,
  not from ``register_full_backward_hook``: those wrap the module's inputs
  and outputs in views, and a later in-place op on the output (a
  ``ReLU(inplace=True)`` after a convolution, ``out += identity``) then
  fails the user's backward with a RuntimeError.  A call that returns its
  own input (an in-place module) has no backward of its own, and modules
  with ``inplace=True`` get no backward hooks (``Handle.skipped_backward``);
  their forward is timed as usual.
* **memory** (modules whose parameters, buffers or first tensor argument
  are on a CUDA device; with ``profile_memory``): ``memory="allocator"``
  (the default where torch offers it) attributes every allocation of
  PyTorch's CUDA caching allocator to the scope current on the allocating
  thread, and frees it when torch frees it (:class:`_AllocatorTracker`).
  ``memory="delta"`` records, per module call, the growth of the device's
  allocated bytes that the module's own code (not its children) left behind,
  tagged ``activations``; a module's records are replaced by those of its
  next forward pass on the same thread, so a scope's bytes in use are what
  its latest pass left allocated.  On CPU nothing is recorded: PyTorch's CPU
  allocator reports no allocations to Python.

* **torch.distributed** (``collectives=True``, where torch.distributed is
  initialised or later is): every collective and point-to-point call is a
  range named by its op, dtype, bytes and process group, blocking calls on
  the calling thread, asynchronous ones from issue to completion; a
  ``DistributedDataParallel`` model's gradient buckets are named
  ``... ddp bucket <i>`` (see :mod:`._collectives`).
  :func:`instrument_collectives` records them without a module.

* **DataLoader** (:func:`instrument_dataloader`): each batch from its
  worker process (getitem, collate) to the main process's wait for it, and
  pin memory (see :mod:`._dataloader`).

Everything is an eager-mode source: it records while ``profile_imperative``
(or ``profile_all``) is on, read once per outermost module call.  Per call
the hooks move cached ids only (task ids, scope ids per parent scope).
Not meant for ``torch.compile``d or scripted modules.
"""

from __future__ import annotations

import weakref
from typing import Any, Union

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "mxprof.integrations.torch needs PyTorch: pip install torch (or 'mxprof[torch]')"
    ) from e

from ..._native import range_end_token
from ...domain import Domain, check_name
from ...errors import ConfigError, StateError
from ._collectives import RECORDER, hook_ddp
from ._dataloader import ProfiledLoader, instrument_dataloader
from ._forward import HookedModule, restore_scope
from ._memory import TRACKER, free_all, gpu_trace_module
from ._state import adapter_lock, tls

__all__ = [
    "MEMORY_MODES",
    "Collectives",
    "Handle",
    "ProfiledLoader",
    "instrument",
    "instrument_collectives",
    "instrument_dataloader",
    "uninstrument",
]

MEMORY_MODES = ("allocator", "delta")

_owners: weakref.WeakValueDictionary[int, HookedModule] = weakref.WeakValueDictionary()
_ddp_hooked: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


class Collectives:
    """What :func:`instrument_collectives` returns; ``remove()`` (or the end
    of a ``with`` block) puts torch.distributed's functions back once no
    other user needs them."""

    def __init__(self) -> None:
        self._on = False

    @property
    def active(self) -> bool:
        """Whether this handle still holds torch.distributed wrapped."""
        return self._on

    def _install(self) -> None:
        RECORDER.install()
        self._on = True

    def remove(self) -> None:
        """Stop recording through this handle; safe to call more than once."""
        if self._on:
            self._on = False
            RECORDER.remove()

    def __enter__(self) -> Collectives:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.remove()


def instrument_collectives(model: torch.nn.Module | None = None) -> Collectives:
    """Record every torch.distributed collective and point-to-point call.

    Each call is a range named ``op(dtype, bytes B, group g)`` (``, peer p``
    for send/recv), in domain ``torch.distributed`` on the calling thread,
    or ``torch.distributed.async`` on a track of its own from issue to
    completion for ``async_op=True``, ``isend``/``irecv`` and DDP's buckets.
    :func:`instrument` does this too unless given ``collectives=False``.

    Args:
        model: a ``DistributedDataParallel`` model whose gradient buckets
            should be named (``... ddp bucket <i>``), through a communication
            hook that averages them as DDP's default; a model with a hook of
            its own keeps it (a warning says so).  DDP cannot take a hook
            off: after ``remove()`` it still averages the buckets, unrecorded.

    Returns:
        A :class:`Collectives` handle; ``remove()`` ends the recording.

    Raises:
        ImportError: this PyTorch has no torch.distributed.

    Example:
        >>> from mxprof.integrations.torch import instrument_collectives
        >>> with instrument_collectives():  # doctest: +SKIP
        ...     torch.distributed.all_reduce(grad)
    """
    import torch.distributed as dist

    if not dist.is_available():
        raise ImportError("this PyTorch build has no torch.distributed")
    handle = Collectives()
    handle._install()
    if model is not None:
        _hook_ddp(model)
    return handle


def _hook_ddp(model: torch.nn.Module) -> None:
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel) and model not in _ddp_hooked and hook_ddp(model):
        _ddp_hooked.add(model)


class Handle:
    """What :func:`instrument` returns: the hooks it placed, and how to remove them.

    Also a context manager: ``with instrument(model): ...`` removes the hooks
    at the end of the block.

    Attributes:
        paths: the task name of every hooked module, in ``named_modules()`` order.
        skipped_backward: paths of modules given no backward task (in-place).
        memory: ``'allocator'``, ``'delta'`` or None (no memory recorded).
    """

    def __init__(self, domain: Domain, root: str, memory: str | None) -> None:
        self._domain = domain
        self.root = root
        self.memory = memory
        self.paths: list[str] = []
        self.skipped_backward: list[str] = []
        self._modules: list[HookedModule] = []
        self._hooks: list[Any] = []
        self._release: weakref.finalize[Any, Any] | None = None  # our use of TRACKER
        self.collectives: Collectives | None = None

    @property
    def active(self) -> bool:
        """Whether the hooks are still in place."""
        return bool(self._hooks)

    def remove(self) -> None:
        """Remove every hook; safe to call more than once.

        Tasks the calling thread left open (a forward interrupted by a
        BaseException such as KeyboardInterrupt) are closed and its scope put
        back.  Memory recorded by ``memory="delta"`` is freed.
        """
        with adapter_lock:
            if not self._hooks:
                return
            for h in self._hooks:
                h.remove()
            self._hooks.clear()
            for m in self._modules:
                module = m.ref()
                if module is not None and _owners.get(id(module)) is m:
                    del _owners[id(module)]
                for _, handles in list(m.held.values()):
                    free_all(handles)
                m.held.clear()
            if self._release is not None:
                self._release()
            if self.collectives is not None:
                self.collectives.remove()
        self._unwind()

    def _unwind(self) -> None:
        stack = tls.stack
        for i, entry in enumerate(stack):
            if entry[0].handle is self:
                for inner in reversed(stack[i:]):
                    if inner[2] is not None:
                        range_end_token(inner[0].task_id, inner[1])
                if stack[i][2] is not None:
                    restore_scope(stack[i])
                del stack[i:]
                tls.nodes.clear()
                return

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return f"<mxprof torch Handle {self.root!r}: {len(self.paths)} modules, {state}>"


def _memory_mode(memory: Any) -> str | None:
    if memory is False:
        return None
    if memory is True:
        return "allocator" if gpu_trace_module() is not None else "delta"
    if memory in MEMORY_MODES:
        return str(memory)
    raise ConfigError(f"memory must be True, False, 'allocator' or 'delta', got {memory!r}")


DomainLike = Union[Domain, str, None]


def instrument(
    module: torch.nn.Module,
    domain: DomainLike = None,
    name: str | None = None,
    backward: bool = True,
    memory: bool | str = True,
    collectives: bool = True,
) -> Handle:
    """Time every call of module and its submodules, each in its own scope.

    Args:
        module: the model.
        domain: the tasks' Domain, or its name; default ``Domain("torch")``.
        name: the root's name, first in every path and scope; default ``"model"``.
        backward: also time each module's backward (``<path>.backward``).
        memory: attribute CUDA memory to module scopes: True (``'allocator'``
            where torch offers per-allocation callbacks, else ``'delta'``),
            ``'allocator'``, ``'delta'`` or False.  Nothing is recorded for
            modules on the CPU.
        collectives: also record torch.distributed's calls (as
            :func:`instrument_collectives`, with the module's DDP buckets
            when it is a ``DistributedDataParallel``); ignored where this
            PyTorch has no torch.distributed.

    Returns:
        A :class:`Handle`; ``handle.remove()`` (or :func:`uninstrument`, or the
        end of a ``with`` block) takes the hooks off.

    Raises:
        TypeError: module is not an ``nn.Module``, or a wrong argument type.
        ConfigError: an empty name or an unknown memory mode.
        StateError: module or one of its submodules is already instrumented
            (instrumenting is not idempotent, so that names never silently
            stay those of an earlier call).

    Example:
        >>> import torch, mxprof
        >>> from mxprof.integrations.torch import instrument
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        >>> with instrument(net, name="net") as handle:
        ...     handle.paths
        ['net', 'net.0', 'net.1']
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"instrument needs a torch.nn.Module, got {type(module).__name__}")
    if domain is None:
        dom = Domain("torch")
    elif isinstance(domain, str):
        dom = Domain(domain)
    elif isinstance(domain, Domain):
        dom = domain
    else:
        raise TypeError(f"domain must be an mxprof.Domain, a str or None, got {domain!r}")
    root = "model" if name is None else check_name(name, "instrument name")
    if not isinstance(backward, bool):
        raise TypeError(f"backward must be a bool, got {backward!r}")
    if not isinstance(collectives, bool):
        raise TypeError(f"collectives must be a bool, got {collectives!r}")
    mode = _memory_mode(memory)
    handle = Handle(dom, root, mode)
    with adapter_lock:
        named = list(module.named_modules())  # a shared submodule once, by its first name
        for qname, sub in named:
            owner = _owner(sub)
            if owner is not None:
                where = root if not qname else f"{root}.{qname}"
                raise StateError(
                    f"{where} is already instrumented as {owner.path!r}: remove that first "
                    "(handle.remove() or uninstrument())"
                )
        for qname, sub in named:
            path = root if not qname else f"{root}.{qname}"
            m = HookedModule(handle, sub, path, qname.rpartition(".")[2] or root)
            if backward:
                if getattr(sub, "inplace", False) is True:
                    handle.skipped_backward.append(path)
                else:
                    m.bw_id = dom.new_task(path + ".backward").id
            handle._hooks.append(sub.register_forward_pre_hook(m.pre, prepend=True))
            handle._hooks.append(
                sub.register_forward_hook(m.post, with_kwargs=True, always_call=True)
            )
            handle._modules.append(m)
            handle.paths.append(path)
            _owners[id(sub)] = m
        if mode == "allocator":
            TRACKER.users += 1
            # A handle dropped without remove() gives its use back when collected.
            handle._release = weakref.finalize(handle, TRACKER.release)
        if collectives and _distributed_available():
            handle.collectives = Collectives()
            handle.collectives._install()
            _hook_ddp(module)
    return handle


def _distributed_available() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - depends on the build
        return False
    return bool(dist.is_available())


def _owner(module: torch.nn.Module) -> HookedModule | None:
    m = _owners.get(id(module))
    return m if m is not None and m.ref() is module else None


def uninstrument(module: torch.nn.Module) -> bool:
    """Remove the hooks of the :func:`instrument` call that covers module.

    Returns:
        True when hooks were removed, False when module was not instrumented.

    Example:
        >>> import torch
        >>> from mxprof.integrations.torch import instrument, uninstrument
        >>> net = torch.nn.Linear(2, 2)
        >>> _ = instrument(net)
        >>> uninstrument(net), uninstrument(net)
        (True, False)
    """
    m = _owner(module)
    if m is None:
        return False
    m.handle.remove()
    return True
