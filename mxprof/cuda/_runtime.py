"""The CUDA backend and whether it can be used.

cuda-python sits behind one object (:class:`_Runtime`, the :class:`Backend`
protocol); the probe loads it once and, when CUDA is unusable, says why.
Every entry point that needs CUDA starts with :func:`runtime_state`, which returns
what the probe left (or raises its reason).
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

from .._session import SESSION
from ..errors import DeviceUnavailable, ProfilerError
from ._timing import Timing

if TYPE_CHECKING:
    from ._ranges import GpuTask

_DRIVER_FLOOR = "CUDA 13 needs a driver >= 580, CUDA 12 >= 525"


class CudaError(ProfilerError):
    """A CUDA call failed; ``call`` and ``error`` (e.g. ``cudaErrorMemoryAllocation``) say which.

    Example:
        >>> from mxprof import cuda
        >>> str(cuda.CudaError("cudaMalloc", "cudaErrorMemoryAllocation", "out of memory"))
        'cudaMalloc failed: cudaErrorMemoryAllocation (out of memory)'
    """

    def __init__(self, call: str, error: str, text: str = "") -> None:
        super().__init__(f"{call} failed: {error}" + (f" ({text})" if text else ""))
        self.call = call
        self.error = error


# ---- the backend: the few cuda-python calls made, behind one object ----


class Backend(Protocol):
    """What mxprof asks of CUDA; CUDA's failures leave as CudaError."""

    def device_count(self) -> int: ...
    def properties(self, ordinal: int) -> tuple[str, int, int, int]: ...
    def current_device(self) -> int: ...
    def set_device(self, ordinal: int) -> None: ...
    def mem_info(self) -> tuple[int, int]: ...
    def malloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def default_pool(self, ordinal: int) -> Any: ...
    def pool_create(self, ordinal: int) -> Any: ...
    def pool_destroy(self, pool: Any) -> None: ...
    def pool_usage(self, pool: Any) -> tuple[int, int]: ...
    def malloc_async(self, nbytes: int, pool: Any, stream: int) -> int: ...
    def free_async(self, ptr: int, stream: int) -> None: ...
    def stream_create(self) -> int: ...
    def event_create(self) -> Any: ...
    def event_destroy(self, event: Any) -> None: ...
    def event_record(self, event: Any, stream: int) -> None: ...
    def event_done(self, event: Any) -> bool: ...
    def event_wait(self, event: Any) -> None: ...
    def elapsed_ms(self, start: Any, end: Any) -> float: ...


class _Runtime:
    """Backend over cuda-python's runtime module (calls return ``(err, *values)``)."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self.success = rt.cudaError_t.cudaSuccess
        self.not_ready = rt.cudaError_t.cudaErrorNotReady

    def error(self, call: str, err: Any) -> CudaError:
        name = getattr(err, "name", None) or f"cudaError {int(err)}"
        try:
            text = self.rt.cudaGetErrorString(err)[1].decode("utf-8", "replace")
        except Exception:  # the name alone still says what failed
            text = ""
        return CudaError(call, name, text)

    def call(self, name: str, *args: Any) -> tuple[Any, ...]:
        out = getattr(self.rt, name)(*args)
        if out[0] != self.success:
            raise self.error(name, out[0])
        return tuple(out[1:])

    def device_count(self) -> int:
        return int(self.call("cudaGetDeviceCount")[0])

    def properties(self, ordinal: int) -> tuple[str, int, int, int]:
        (prop,) = self.call("cudaGetDeviceProperties", ordinal)
        raw = prop.name
        name = raw.split(b"\0", 1)[0].decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        return str(name), int(prop.totalGlobalMem), int(prop.major), int(prop.minor)

    def current_device(self) -> int:
        return int(self.call("cudaGetDevice")[0])

    def set_device(self, ordinal: int) -> None:
        self.call("cudaSetDevice", ordinal)

    def mem_info(self) -> tuple[int, int]:
        free, total = self.call("cudaMemGetInfo")
        return int(free), int(total)

    def malloc(self, nbytes: int) -> int:
        return int(self.call("cudaMalloc", nbytes)[0])

    def free(self, ptr: int) -> None:
        self.call("cudaFree", ptr)

    def default_pool(self, ordinal: int) -> Any:
        return self.call("cudaDeviceGetDefaultMemPool", ordinal)[0]

    def pool_create(self, ordinal: int) -> Any:
        rt = self.rt
        props = rt.cudaMemPoolProps()
        props.allocType = rt.cudaMemAllocationType.cudaMemAllocationTypePinned
        props.location.type = rt.cudaMemLocationType.cudaMemLocationTypeDevice
        props.location.id = ordinal
        return self.call("cudaMemPoolCreate", props)[0]

    def pool_destroy(self, pool: Any) -> None:
        self.call("cudaMemPoolDestroy", pool)

    def pool_usage(self, pool: Any) -> tuple[int, int]:
        attr = self.rt.cudaMemPoolAttr
        (used,) = self.call("cudaMemPoolGetAttribute", pool, attr.cudaMemPoolAttrUsedMemCurrent)
        (held,) = self.call("cudaMemPoolGetAttribute", pool, attr.cudaMemPoolAttrReservedMemCurrent)
        return int(used), int(held)

    def malloc_async(self, nbytes: int, pool: Any, stream: int) -> int:
        return int(self.call("cudaMallocFromPoolAsync", nbytes, pool, stream)[0])

    def free_async(self, ptr: int, stream: int) -> None:
        self.call("cudaFreeAsync", ptr, stream)

    def stream_create(self) -> int:
        return int(self.call("cudaStreamCreateWithFlags", self.rt.cudaStreamNonBlocking)[0])

    def event_create(self) -> Any:
        return self.call("cudaEventCreateWithFlags", self.rt.cudaEventDefault)[0]

    def event_destroy(self, event: Any) -> None:
        self.call("cudaEventDestroy", event)

    def event_record(self, event: Any, stream: int) -> None:
        self.call("cudaEventRecord", event, stream)

    def event_done(self, event: Any) -> bool:
        (err,) = self.rt.cudaEventQuery(event)
        if err == self.not_ready:
            return False
        if err != self.success:
            raise self.error("cudaEventQuery", err)
        return True

    def event_wait(self, event: Any) -> None:
        self.call("cudaEventSynchronize", event)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self.call("cudaEventElapsedTime", start, end)[0])


# ---- the probe: is CUDA usable here, and if not, why ----


def _import_runtime() -> Any:
    try:
        return importlib.import_module("cuda.bindings.runtime")
    except ImportError:
        return importlib.import_module("cuda.cudart")  # cuda-python 12.2 .. 12.5


def _version(call: Callable[[], Any]) -> int:
    try:
        err, value = call()
        return int(value) if int(err) == 0 else 0
    except Exception:
        return 0


def _no_device(what: str) -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    return f"cudaErrorNoDevice: {what}; no CUDA GPU is visible to this process{where}"


def _diagnose(rt: Any) -> str | None:
    """Why CUDA cannot be used through rt, or None when it can."""
    try:
        err, count = rt.cudaGetDeviceCount()
    except RuntimeError as e:  # cuda-python <= 12.6 raises when it cannot load libcuda
        return f"the CUDA driver library libcuda.so.1 is missing or cannot be loaded ({e})"
    name = getattr(err, "name", str(err))
    if name == "cudaSuccess":
        return None if count > 0 else _no_device("cudaGetDeviceCount found 0 devices")
    if name == "cudaErrorNoDevice":
        return _no_device("cudaGetDeviceCount failed")
    if name == "cudaErrorInsufficientDriver":
        driver = _version(rt.cudaDriverGetVersion)
        if driver == 0:
            return (
                "no CUDA driver: libcuda.so.1 is missing or cannot be loaded "
                "(cudaGetDeviceCount: cudaErrorInsufficientDriver, cudaDriverGetVersion: none)"
            )
        runtime = _version(rt.cudaRuntimeGetVersion)
        major = driver // 1000
        return (
            f"cudaErrorInsufficientDriver: the driver supports CUDA {major}."
            f"{driver % 1000 // 10}, older than cuda-python's CUDA {runtime // 1000}."
            f"{runtime % 1000 // 10} ({_DRIVER_FLOOR}); upgrade the driver or "
            f'pip install "cuda-python>={major},<{major + 1}"'
        )
    text = rt.cudaGetErrorString(err)[1].decode("utf-8", "replace")
    return f"{name} from cudaGetDeviceCount: {text}"


# ---- the state: probed once, cached for the process ----


class RuntimeState:
    """What a usable backend brings: the backend, its GPU ranges, caches."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.timing = Timing(backend)
        self.ranges: dict[tuple[str, str, int], GpuTask] = {}
        self._pools: dict[int, Any] = {}

    def default_pool(self, ordinal: int) -> Any:
        pool = self._pools.get(ordinal)
        if pool is None:
            pool = self._pools[ordinal] = self.backend.default_pool(ordinal)
        return pool


_probe_lock = threading.Lock()
_result: tuple[RuntimeState | None, str | None] | None = None  # None until probed


def _load() -> tuple[RuntimeState | None, str | None]:
    try:
        rt = _import_runtime()
    except ImportError as e:
        return None, f'cuda-python cannot be imported ({e}): pip install "mxprof[cuda]"'
    except Exception as e:  # a broken installation
        return None, f"cuda-python is installed but fails to import: {e!r}"
    try:
        reason = _diagnose(rt)
    except Exception as e:
        reason = f"the CUDA probe failed: {e!r}"
    return (None, reason) if reason is not None else (RuntimeState(_Runtime(rt)), None)


def _probe() -> tuple[RuntimeState | None, str | None]:
    global _result
    result = _result
    if result is None:
        with _probe_lock:
            if _result is None:
                _result = _load()
            result = _result
    return result


def runtime_state() -> RuntimeState:
    """What the probe found (backend, timing, ranges), probing once; raises
    DeviceUnavailable with the probe's reason where there is no CUDA.
    Example: ``runtime_state().timing.resolve(wait=True)``."""
    state, reason = _probe()
    if state is None:
        raise DeviceUnavailable(f"CUDA is not available: {reason}")
    return state


def available() -> bool:
    """Whether CUDA can be used: cuda-python, a driver and at least one GPU.

    The first call probes (loading cuda-python and the driver); later calls
    return what it found.  Never raises.

    Example:
        >>> from mxprof import cuda
        >>> if not cuda.available():
        ...     print("no GPU:", cuda.unavailable_reason())  # doctest: +SKIP
    """
    return _probe()[0] is not None


def unavailable_reason() -> str | None:
    """Why CUDA cannot be used here (the message of DeviceUnavailable), or None.

    Example:
        >>> from mxprof import cuda
        >>> cuda.unavailable_reason()  # doctest: +SKIP
        'no CUDA driver: libcuda.so.1 is missing or cannot be loaded (...)'
    """
    return _probe()[1]


# ---- process hooks: trace writes resolve GPU ranges, a forked child loses CUDA ----


def _sync_hook(final: bool) -> None:
    """Before each trace write and dumps(): resolve the finished GPU ranges."""
    result = _result
    if result is not None and result[0] is not None and result[0].timing.pending:
        result[0].timing.resolve(wait=final)


SESSION.add_write_hook(_sync_hook)


def _after_fork_in_child() -> None:
    global _result
    if _result is not None and _result[0] is not None:
        _result[0].timing.alive = False
        _result[0].timing.pending = []
        _result = (
            None,
            "CUDA was initialised before this process was forked; a forked "
            "child cannot use it (use the 'spawn' start method)",
        )


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
