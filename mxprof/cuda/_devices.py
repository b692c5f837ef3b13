"""Devices: the visible GPUs, their memory, and the forms a stream handle comes in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

from ..errors import DeviceUnavailable
from ._runtime import Backend, runtime_state


class DeviceInfo(NamedTuple):
    """One GPU: its ordinal, name, memory in bytes and compute capability."""

    ordinal: int
    name: str
    total_memory: int
    compute_capability: tuple[int, int]


def check_ordinal(backend: Backend, device: object) -> int:
    """device when it is the ordinal of a visible GPU, else TypeError /
    DeviceUnavailable.  Example: ``check_ordinal(backend, 0)``."""
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(
            f"device must be an int GPU ordinal, got {type(device).__name__} {device!r}"
        )
    count = backend.device_count()
    if not 0 <= device < count:
        raise DeviceUnavailable(
            f"there is no GPU {device}: {count} visible (ordinals 0..{count - 1})"
        )
    return device


@contextlib.contextmanager
def on_device(backend: Backend, ordinal: int) -> Iterator[None]:
    """Make ordinal the calling thread's current device for a while."""
    before = backend.current_device()
    if before == ordinal:
        yield
        return
    backend.set_device(ordinal)
    try:
        yield
    finally:
        backend.set_device(before)


def device_count() -> int:
    """How many GPUs this process sees.

    Raises:
        DeviceUnavailable: no cuda-python, driver or GPU (the message says which).

    Example:
        >>> from mxprof import cuda
        >>> cuda.device_count()  # doctest: +SKIP
        8
    """
    return runtime_state().backend.device_count()


def devices() -> list[DeviceInfo]:
    """Every visible GPU, by ordinal.

    Raises:
        DeviceUnavailable: no cuda-python, driver or GPU.

    Example:
        >>> from mxprof import cuda
        >>> [d.name for d in cuda.devices()]  # doctest: +SKIP
        ['NVIDIA H200']
    """
    backend = runtime_state().backend
    out = []
    for i in range(backend.device_count()):
        name, total, major, minor = backend.properties(i)
        out.append(DeviceInfo(i, name, total, (major, minor)))
    return out


def memory_info(device: int = 0) -> tuple[int, int]:
    """``(free, total)`` bytes of one GPU (cudaMemGetInfo: all processes' use counts).

    Raises:
        DeviceUnavailable: no CUDA, or no such GPU.

    Example:
        >>> from mxprof import cuda
        >>> free, total = cuda.memory_info(0)  # doctest: +SKIP
    """
    backend = runtime_state().backend
    with on_device(backend, check_ordinal(backend, device)):
        return backend.mem_info()


def stream_handle(stream: Any) -> int:
    """The integer handle of a CUDA stream given in any of the usual forms.

    Accepts an int (0 is the legacy default stream), a cuda-python
    ``cudaStream_t``/``CUstream``, or an object with ``__cuda_stream__()``
    (cuda.core), ``cuda_stream`` (PyTorch) or ``ptr`` (CuPy).

    Example:
        >>> from mxprof import cuda
        >>> cuda.stream_handle(0), cuda.stream_handle(0x7F00)
        (0, 32512)
    """
    if isinstance(stream, bool):
        raise TypeError("stream must be a CUDA stream or an int handle, got a bool")
    if isinstance(stream, int):
        value = stream
    elif hasattr(stream, "__cuda_stream__"):
        value = stream.__cuda_stream__()[1]
    elif isinstance(getattr(stream, "cuda_stream", None), int):
        value = stream.cuda_stream
    elif isinstance(getattr(stream, "ptr", None), int):
        value = stream.ptr
    else:
        try:
            value = int(stream)
        except (TypeError, ValueError):
            raise TypeError(
                f"stream must be a CUDA stream or an int handle, got {type(stream).__name__} "
                f"{stream!r}"
            ) from None
    if not 0 <= value < 2**64:
        raise ValueError(f"stream handle must be within 0 .. 2**64 - 1, got {value}")
    return int(value)
