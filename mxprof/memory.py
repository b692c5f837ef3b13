"""Memory attribution: allocations and frees, by device and by scope.

``record_alloc`` tells the profiler that some memory was taken on a device;
the allocation is attributed to the caller's current :func:`mxprof.scope`
(per thread and per asyncio task) and, optionally, a tag.  ``record_free``
gives it back.  The core keeps the table of live allocations and, per
device and per scope, the bytes in use (a counter sampled into the trace),
the peak, the total allocated and the counts, all under one lock.

Memory is recorded while the profiler runs with ``profile_memory`` on
(MXNet's default); paused, the books are still kept (so a free during a
pause finds its allocation) but no samples reach the trace.  Outside a run,
``record_alloc`` records nothing and returns 0, and never raises.

The outputs: the ``Memory`` section of :func:`mxprof.dumps`, ``C`` counter
tracks ``Memory: gpu/0`` (and one per scope) in the trace, allocation and
free instants with ``set_config(memory_events=True)``, and the GPU memory
CSV that :func:`mxprof.dump` writes (:func:`write_gpu_csv`).
"""

from __future__ import annotations

import csv
import io
import os
import re
from typing import NamedTuple, Union

from . import _native
from ._native import DEVICE_CPU, DEVICE_GPU, MEMORY_UNKNOWN, NEW_THREAD
from ._threads import register_current
from .scope import DEFAULT, current_scope, scope_id

__all__ = [
    "Allocation",
    "Usage",
    "check_size",
    "csv_path",
    "device_name",
    "leaks",
    "live",
    "used",
    "record_alloc",
    "record_free",
    "reset",
    "usage",
    "write_gpu_csv",
]

Device = Union[str, int]

CSV_HEADER = ("Attribute Name", "Requested Size", "Device", "Actual Size", "Reuse?")

_DEVICE_RE = re.compile(r"^(cpu|gpu|cuda)(?:[:/](\d+))?$")
_slots: dict[Device, int] = {}  # what callers pass -> the core's device slot
_names: dict[int, str] = {}  # slot -> "gpu/0"
_gpu_slots: set[int] = set()
_state = {"gpu_used": False}  # a GPU allocation was recorded (the CSV is due)
_ORDINALS = 2**32  # the core keeps a device's ordinal as a uint32


def _parse(device: Device) -> tuple[int, int]:
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise TypeError(
            f"device must be 'cpu', 'gpu:N' or an int GPU ordinal, got {type(device).__name__} "
            f"{device!r}"
        )
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device ordinal must be >= 0, got {device}")
        kind, ordinal = DEVICE_GPU, device
    else:
        m = _DEVICE_RE.match(device.strip().lower())
        if m is None:
            raise ValueError(
                f"device must be 'cpu', 'cpu:N', 'gpu:N', 'cuda:N' (or '/' for ':') or an int "
                f"GPU ordinal, got {device!r}"
            )
        kind = DEVICE_CPU if m.group(1) == "cpu" else DEVICE_GPU
        ordinal = int(m.group(2) or 0)
    if ordinal >= _ORDINALS:
        where = "" if isinstance(device, int) else f" in {device!r}"
        raise ValueError(f"device ordinal must be within 0 .. 2**32 - 1, got {ordinal}{where}")
    return kind, ordinal


def _slot(device: Device) -> int:
    slot = _slots.get(device)
    if slot is None:
        kind, ordinal = _parse(device)
        slot = _native.memory_device(kind, ordinal, f"device {device!r}")
        _slots[device] = slot
        _names[slot] = f"{'gpu' if kind == DEVICE_GPU else 'cpu'}/{ordinal}"
        if kind == DEVICE_GPU:
            _gpu_slots.add(slot)
    return slot


def device_name(device: Device) -> str:
    """The profiler's name of a device: ``'gpu/0'``, ``'cpu/0'``.

    Example:
        >>> from mxprof import memory
        >>> memory.device_name("cuda:1"), memory.device_name(0), memory.device_name("cpu")
        ('gpu/1', 'gpu/0', 'cpu/0')
    """
    return _names[_slot(device)]


def _tag(tag: str) -> int:
    """A tag is interned as a scope name is ("" is id 0, as ``<unk>:``)."""
    if not isinstance(tag, str):
        raise TypeError(f"tag must be a str, got {type(tag).__name__} {tag!r}")
    return scope_id(tag) if tag else 0


def check_size(what: str, value: object) -> int:
    """value when it is an int number of bytes within 0 .. 2**63 - 1, else
    TypeError / ValueError naming what.  Example: ``check_size("nbytes", 4096)``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{what} must be an int number of bytes, got {type(value).__name__} {value!r}"
        )
    if not 0 <= value < 2**63:
        raise ValueError(f"{what} must be >= 0 and < 2**63, got {value}")
    return value


def _ptr(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"ptr must be an int address or handle, got {type(value).__name__} {value!r}"
        )
    if not 0 <= value < 2**64:
        raise ValueError(f"ptr must be within 0 .. 2**64 - 1, got {value}")
    return value


def record_alloc(
    nbytes: int,
    device: Device = "cpu",
    ptr: int | None = None,
    tag: str = "",
    *,
    actual: int | None = None,
    reuse: bool = False,
) -> int:
    """Record an allocation of ``nbytes`` on ``device`` by the current scope.

    Args:
        nbytes: bytes requested.
        device: ``'cpu'``, ``'gpu:N'`` / ``'cuda:N'`` / ``'gpu/N'``, or an int
            GPU ordinal (N within 0 .. 2**32 - 1).
        ptr: the allocation's address, to free it by; without one a handle
            is made and returned.  An address still live is first freed
            (its free was missed).
        tag: what the memory is for (``'weight'``); the CSV's attribute is
            the scope followed by the tag.
        actual: bytes the allocator really took (its rounding); the bytes in
            use count this.  Defaults to ``nbytes``.
        reuse: the allocator served it from its cache (the CSV's ``Reuse?``).

    Returns:
        ``ptr``, or the new handle; 0 when memory is not being recorded
        (the profiler is not running or ``profile_memory`` is off).

    Raises:
        TypeError, ValueError: a bad size, device, pointer or tag (nothing
            recorded).

    Example:
        >>> import mxprof
        >>> from mxprof import memory
        >>> mxprof.set_state("run")
        >>> with mxprof.scope("encoder"):
        ...     h = memory.record_alloc(4096, "gpu:0", tag="weight")
        >>> [(u.name, u.current) for u in memory.usage() if u.current]
        [('gpu/0', 4096), ('encoder:', 4096)]
        >>> memory.record_free(h)
        True
        >>> mxprof.set_state("stop")
    """
    nbytes = check_size("nbytes", nbytes)
    taken = nbytes if actual is None else check_size("actual", actual)
    address = 0 if ptr is None else _ptr(ptr)
    if ptr is not None and address == 0:
        raise ValueError("ptr must not be 0 (pass None to get a handle)")
    slot = _slot(device)
    tag_id = _tag(tag)
    rc, handle = _native.memory_alloc(
        address, nbytes, taken, slot, scope_id(current_scope()), tag_id, reuse
    )
    if rc == NEW_THREAD:  # the first call this thread makes into the core
        register_current()
    elif rc:  # memory is not being recorded
        return 0
    if slot in _gpu_slots:
        _state["gpu_used"] = True
    return address or handle


def record_free(ptr: int) -> bool:
    """Record the free of an address (or handle) from :func:`record_alloc`.

    Any thread may free what another allocated.  A pointer with no live
    allocation is not an error: it is counted (``unknown_frees`` in the
    ``Profiler`` section of :func:`mxprof.dumps` and the trace's
    ``otherData``) and False comes back.  ``record_free(0)`` does nothing.
    """
    address = _ptr(ptr)
    if address == 0:
        return False
    rc = _native.memory_free(address)
    if rc & NEW_THREAD:  # the first call this thread makes into the core
        register_current()
    return not rc & MEMORY_UNKNOWN


class Allocation(NamedTuple):
    """One live allocation."""

    ptr: int
    nbytes: int
    actual: int
    device: str  # 'gpu/0'
    scope: str  # '<unk>:' when none was set
    tag: str
    reuse: bool

    @property
    def attribute(self) -> str:
        """The CSV's attribute name: scope followed by tag."""
        return self.scope + self.tag


class Usage(NamedTuple):
    """Memory use of one device or one scope since the statistics began."""

    kind: str  # 'device' or 'scope'
    name: str  # 'gpu/0', or the scope's name
    current: int  # bytes in use now
    peak: int  # most bytes in use at once
    allocated: int  # bytes allocated in all
    allocs: int
    frees: int
    counter: int  # the core's id of its counter


def _name_of(oid: int) -> str:
    return DEFAULT if oid == 0 else _native.object_info(oid).name


def _slot_name(slot: int) -> str:
    name = _names.get(slot)
    if name is None:  # registered by native code: its counter is "Memory: <name>"
        for s in _native.memory_usage():
            if not s.is_scope and s.key == slot:
                name = _native.object_info(s.counter).name.removeprefix("Memory: ")
                _names[slot] = name
                break
        else:
            name = f"device {slot}"
    return name


def live() -> list[Allocation]:
    """Every allocation recorded and not yet freed, in no particular order."""
    return [
        Allocation(
            ptr,
            nbytes,
            actual,
            _slot_name(device),
            _name_of(scope),
            "" if tag == 0 else _native.object_info(tag).name,
            reuse,
        )
        for ptr, nbytes, actual, device, scope, tag, reuse in _native.memory_live()
    ]


def usage() -> list[Usage]:
    """Devices (in order of first use), then scopes (likewise)."""
    out = []
    for s in _native.memory_usage():
        if s.is_scope:
            kind, name = "scope", _name_of(s.key)
        else:
            kind, name = "device", _slot_name(s.key)
        out.append(Usage(kind, name, s.current, s.peak, s.allocated, s.allocs, s.frees, s.counter))
    return out


def leaks() -> list[dict[str, object]]:
    """The leaks ``memory_steps``' leak rule flagged in this process since its
    profile began, oldest first (docs/memory.md): ``process`` (``main (pid
    N)``, ``DataLoader worker K (pid N)``, ``child NAME (pid N)``),
    ``series`` (``rss``, ``uss``, ``cuda:N allocated``), ``rate_per_step``,
    ``steps``, ``from_bytes``, ``to_bytes``, ``scope`` and ``scope_growth``
    (the scope that grew most over the window), ``copy_on_read``
    (``shared_lost``, ``private_gained``, or None) and ``sites``
    (``[file:line, bytes per step]`` once tracemalloc's steps are over, else
    None).

    Example:
        >>> from mxprof import memory
        >>> memory.leaks()
        []
    """
    from . import _memstep  # above this module's level: imported when asked

    return _memstep.leaks()


def used() -> bool:
    """Whether anything was recorded through this module in this process
    (``usage`` copies the core's table: a caller on a regular beat asks this first)."""
    return bool(_slots)


def reset() -> None:
    """Forget that a GPU allocation was recorded (no CSV is due until the
    next); the core's own tables are reset with the core (``mxprof._testing``)."""
    _state["gpu_used"] = False


def csv_path(prefix: str) -> str:
    """``<prefix>-pid_<pid>.csv``, MXNet's name for the GPU memory profile."""
    return f"{prefix}-pid_{os.getpid()}.csv"


def gpu_csv_text() -> str | None:
    """The GPU memory CSV of the live GPU allocations; None when no GPU
    allocation was ever recorded."""
    if not _state["gpu_used"]:
        return None
    rows = [
        (a.attribute, a.nbytes, int(a.device.split("/")[1]), a.actual, int(a.reuse))
        for a in live()
        if a.device.startswith("gpu/")
    ]
    rows.sort()
    text = io.StringIO()
    writer = csv.writer(text, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    writer.writerows(rows)
    return text.getvalue()


def write_gpu_csv(prefix: str) -> str | None:
    """Write the GPU memory CSV next to ``prefix``; return its path.

    One row per live GPU allocation, sorted by attribute: the attribute
    (scope + tag), the bytes requested, the GPU ordinal, the bytes taken and
    whether the allocator reused cached memory (1/0), every value quoted as
    MXNet wrote them.  The file is replaced whole (written aside, then
    renamed), so a reader never sees half of it.  None, and no file, when no
    GPU device was recorded on.
    """
    text = gpu_csv_text()
    if text is None:
        return None
    path = csv_path(prefix)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.replace(tmp, path)
    return path
