"""Tracked allocations: cudaMalloc and stream-ordered pools, recorded in mxprof.memory."""

from __future__ import annotations

from typing import Any, Callable

from .. import memory
from ._devices import check_ordinal, on_device, stream_handle
from ._runtime import runtime_state


def _nbytes(value: object) -> int:
    size = memory.check_size("nbytes", value)
    if size == 0:
        raise ValueError("nbytes must be > 0")
    return size


def _record(nbytes: int, ordinal: int, ptr: int, tag: str, undo: Callable[[], None]) -> int:
    # After the allocation succeeded; should recording refuse it, give it back.
    try:
        memory.record_alloc(nbytes, ordinal, ptr=ptr, tag=tag)
    except BaseException:
        undo()
        raise
    return ptr


def _check_tag(tag: object) -> None:
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str, got {type(tag).__name__} {tag!r}")


def malloc(nbytes: int, device: int = 0, tag: str = "") -> int:
    """cudaMalloc on a GPU, recorded in :mod:`mxprof.memory` for the current scope.

    Args:
        nbytes: bytes to allocate (> 0).
        device: the GPU ordinal; the calling thread's current device is
            left as it was.
        tag: what the memory is for; the GPU memory CSV's attribute is the
            scope followed by the tag.

    Returns:
        The device pointer; give it back with :func:`free`.

    Raises:
        DeviceUnavailable: no CUDA, or no such GPU.
        CudaError: cudaMalloc failed (nothing is recorded).

    Example:
        >>> import mxprof
        >>> from mxprof import cuda
        >>> with mxprof.scope("encoder"):  # doctest: +SKIP
        ...     ptr = cuda.malloc(1 << 20, tag="weight")
        >>> cuda.free(ptr)  # doctest: +SKIP
    """
    backend = runtime_state().backend
    size = _nbytes(nbytes)
    _check_tag(tag)
    ordinal = check_ordinal(backend, device)
    with on_device(backend, ordinal):
        ptr = backend.malloc(size)
    return _record(size, ordinal, ptr, tag, lambda: backend.free(ptr))


def free(ptr: int) -> None:
    """Record the free of a :func:`malloc` pointer, then cudaFree it.

    The free is recorded first, so that another thread's allocation at the
    same address is never mistaken for this one.

    Raises:
        DeviceUnavailable: no CUDA.
        CudaError: cudaFree failed.

    Example:
        >>> from mxprof import cuda
        >>> cuda.free(cuda.malloc(4096))  # doctest: +SKIP
    """
    backend = runtime_state().backend
    memory.record_free(ptr)
    backend.free(ptr)


class MemoryPool:
    """A CUDA stream-ordered memory pool on one GPU, for ``malloc_async(pool=...)``.

    ``MemoryPool(device)`` creates a pool (cudaMemPoolCreate) that
    :meth:`close` destroys; :meth:`default` wraps a device's default pool,
    which is never destroyed.

    Example:
        >>> from mxprof import cuda
        >>> with cuda.MemoryPool(0) as pool:  # doctest: +SKIP
        ...     ptr = cuda.malloc_async(1 << 20, stream=0, pool=pool)
        ...     cuda.free_async(ptr, stream=0)
    """

    __slots__ = ("device", "handle", "_backend", "_owned")

    def __init__(self, device: int = 0) -> None:
        backend = runtime_state().backend
        self.device = check_ordinal(backend, device)
        self._backend = backend
        self._owned = True
        self.handle: Any = backend.pool_create(self.device)

    @classmethod
    def default(cls, device: int = 0) -> MemoryPool:
        """The default pool of a GPU (what cudaMallocAsync uses).

        Example: ``cuda.MemoryPool.default(0).usage()``.
        """
        state = runtime_state()
        pool = cls.__new__(cls)
        pool.device = check_ordinal(state.backend, device)
        pool._backend = state.backend
        pool._owned = False
        pool.handle = state.default_pool(pool.device)
        return pool

    def usage(self) -> tuple[int, int]:
        """``(used, reserved)`` bytes of the pool now.

        Example: ``used, reserved = pool.usage()``.
        """
        return self._backend.pool_usage(self.handle)

    def close(self) -> None:
        """Destroy a pool this object created; nothing for a default pool.

        Example: ``pool.close()``.
        """
        if self._owned and self.handle is not None:
            handle, self.handle = self.handle, None
            self._backend.pool_destroy(handle)

    def __enter__(self) -> MemoryPool:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MemoryPool(device={self.device}, {'created' if self._owned else 'default'})"


def malloc_async(
    nbytes: int,
    stream: Any,
    device: int | None = None,
    tag: str = "",
    pool: MemoryPool | None = None,
) -> int:
    """Stream-ordered allocation (cudaMallocFromPoolAsync), recorded like :func:`malloc`.

    Args:
        nbytes: bytes to allocate (> 0).
        stream: the stream ordering it (an int handle, a cuda-python stream,
            or an object with ``__cuda_stream__``, ``cuda_stream`` or ``ptr``).
        device: the GPU whose default pool serves it (default 0, or the
            pool's device).
        tag: what the memory is for.
        pool: a :class:`MemoryPool` to allocate from instead.

    Returns:
        The device pointer; give it back with :func:`free_async`.

    Raises:
        DeviceUnavailable: no CUDA, or no such GPU.
        CudaError: the allocation failed (nothing is recorded).

    Example:
        >>> from mxprof import cuda
        >>> ptr = cuda.malloc_async(1 << 20, stream=0, tag="activations")  # doctest: +SKIP
        >>> cuda.free_async(ptr, stream=0)  # doctest: +SKIP
    """
    state = runtime_state()
    backend = state.backend
    size = _nbytes(nbytes)
    _check_tag(tag)
    handle = stream_handle(stream)
    if pool is None:
        ordinal = check_ordinal(backend, 0 if device is None else device)
        pool_handle = state.default_pool(ordinal)
    else:
        if not isinstance(pool, MemoryPool):
            raise TypeError(f"pool must be a cuda.MemoryPool, got {type(pool).__name__}")
        if device is not None and device != pool.device:
            raise ValueError(f"device {device} differs from the pool's device {pool.device}")
        if pool.handle is None:
            raise ValueError("the pool is closed")
        ordinal, pool_handle = pool.device, pool.handle
    ptr = backend.malloc_async(size, pool_handle, handle)
    return _record(size, ordinal, ptr, tag, lambda: backend.free_async(ptr, handle))


def free_async(ptr: int, stream: Any) -> None:
    """Record the free of a :func:`malloc_async` pointer, then cudaFreeAsync it on stream.

    Raises:
        DeviceUnavailable: no CUDA.
        CudaError: cudaFreeAsync failed.

    Example:
        >>> from mxprof import cuda
        >>> cuda.free_async(cuda.malloc_async(4096, stream=0), stream=0)  # doctest: +SKIP
    """
    backend = runtime_state().backend
    handle = stream_handle(stream)
    memory.record_free(ptr)
    backend.free_async(ptr, handle)
