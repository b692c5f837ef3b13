"""CUDA memory of instrumented modules: which device a module is on, and its two records:
``memory="delta"`` (what each call left allocated) and ``memory="allocator"`` (every
allocation of PyTorch's caching allocator, through its callbacks).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable

import torch

from ... import memory
from ..._session import warn
from ._state import adapter_lock, imperative_on, tls

if TYPE_CHECKING:
    from ._forward import HookedModule

ACTIVATIONS = "activations"  # the tag of memory="delta" records


_NO_TENSOR = weakref.ref(torch.empty(0))  # dead at once: "the module has no tensors"


def cuda_ordinal(m: HookedModule, module: torch.nn.Module, args: tuple[Any, ...]) -> int:
    """The CUDA device of module's first parameter or buffer, else of its first
    tensor argument; -1: not CUDA.

    Looks only at tensors, so CPU-only use never touches torch.cuda.  The
    tensor looked at is remembered (``.cuda()`` moves parameters in place).
    """
    ref = m.probe
    probe = ref() if ref is not None else None
    if probe is None and ref is not _NO_TENSOR:
        probe = next(module.parameters(), None)
        if probe is None:
            probe = next(module.buffers(), None)
        m.probe = weakref.ref(probe) if probe is not None else _NO_TENSOR
    if probe is None:
        for a in args:
            if isinstance(a, torch.Tensor):
                probe = a
                break
        else:
            return -1
    return probe.get_device() if probe.is_cuda else -1


def cuda_allocated(ordinal: int) -> int:
    """Bytes torch's caching allocator has allocated on a CUDA device now."""
    return _cuda_stats(ordinal)[0]


def record_growth(m: HookedModule, entry: list[Any], stack: list[list[Any]]) -> None:
    """memory="delta": record what this call's own code left allocated."""
    st = tls
    grown = cuda_allocated(st.mem) - entry[5]
    if stack and len(stack[-1]) > 3:
        stack[-1][6] += grown  # the parent's own growth excludes ours
    key = threading.get_ident()
    kept = m.held.get(key)
    if kept is None or kept[0] != st.pass_no:  # this thread's first call this pass
        if kept is not None:
            free_all(kept[1])
        kept = m.held[key] = (st.pass_no, [])
    own = grown - entry[6]
    if own > 0:
        handle = memory.record_alloc(own, st.mem, tag=ACTIVATIONS)  # in our scope, still set
        if handle:
            kept[1].append(handle)


def free_all(handles: Iterable[int]) -> None:
    """Record the free of each handle (memory="delta" growth a call left)."""
    for h in handles:
        memory.record_free(h)


# ---- memory="allocator" ---------------------------------------------------------


def gpu_trace_module() -> Any:
    """torch's per-allocation callbacks (the CUDA sanitizer's), or None."""
    if not hasattr(torch._C, "_activate_gpu_trace"):
        return None
    try:
        from torch.cuda import _gpu_trace
    except ImportError:
        return None
    for name in ("MemoryAllocationCallbacks", "MemoryDeallocationCallbacks"):
        if not hasattr(getattr(_gpu_trace, name, None), "callback_list"):
            return None
    return _gpu_trace


def _cuda_stats(ordinal: int) -> tuple[int, int]:
    stats = torch.cuda.memory_stats_as_nested_dict(ordinal)
    allocated = int(stats.get("allocated_bytes", {}).get("all", {}).get("current", 0))
    requested = int(stats.get("requested_bytes", {}).get("all", {}).get("current", allocated))
    return allocated, requested


def _cuda_blocks() -> tuple[dict[int, tuple[int, int, int, bool]], list[int]]:
    """The live blocks of the caching allocator and the devices to watch."""
    blocks = {}
    for segment in torch.cuda.memory_snapshot():  # type: ignore[no-untyped-call]
        for b in segment.get("blocks", ()):
            if b.get("state") == "active_allocated":
                size = int(b["size"])
                blocks[int(b["address"])] = (
                    int(segment.get("device", 0)),
                    size,
                    int(b.get("requested_size", size)),
                    False,
                )
    return blocks, list(range(torch.cuda.device_count()))


class _AllocatorTracker:
    """Attributes CUDA allocations to scopes through torch's GPU trace callbacks.

    PyTorch (``torch.cuda._gpu_trace``, the hooks of its CUDA sanitizer) calls
    Python with the address of every block its caching allocator hands out
    and takes back, on the allocating thread, after the allocation and
    before the free are counted in its statistics.  The callbacks carry no
    size: the size of an allocation is the growth of the device's
    ``allocated_bytes`` (and ``requested_bytes``) since the last event this
    tracker saw, less the blocks freed in between.  Sizes are exact while one
    thread at a time allocates on a device; concurrent allocation can shift
    bytes between two records, never accumulating (every allocation re-reads
    the statistics).  Blocks live when tracking began are learnt from the
    allocator's snapshot so that their frees keep the books right.

    Costs and limits: activating the trace is for the life of the process
    (torch has no way back); after the last ``instrument(memory="allocator")``
    is removed our callbacks are unregistered and each CUDA allocation pays
    only torch's own check.  While attached, every allocation anywhere in the
    process (optimizer, data, backward) is recorded under the scope of its
    thread; autograd's CUDA threads have no scope of their own (``<unk>:``).
    """

    def __init__(
        self,
        stats: Callable[[int], tuple[int, int]] = _cuda_stats,
        current: Callable[[], int] = lambda: int(torch.cuda.current_device()),
        blocks: Callable[[], tuple[dict[int, tuple[int, int, int, bool]], list[int]]] = (
            _cuda_blocks
        ),
    ) -> None:
        self._stats = stats
        self._current = current
        self._read_blocks = blocks
        self.adapter_lock = threading.Lock()
        self._blocks: dict[int, tuple[int, int, int, bool]] = {}  # ptr -> device, sizes, recorded
        self._seen: dict[int, tuple[int, int]] = {}  # device -> bytes as of the last event
        self.users = 0  # instrument() handles in allocator mode
        self.attached = False
        self.failed = False  # attaching failed once: not tried again
        self._trace: Any = None

    def start(self) -> None:
        """Learn the live blocks and every device's statistics."""
        blocks, devices = self._read_blocks()
        with self.adapter_lock:
            self._blocks = blocks
            self._seen = {d: self._stats(d) for d in devices}

    def attach(self) -> None:
        """Start receiving torch's callbacks (once, while some handle uses them)."""
        if self.attached or not self.users or self.failed:
            return
        with adapter_lock:
            if self.attached or not self.users or self.failed:
                return
            trace = gpu_trace_module()
            try:
                if trace is None:
                    raise RuntimeError("this torch has no torch.cuda._gpu_trace callbacks")
                self.start()
                torch._C._activate_gpu_trace()
            except Exception as e:  # never fail the user's forward
                self.failed = True
                warn(f"mxprof: CUDA memory of torch modules is not recorded: {e}")
                return
            trace.MemoryAllocationCallbacks.add_callback(self.on_alloc)
            trace.MemoryDeallocationCallbacks.add_callback(self.on_free)
            self._trace = trace
            self.attached = True

    def release(self) -> None:
        """One handle fewer uses the tracker; the last one detaches it."""
        with adapter_lock:
            self.users -= 1
            if not self.users and self.attached:
                self.detach()

    def detach(self) -> None:
        """Stop receiving torch's callbacks; what was recorded stays recorded."""
        trace, self._trace = self._trace, None
        self.attached = False
        if trace is not None:
            for registry, cb in (
                (trace.MemoryAllocationCallbacks, self.on_alloc),
                (trace.MemoryDeallocationCallbacks, self.on_free),
            ):
                if cb in registry.callback_list:
                    registry.callback_list.remove(cb)
        with self.adapter_lock:
            self._blocks.clear()
            self._seen.clear()

    def on_alloc(self, ptr: int) -> None:
        """torch allocated the block at ptr on the current device."""
        try:
            ordinal = self._current()
            allocated, requested = self._stats(ordinal)
        except Exception:  # never fail an allocation
            return
        with self.adapter_lock:
            seen = self._seen.get(ordinal)
            self._seen[ordinal] = (allocated, requested)
            actual = 0 if seen is None else allocated - seen[0]
            asked = 0 if seen is None else requested - seen[1]
            if actual <= 0:  # no baseline, or a race moved the bytes elsewhere
                self._blocks[ptr] = (ordinal, 0, 0, False)
                return
            if not 0 < asked <= actual:
                asked = actual
            recorded = bool(
                imperative_on() and memory.record_alloc(asked, ordinal, ptr=ptr, actual=actual)
            )
            self._blocks[ptr] = (ordinal, actual, asked, recorded)

    def on_free(self, ptr: int) -> None:
        """torch is about to take back the block at ptr."""
        with self.adapter_lock:
            block = self._blocks.pop(ptr, None)
            if block is None:
                return
            ordinal, actual, asked, recorded = block
            seen = self._seen.get(ordinal)
            if seen is not None:  # torch subtracts it from its statistics next
                self._seen[ordinal] = (seen[0] - actual, seen[1] - asked)
        if recorded:
            memory.record_free(ptr)


TRACKER = _AllocatorTracker()
