"""GPU tasks: GpuTask (what ``mxprof.Task(..., stream=s)`` makes), gpu_range, synchronize."""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, TypeVar

from .. import _native
from .._native import FLAG_RECORD, NEW_THREAD, flags_update
from .._threads import register_current
from ..domain import Domain, check_domain
from ..ranges import Task, _begin, _begin_token, _end, _end_token
from ._devices import stream_handle
from ._runtime import _state
from ._timing import _Span

F = TypeVar("F", bound=Callable[..., Any])

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
    _state().timing.resolve(wait=True)


class GpuTask(Task):
    """A Task also timed on a CUDA stream; ``mxprof.Task(domain, name, stream=s)`` makes one.

    Each start and stop records the host range like any Task and, while the
    profiler records, a CUDA event on the stream; the GPU time between the
    two events becomes a range of category ``<domain>,gpu`` on the track of
    the stream (``GPU 0 stream 0``).  The stream must belong to the device
    current on the calling thread when the range starts (as
    cudaEventRecord requires).  Misuse and CUDA failures never raise from
    start/stop: a GPU range that cannot be timed is dropped with a warning.

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
        timing = _state().timing
        super().__init__(check_domain(domain, "Task"), name)
        self._stream = stream_handle(stream)
        self._gpu_id = _native.register(_native.KIND_GPU, domain._utf8, self._name.encode())
        self._timing = timing
        self._local = threading.local()

    @property
    def stream(self) -> int:
        """The handle of the stream it times."""
        return self._stream

    def _gpu_begin(self) -> _Span | None:
        if not flags_update(0, 0) & FLAG_RECORD:
            return None
        return self._timing.begin(self._gpu_id, self._stream)

    def _spans(self) -> list[_Span | None]:
        try:
            stack: list[_Span | None] = self._local.stack
        except AttributeError:
            stack = self._local.stack = []
        return stack

    def start(self) -> None:
        """Begin the range on the calling thread and on the stream."""
        if _begin(self._id):
            register_current()
        self._spans().append(self._gpu_begin())

    def stop(self) -> None:
        """End the innermost open range of this task on the calling thread and its stream."""
        stack = self._spans()
        span = stack.pop() if stack else None
        if span is not None:
            self._timing.end(span)
        if _end(self._id):
            register_current()

    def __enter__(self) -> GpuTask:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop()

    def __call__(self, fn: F) -> F:
        """Decorate fn so that every call of it is one range on the host and the stream.

        A coroutine function's GPU range spans from its call to its return,
        so it includes whatever else ran on the stream meanwhile.
        """
        if not callable(fn):
            raise TypeError(f"{type(self).__name__} decorates a callable, got {fn!r}")
        rid = self._id
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
                token = _begin_token(rid)
                if token & NEW_THREAD:
                    register_current()
                span = self._gpu_begin()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    if span is not None:
                        self._timing.end(span)
                    _end_token(rid, token)

            return timed_coroutine  # type: ignore[return-value]

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if _begin(rid):
                register_current()
            span = self._gpu_begin()
            try:
                return fn(*args, **kwargs)
            finally:
                if span is not None:
                    self._timing.end(span)
                _end(rid)

        return timed  # type: ignore[return-value]

    def __repr__(self) -> str:
        domain = self._domain.name if self._domain is not None else ""
        return f"GpuTask({domain!r}, {self._name!r}, stream={self._stream:#x})"


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
    state = _state()
    dom = DOMAIN if domain is None else check_domain(domain, "gpu_range")
    handle = stream_handle(stream)
    task = state.ranges.get((dom.name, name, handle))
    if task is None:
        task = GpuTask(dom, name, stream=handle)
        state.ranges[(dom.name, name, handle)] = task
    return task
