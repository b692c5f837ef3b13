"""CUDA through cuda-python: devices, tracked allocations, ranges timed on the GPU.

Install with ``pip install "mxprof[cuda]"`` (cuda-python 12.2 to 13.x): cuda-python
12.x runs on CUDA 12 drivers (>= 525), 13.x on CUDA 13 drivers (>= 580).  Importing this module
never imports cuda-python; the first call that needs CUDA does, once, and
keeps what it found.  Without cuda-python, a driver or a GPU, every entry
point raises :class:`mxprof.DeviceUnavailable` naming the reason and
:func:`available` is False; nothing else in mxprof depends on CUDA.

What is recorded:

- :func:`malloc` and :func:`malloc_async` allocations go to
  :mod:`mxprof.memory` on device ``gpu/N``, attributed to the current
  :func:`mxprof.scope` (``dumps()`` Memory section, ``Memory: gpu/N``
  counters, the GPU memory CSV written by :func:`mxprof.dump`).
- :func:`gpu_range` and ``mxprof.Task(domain, name, stream=s)`` time a span
  twice: on the host like any Task, and on the GPU by CUDA events recorded on
  the stream at its start and end.  The GPU span lands on a trace track of
  its own per device and stream (``GPU 0 stream 0``) with category
  ``<domain>,gpu``, and in the ``GPU (ms)`` column of ``dumps()``.

Timing.  The events of a GPU range are read late and without blocking:
before every trace write and every ``dumps()`` the ranges whose end event
has completed (``cudaEventQuery``) go into the core; the profile's last
write and :func:`synchronize` wait for the rest.  GPU times reach the host
clock through an *anchor* per device: an event recorded on a private idle
stream and waited for, with the host clock read as the wait returns.  A
range starts at ``anchor_ns + cudaEventElapsedTime(anchor, start)``.  A range
starting more than ``ANCHOR_PERIOD_NS`` after the anchor renews it, which
bounds the float32 rounding of elapsed times (about 0.06 us at 1 s) and
the drift between the GPU and host clocks.
"""

from __future__ import annotations

from ._devices import DeviceInfo, device_count, devices, memory_info, stream_handle
from ._memory import MemoryPool, free, free_async, malloc, malloc_async
from ._ranges import DOMAIN, GpuTask, gpu_range, synchronize
from ._runtime import CudaError, available, unavailable_reason

# Readable here; the timing reads its own (mxprof.cuda._timing), so set them there.
from ._timing import ANCHOR_PERIOD_NS as ANCHOR_PERIOD_NS
from ._timing import MAX_PENDING as MAX_PENDING

__all__ = [
    "DOMAIN",
    "CudaError",
    "DeviceInfo",
    "GpuTask",
    "MemoryPool",
    "available",
    "device_count",
    "devices",
    "free",
    "free_async",
    "gpu_range",
    "malloc",
    "malloc_async",
    "memory_info",
    "stream_handle",
    "synchronize",
    "unavailable_reason",
]
