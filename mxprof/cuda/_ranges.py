"""GPU tasks: GpuTask (what ``mxprof.Task(..., stream=s)`` makes), gpu_range, synchronize."""

from __future__ import annotations

import threading
from typing import Any

from .. import _native, ranges
from .._native import FLAG_RECORD, flags_update
from ..domain import Domain, check_domain
from ..ranges import Task
from ._devices import stream_handle
from ._runtime import runtime_state
from ._timing import Span

DOMAIN = Domain("cuda")  # of gpu_range's tasks unless one is given


def synchronize() -> None:
    """Wait for every GPU range started so far and record it.

    Ranges are otherwise recorded as their events complete, at the next
    trace write or ``dumps()``; call this before reading ``dumps()`` when
    the GPU may still be working.

    Raises:
        DeviceUnavailable: no CUDA.

    Example:
        >>> import mxprof
        >>> from mxprof import cuda
        >>> cuda.synchronize()  # doctest: +SKIP
        >>> print(mxprof.dumps())  # doctest: +SKIP
    """
    runtime_state().timing.resolve(wait=True)


class GpuTask(Task):
    """A Task also timed on a CUDA stream; ``mxprof.Task(domain, name, stream=s)`` makes one.

    Each start and stop records the host range like any Task and, while the
    profiler records, a CUDA event on the stream; the GPU time between the
    two events becomes a range of category ``<domain>,gpu`` on the track of
    the stream (``GPU 0 stream 0``).  The stream must belong to the device
    current on the calling thread when the range starts (as
    cudaEventRecord requires).  Misuse and CUDA failures never raise from
    start/stop: a GPU range that cannot be timed is dropped with a warning.
    Decorating a coroutine function, the GPU range spans from the call to
    its return, so it includes whatever else ran on the stream meanwhile.

    Args:
        domain: the Domain it belongs to.
        name: its name; the GPU ranges aggregate under the same name.
        stream: the stream to time (see :func:`stream_handle`); 0 is the
            legacy default stream.

    Raises:
        DeviceUnavailable: no CUDA.

    Example:
        >>> import mxprof
        >>> step = mxprof.Task(mxprof.Domain("train"), "step", stream=0)  # doctest: +SKIP
        >>> with step:  # doctest: +SKIP
        ...     launch_kernels()
    """

    __slots__ = ("_gpu_id", "_stream", "_timing", "_local")

    def __init__(self, domain: Domain, name: str, stream: Any = 0) -> None:
        timing = runtime_state().timing
        super().__init__(check_domain(domain, "Task"), name)
        self._stream = stream_handle(stream)
        self._gpu_id = _native.register(_native.KIND_GPU, domain.utf8, self._name.encode())
        self._timing = timing
        self._local = threading.local()

    @property
    def stream(self) -> int:
        """The handle of the stream it times."""
        return self._stream

    def _spans(self) -> list[Span | None]:
        try:
            stack: list[Span | None] = self._local.stack
        except AttributeError:
            stack = self._local.stack = []
        return stack

    # The host range is Task's; the GPU span extends it (ranges._Range's hooks).
    hooked = True

    def on_begin(self) -> Span | None:
        """Record the span's start event on the stream, while recording."""
        if not flags_update(0, 0) & FLAG_RECORD:
            return None
        return self._timing.begin(self._gpu_id, self._stream)

    def on_end(self, state: Span | None) -> None:
        """Record the end event of the span that on_begin started."""
        if state is not None:
            self._timing.end(state)

    def start(self) -> None:
        """Begin the range on the calling thread and on the stream."""
        super().start()
        self._spans().append(self.on_begin())

    def stop(self) -> None:
        """End the innermost open range of this task on the calling thread and its stream."""
        stack = self._spans()
        self.on_end(stack.pop() if stack else None)
        super().stop()

    def __enter__(self) -> GpuTask:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        domain = self._domain.name if self._domain is not None else ""
        return f"GpuTask({domain!r}, {self._name!r}, stream={self._stream:#x})"


ranges.set_stream_task(GpuTask)


def gpu_range(name: str, stream: Any = 0, domain: Domain | None = None) -> GpuTask:
    """A range timed on the host and on a CUDA stream: ``with cuda.gpu_range("fwd"): ...``.

    Returns the same :class:`GpuTask` for the same domain, name and stream,
    so it is cheap to call in a loop; it also works as a decorator.

    Args:
        name: the range's name.
        stream: the stream to time (default 0, the legacy default stream).
        domain: its Domain (default :data:`DOMAIN`, ``cuda``).

    Raises:
        DeviceUnavailable: no CUDA.

    Example:
        >>> from mxprof import cuda
        >>> with cuda.gpu_range("forward", stream=0):  # doctest: +SKIP
        ...     launch_kernels()
    """
    state = runtime_state()
    dom = DOMAIN if domain is None else check_domain(domain, "gpu_range")
    handle = stream_handle(stream)
    task = state.ranges.get((dom.name, name, handle))
    if task is None:
        task = GpuTask(dom, name, stream=handle)
        state.ranges[(dom.name, name, handle)] = task
    return task
