"""The native tier: the only importer of the compiled core (``ffi``, ``lib``).

Three tiers, as in PyNaCl: the C API declared in ``native/include/mxprof.h``,
this module, and the public objects above it.  Nothing above this module
imports ``lib`` or ``ffi`` (``tools/structure_metrics.py`` counts them).  This
module offers two kinds of names:

- **Hot path: bindings.**  ``range_enter``, ``counter_add``, ``marker_mark``
  ... are the cffi functions themselves, bound here once.  They never raise
  because of the profiler's state and return the core's code as is: 0, or
  ``NEW_THREAD`` (bit 0: the first call on this thread, after which the
  caller runs ``_threads.register_current()``), and for the enter/exit calls
  ``IN_LOOP``.  A caller that runs them per event binds them as module
  globals (``from ._native import range_enter``): a lookup on cffi's ``lib``
  costs more than the call's own overhead in CPython.
- **Control plane: checked wrappers.**  One function per C call that
  configures, reads or writes (``profile_begin``, ``memory_device``,
  ``stats_snapshot`` ...), with one return-code policy: a negative code goes
  through :func:`check`, which raises ``ConfigError`` (MXP_E_INVALID),
  ``StateError`` (MXP_E_STATE) or ``ProfilerError`` (the rest), naming what
  was asked.  Where a negative code is an answer the caller acts on rather
  than a failure, the wrapper returns it, and its docstring says which
  (``trace_flush``, ``trace_path_set``, ``trace_format``, ``memory_alloc``,
  ``ring_trim``, ``snapshot_write``).

Calls that return only a value (``clock_ns``, ``trace_pending``) are bound
as they are.  The test seams (fake clock, reset) stand at the end.
"""

from __future__ import annotations

import errno as _errno
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Callable, NamedTuple, TypeVar

from ._tallies import TALLIES
from .errors import ConfigError, ProfilerError, StateError

try:
    from ._mxprof_native import ffi, lib
except ImportError as e:  # pragma: no cover - depends on how mxprof was installed
    raise ImportError(
        f"mxprof's compiled core is missing from {os.path.dirname(__file__)}: this looks "
        "like the source tree, which has no compiled core unless installed with "
        "'pip install -e .'.  Install mxprof ('pip install .') and import it from "
        "another directory."
    ) from e

lib.mxp_init()

__all__ = [
    "COUNT_FIELDS",
    "MemoryStat",
    "ObjectInfo",
    "Stat",
    "check",
    "counts",
    "ffi",
    "lib",
    "object_info",
    "object_names",
    "read_all",
    "register",
    "stats_counts",
    "stats_snapshot",
    "strerror",
    "utf8",
]

# ---- codes and constants (mxprof.h) ----

OK = lib.MXP_OK
NEW_THREAD = lib.MXP_NEW_THREAD  # a hot call's code (a token's bit 0): first call on this thread
IN_LOOP = lib.MXP_IN_LOOP  # range_enter/frame_enter/range_exit: an asyncio loop runs here
E_INVALID = lib.MXP_E_INVALID
E_NOMEM = lib.MXP_E_NOMEM
E_IO = lib.MXP_E_IO
E_STATE = lib.MXP_E_STATE
E_FULL = lib.MXP_E_FULL

KIND_TASK = lib.MXP_KIND_TASK
KIND_FRAME = lib.MXP_KIND_FRAME
KIND_EVENT = lib.MXP_KIND_EVENT
KIND_COUNTER = lib.MXP_KIND_COUNTER
KIND_MARKER = lib.MXP_KIND_MARKER
KIND_SCOPE = lib.MXP_KIND_SCOPE
KIND_ALLOC = lib.MXP_KIND_ALLOC
KIND_FREE = lib.MXP_KIND_FREE
KIND_GPU = lib.MXP_KIND_GPU

FLAG_RECORD = lib.MXP_FLAG_RECORD
FLAG_TRACE = lib.MXP_FLAG_TRACE
FLAG_AGGREGATE = lib.MXP_FLAG_AGGREGATE
FLAG_MEMORY = lib.MXP_FLAG_MEMORY
FLAG_MEMORY_EVENTS = lib.MXP_FLAG_MEMORY_EVENTS
FLAG_NVTX = lib.MXP_FLAG_NVTX

DEVICE_CPU = lib.MXP_DEVICE_CPU
DEVICE_GPU = lib.MXP_DEVICE_GPU
MEMORY_UNKNOWN = lib.MXP_MEMORY_UNKNOWN  # or'ed into memory_free's code: no such allocation

FORMAT_JSON = lib.MXP_FORMAT_JSON
FORMAT_JSON_GZ = lib.MXP_FORMAT_JSON_GZ
FORMAT_PERFETTO = lib.MXP_FORMAT_PERFETTO

# ---- hot path: the cffi functions, bound once (see the module docstring) ----

range_enter = lib.mxp_range_enter
frame_enter = lib.mxp_frame_enter
range_exit = lib.mxp_range_exit
range_begin_token = lib.mxp_range_begin_token
range_end_token = lib.mxp_range_end_token
track_begin = lib.mxp_track_begin
track_end = lib.mxp_track_end
range_add = lib.mxp_range_add
counter_init = lib.mxp_counter_init
counter_set = lib.mxp_counter_set
counter_add = lib.mxp_counter_add
counter_sub = lib.mxp_counter_sub
counter_add_wide = lib.mxp_counter_add_wide
counter_saturate = lib.mxp_counter_saturate
counter_value = lib.mxp_counter_value
marker_mark = lib.mxp_marker_mark
scope_set = lib.mxp_scope_set
memory_free = lib.mxp_memory_free  # NEW_THREAD and MEMORY_UNKNOWN bits
flags_update = lib.mxp_flags_update  # (0, 0) reads the flags
thread_tid = lib.mxp_thread_tid
thread_loop_set = lib.mxp_thread_loop_set
# Its codes are not checked: names are pushed at every trace write, also
# from a signal handler; a name the core cannot keep leaves the old one.
thread_name_set = lib.mxp_thread_name_set
track_close = lib.mxp_track_close  # E_INVALID only for a tid that is not open

# ---- values only (no error codes) ----

clock_ns = lib.mxp_clock_ns
clock_wall_ns = lib.mxp_clock_wall_ns
profile_epoch_ns = lib.mxp_profile_epoch_ns  # the open profile's ts 0 (clock_ns)
trace_pending = lib.mxp_trace_pending
trace_errno = lib.mxp_trace_errno
stats_recorded_ns = lib.mxp_stats_recorded_ns
stats_reset = lib.mxp_stats_reset
flush_wait = lib.mxp_flush_wait  # 1 when woken, 0 on timeout
flush_wake = lib.mxp_flush_wake

# ---- control plane: one return-code policy ----

_MESSAGES = {
    E_INVALID: "invalid argument",
    E_NOMEM: "out of memory",
    E_IO: "I/O error",
    E_STATE: "not possible in the current state",
    E_FULL: "table full",
}
_ERRORS: dict[int, type[ProfilerError]] = {E_INVALID: ConfigError, E_STATE: StateError}


def check(rc: int, what: str) -> int:
    """Raise for a negative return code of the core; return rc otherwise.

    ``ConfigError`` for MXP_E_INVALID, ``StateError`` for MXP_E_STATE,
    ``ProfilerError`` for every other code; the message starts with what.

    Example:
        >>> check(0, "setting the limit")
        0
    """
    if rc < 0:
        error = _ERRORS.get(rc, ProfilerError)
        raise error(f"{what}: {_MESSAGES.get(rc, f'error {rc}')}")
    return rc


def utf8(text: str, what: str) -> bytes:
    """Encode a name for the core, rejecting what is not valid Unicode text."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(f"{what} {text!r} is not valid Unicode text ({e.reason})") from None


class ObjectInfo(NamedTuple):
    kind: int
    domain: str
    name: str


_info_cache: dict[int, ObjectInfo] = {}


def register(kind: int, domain: bytes, name: bytes) -> int:
    """Intern (kind, domain, name) and return its id.

    A full table is not an error for the caller: the id of a shared
    ``<overflow>`` object comes back and the core tallies it.
    """
    out = ffi.new("uint32_t *")
    rc = lib.mxp_object_register(kind, domain, len(domain), name, len(name), out)
    if rc < 0 and rc != E_FULL:
        check(rc, "registering an object")
    return int(out[0])


def new_track(name: str) -> int:
    """A new timeline that is not a thread (a GPU stream, a backward pass);
    its trace tid.  ProfilerError when the core cannot make one."""
    data = utf8(name, "track name")
    out = ffi.new("uint32_t *")
    check(lib.mxp_track_new(data, len(data), out), f"creating track {name!r}")
    return int(out[0])


def object_info(oid: int) -> ObjectInfo:
    """Kind, domain and name of an interned object."""
    info = _info_cache.get(oid)
    if info is None:
        kind = ffi.new("int *")
        name = ffi.new("const char **")
        name_len = ffi.new("size_t *")
        dom = ffi.new("const char **")
        dom_len = ffi.new("size_t *")
        check(lib.mxp_object_info(oid, kind, name, name_len, dom, dom_len), f"object {oid}")
        info = ObjectInfo(
            int(kind[0]),
            ffi.unpack(dom[0], dom_len[0]).decode("utf-8", "replace"),
            ffi.unpack(name[0], name_len[0]).decode("utf-8", "replace"),
        )
        _info_cache[oid] = info
    return info


class Stat(NamedTuple):
    """Merged statistics of one object (see ``mxp_stat`` in mxprof.h)."""

    id: int
    kind: int
    count: int
    total: int
    min: int
    max: int
    self: int
    last: int
    sum: float
    p50: int
    p90: int
    p99: int


def object_names(ids: Iterable[int]) -> Iterator[tuple[int, bytes, bytes]]:
    """(id, domain, name) of each interned object id, as the core keeps them
    (UTF-8 bytes).  One set of out-parameters serves every id, so that
    learning many names at once costs no allocation per name."""
    name, name_len = ffi.new("const char **"), ffi.new("size_t *")
    dom, dom_len = ffi.new("const char **"), ffi.new("size_t *")
    for oid in ids:
        check(lib.mxp_object_info(oid, ffi.NULL, name, name_len, dom, dom_len), f"object {oid}")
        yield oid, ffi.unpack(dom[0], dom_len[0]), ffi.unpack(name[0], name_len[0])


T = TypeVar("T")


def read_all(
    ctype: str, fill: Callable[[Any, int, Any], int], convert: Callable[[Any], T], what: str,
    cap: int = 64,
) -> list[T]:  # fmt: skip
    """The items of a C snapshot call, converted while their buffer lives.

    ``fill(out, cap, n_out)`` fills an array of ``ctype``; it returns
    MXP_E_FULL and the count needed when cap is too small, and is called
    again with room for that many.
    """
    n = ffi.new("uint32_t *")
    while True:
        buf = ffi.new(f"{ctype}[]", cap)
        rc = fill(buf, cap, n)
        if rc != E_FULL:
            break
        cap = n[0] + 64
    check(rc, what)
    return [convert(buf[i]) for i in range(n[0])]


def stats_snapshot(reset: bool = False) -> list[Stat]:
    """Statistics of every object with any, merged over all threads.

    reset starts new statistics from exactly what is returned.
    """
    return read_all(
        "mxp_stat",
        lambda out, cap, n: lib.mxp_stats_snapshot(out, cap, n, 1 if reset else 0),
        lambda s: Stat(
            s.id, s.kind, s.count, s.total, s.min, s.max, s.self, s.last, s.sum, s.p50, s.p90, s.p99
        ),
        "reading statistics",
        max(16, lib.mxp_object_count()),
    )


COUNT_FIELDS = TALLIES  # mxp_counts' fields


def capi_capsule() -> object:
    """A new capsule holding the C API's table (``mxprof._C_API``).

    The table and the capsule's name are static in the core, so the capsule
    needs no destructor.  cffi cannot make a capsule; the interpreter's own
    ``PyCapsule_New`` (through ctypes) can.
    """
    import ctypes

    if not hasattr(ctypes, "pythonapi"):
        raise ProfilerError("mxprof._C_API needs CPython: this interpreter has no C API capsules")
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    table = int(ffi.cast("uintptr_t", lib.mxp_capi_table()))
    name = int(ffi.cast("uintptr_t", lib.mxp_capi_name()))
    capsule: object = new(table, name, None)
    return capsule


def counts() -> dict[str, int]:
    """The core's tallies of events it did not record as asked."""
    c = ffi.new("mxp_counts *")
    lib.mxp_counts_get(c)
    return {f: int(getattr(c, f)) for f in COUNT_FIELDS}


def stats_counts(reset: bool = False) -> dict[str, int]:
    """The core's tallies since the statistics began; reset: begin them again."""
    c = ffi.new("mxp_counts *")
    lib.mxp_stats_counts_get(c, 1 if reset else 0)
    return {f: int(getattr(c, f)) for f in COUNT_FIELDS}


def strerror(code: int) -> str:
    """errno as text, e.g. 'EACCES (Permission denied)'."""
    return f"{_errno.errorcode.get(code, code)} ({os.strerror(code)})"


# ---- tracks ----


def track_open(name: bytes) -> int:
    """A new track with its own range stack (an asyncio task's); its tid, or
    0 when the core cannot make one (never raises: the task's ranges then
    stay on its thread)."""
    out = ffi.new("uint32_t *")
    if lib.mxp_track_open(name, len(name), out) < 0:
        return 0
    return int(out[0])


# ---- memory ----


def memory_device(kind: int, ordinal: int, what: str) -> int:
    """The core's slot of a device (DEVICE_CPU/DEVICE_GPU, ordinal)."""
    out = ffi.new("uint32_t *")
    check(lib.mxp_memory_device(kind, ordinal, out), what)
    return int(out[0])


class _HandleOut(threading.local):
    """Where the core writes a new handle: one per thread (the call releases
    the GIL, so a shared one could be overwritten before it is read)."""

    def __init__(self) -> None:
        self.out = ffi.new("uint64_t *")


_handle = _HandleOut()


def memory_alloc(
    ptr: int, nbytes: int, actual: int, device: int, scope: int, tag: int, reuse: bool
) -> tuple[int, int]:
    """Record an allocation: (code, handle).

    code is 0 or NEW_THREAD, and handle is ptr or the new handle; while
    memory is not recorded the code is E_STATE (an answer, not an error) and
    nothing is recorded.  Any other negative code raises (:func:`check`).
    """
    out = _handle.out
    rc = lib.mxp_memory_alloc(ptr, nbytes, actual, device, scope, tag, 1 if reuse else 0, out)
    if rc == E_STATE:
        return rc, 0
    check(rc, "recording an allocation")
    return rc, int(out[0])


class MemoryStat(NamedTuple):
    """Memory use of one device slot or scope (``mxp_memory_stat``)."""

    counter: int
    is_scope: bool
    key: int
    current: int
    peak: int
    allocated: int
    allocs: int
    frees: int


def memory_live() -> list[tuple[int, int, int, int, int, int, bool]]:
    """Every live allocation: (ptr, bytes, actual, device slot, scope id, tag id, reuse)."""
    return read_all(
        "mxp_alloc",
        lib.mxp_memory_live,
        lambda a: (a.ptr, a.bytes, a.actual, a.device, a.scope, a.tag, bool(a.reuse)),
        "reading live allocations",
    )


def memory_usage() -> list[MemoryStat]:
    """Use per device slot, then per scope, each in order of first use."""
    return read_all(
        "mxp_memory_stat",
        lib.mxp_memory_usage,
        lambda s: MemoryStat(
            s.counter, bool(s.is_scope), s.key, s.current, s.peak, s.allocated, s.allocs, s.frees
        ),
        "reading memory usage",
    )


# ---- profiles and trace files ----


def max_events_set(max_events: int) -> None:
    """The most trace records held in memory (0: no limit)."""
    check(lib.mxp_max_events_set(max_events), "setting max_events")


def flush_threshold_set(records: int) -> None:
    """Wake the background writer once this many records wait (0: never)."""
    check(lib.mxp_flush_threshold_set(records), "setting the flush threshold")


def profile_begin() -> None:
    """Begin a new profile (see ``mxp_profile_begin``)."""
    check(lib.mxp_profile_begin(), "beginning a profile")


def trace_meta_set(process: bytes, top_json: bytes, other_json: bytes) -> None:
    """The metadata written with every later trailer."""
    check(
        lib.mxp_trace_meta_set(
            process, len(process), top_json, len(top_json), other_json, len(other_json)
        ),
        "setting the trace's metadata",
    )


def trace_format(path: bytes) -> int:
    """The FORMAT_* a trace file named path is written in, or E_INVALID (an
    answer) when this build cannot write it (gzip without zlib)."""
    return int(lib.mxp_trace_format(path, len(path)))


def trace_path_set(path: bytes) -> int:
    """Use path from the next write on.  Returns 0, or (answers) E_IO when
    the old path could not be written first (the switch still happened;
    errno in :func:`trace_errno`) and E_INVALID when this build cannot write
    path's format (no change)."""
    return int(lib.mxp_trace_path_set(path, len(path)))


def trace_flush(finish: bool) -> int:
    """Write the buffered records.  Returns 0, or (answers) E_IO when the
    write failed (errno in :func:`trace_errno`; the records stay buffered)
    and E_STATE when no profile is open or it has no path."""
    return int(lib.mxp_trace_flush(1 if finish else 0))


def trace_continue(path: bytes) -> None:
    """Continue a finished profile's file in a new file at path."""
    check(lib.mxp_trace_continue(path, len(path)), "continuing the trace")


def trace_discard() -> None:
    """Drop every buffered record unwritten."""
    check(lib.mxp_trace_discard(), "discarding the trace")


def ring_trim(keep_ns: int, max_records: int) -> int:
    """A flight recorder's trim: drop the records that ended more than
    keep_ns ago, then the oldest while more than max_records (0: no cap)
    stay.  Returns 0, or (answers) E_STATE when the profile writes a file."""
    return int(lib.mxp_ring_trim(keep_ns, max_records))


def ring_floor_ns() -> int | None:
    """The clock time before which the flight recorder's cap dropped
    records; None when it never bound."""
    floor = int(lib.mxp_ring_floor_ns())
    return None if floor == -(2**63) else floor


def snapshot_write(path: bytes, from_ns: int, to_ns: int, other_json: bytes) -> int:
    """Write a flight recorder's window [from_ns, to_ns] to a new file at
    path.  Returns 0, or (answers) E_IO (errno in :func:`trace_errno`; no
    file left), E_STATE (no flight recorder's profile) or E_INVALID (a
    format this build cannot write)."""
    return int(lib.mxp_snapshot_write(path, len(path), from_ns, to_ns, other_json, len(other_json)))


def ranges_cut() -> int:
    """End every open range now, cut short; how many.  Out of memory is an
    answer (E_NOMEM): the ranges left open end later as usual, so a stop
    never fails for it."""
    return int(lib.mxp_ranges_cut())


# ---- stack sampling (mxprof/_sampler.py is the only user) ----

NO_RANGE = 0xFFFFFFFF  # sample_add: the sample is in no range


def sample_frame(name: str, file: str, line: int) -> int:
    """Intern a frame (function name, file, line) for samples; returns its id (>= 1)."""
    out = ffi.new("uint32_t *")
    a = name.encode("utf-8", "surrogatepass")
    b = file.encode("utf-8", "surrogatepass")
    check(lib.mxp_sample_frame(a, len(a), b, len(b), line & 0xFFFFFFFF, out), "sample frame")
    return int(out[0])


def sample_stack(parent: int, frame: int) -> int:
    """Intern a stack node: frame called from node parent (0: a root)."""
    out = ffi.new("uint32_t *")
    check(lib.mxp_sample_stack(parent, frame, out), "sample stack")
    return int(out[0])


class SampleSlots:
    """The two out-parameters of ``sample_add``, allocated once per sampler."""

    def __init__(self) -> None:
        self.range = ffi.new("uint32_t *")
        self.tid = ffi.new("uint32_t *")


sample_add = lib.mxp_sample_add  # (os_tid, track, stack, slots.range, slots.tid) -> rc

SAMPLE_WALL = int(lib.MXP_SAMPLE_WALL)
SAMPLE_CPU = int(lib.MXP_SAMPLE_CPU)


def sample_frame_info(fid: int) -> tuple[str, str, int]:
    """An interned frame: (function, file, line)."""
    name, name_len = ffi.new("const char **"), ffi.new("size_t *")
    file, file_len = ffi.new("const char **"), ffi.new("size_t *")
    line = ffi.new("uint32_t *")
    check(lib.mxp_sample_frame_get(fid, name, name_len, file, file_len, line), "sample frame")
    return (
        ffi.unpack(name[0], name_len[0]).decode("utf-8", "replace"),
        ffi.unpack(file[0], file_len[0]).decode("utf-8", "replace"),
        int(line[0]),
    )


def sample_stack_info(sid: int) -> tuple[int, int]:
    """An interned stack node: (parent node, frame)."""
    parent, frame = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    check(lib.mxp_sample_stack_get(sid, parent, frame), "sample stack")
    return int(parent[0]), int(frame[0])


def sample_counts(reset: bool = False) -> list[tuple[int, int, int]]:
    """Samples per (range id or NO_RANGE, stack node) since the statistics began."""
    n = ffi.new("uint32_t *")
    cap = 1024
    while True:
        out = ffi.new("mxp_sample_count[]", cap)
        rc = lib.mxp_sample_counts(out, cap, n, 1 if reset else 0)
        if rc != lib.MXP_E_FULL:
            check(rc, "reading sample counts")
            return [(int(c.range), int(c.stack), int(c.n)) for c in out[0 : n[0]]]
        cap = int(n[0]) + 1024  # more came meanwhile: room for them too


def sampler_layout(values: dict[str, int]) -> None:
    """Give the native sampler this interpreter's layout (``mxprof._pylayout``)."""
    layout = ffi.new("mxp_pylayout *")
    for key, value in values.items():
        setattr(layout, key, value)
    check(lib.mxp_sampler_layout(layout), "the interpreter's layout")


def sampler_threads() -> list[tuple[int, int]]:
    """The interpreter's thread states as the native sampler reads them:
    (address, OS thread id)."""
    cap = 4096
    addrs, tids = ffi.new("uint64_t[]", cap), ffi.new("int64_t[]", cap)
    n = ffi.new("uint32_t *")
    check(lib.mxp_sampler_threads(addrs, tids, cap, n), "reading the interpreter's threads")
    return [(int(addrs[i]), int(tids[i])) for i in range(n[0])]


def sampler_read(tstate: int) -> tuple[list[int], int]:
    """The stack of thread state tstate as the native sampler reads it: frame
    ids innermost first, and the asyncio task track found on it (0: none)."""
    cap = 1024
    frames, n, track = ffi.new("uint32_t[]", cap), ffi.new("uint32_t *"), ffi.new("uint32_t *")
    check(lib.mxp_sampler_read(tstate, frames, cap, n, track), "reading a stack")
    return [int(frames[i]) for i in range(n[0])], int(track[0])


def sampler_start(hz: float, mode: int, seed: int) -> None:
    """Start (or restart) the native sampler."""
    check(lib.mxp_sampler_start(hz, mode, seed & 0xFFFF_FFFF_FFFF_FFFF), "starting the sampler")


def sampler_stop() -> None:
    """Stop the native sampler and wait for its thread."""
    check(lib.mxp_sampler_stop(), "stopping the sampler")


def sampler_task(key: int, track: int) -> int:
    """Tell the sampler that the coroutine known by key runs on track (0:
    forget it); the core's code as is (never raises: tasks come and go on the
    program's own threads)."""
    return int(lib.mxp_sampler_task(key, track))


def sampler_cut(code: Any) -> None:
    """Frames of code object code, and their callers, are a launcher's: not
    the program's (stacks are cut above them)."""
    check(lib.mxp_sampler_cut(id(code)), "cutting a launcher's frames")


def sampler_skip(os_tid: int, skip: bool) -> int:
    """Mark OS thread os_tid as the profiler's own (not sampled), or not any
    more; the core's code as is (MXP_E_FULL past 256 threads)."""
    return int(lib.mxp_sampler_skip(os_tid, 1 if skip else 0))


class SamplerStats(NamedTuple):
    """What the native sampler did (mxp_sampler_stats)."""

    ticks: int
    samples: int
    late: int
    retried: int
    lost: int
    busy_ns: int
    running: bool


def sampler_stats() -> SamplerStats:
    """The native sampler's tallies since the process began (or a reset)."""
    out = ffi.new("mxp_sampler_stats *")
    lib.mxp_sampler_stats_get(out)
    return SamplerStats(
        int(out.ticks),
        int(out.samples),
        int(out.late),
        int(out.retried),
        int(out.lost),
        int(out.busy_ns),
        bool(out.running),
    )


def thread_unnamed() -> list[tuple[int, int]]:
    """Trace tids bound to an OS thread that have no name yet: (tid, OS id)."""
    cap = 4096
    tids, os_tids, n = ffi.new("uint32_t[]", cap), ffi.new("int64_t[]", cap), ffi.new("uint32_t *")
    check(lib.mxp_thread_unnamed(tids, os_tids, cap, n), "reading thread names")
    return [(int(tids[i]), int(os_tids[i])) for i in range(n[0])]


def ranges_open(os_tid: int) -> list[tuple[int, int]] | None:
    """The ranges open on OS thread os_tid now, outermost first: (object id,
    ns open).  None where the thread kept editing its stack while read; []
    for a thread with none, or that never recorded."""
    fill = lib.mxp_ranges_open
    cap = 256  # deeper stacks are cut at their outermost 256
    ids, ages, n = ffi.new("uint32_t[]", cap), ffi.new("int64_t[]", cap), ffi.new("uint32_t *")
    if fill(os_tid, ids, ages, cap, n) != OK:
        return None
    return [(int(ids[i]), int(ages[i])) for i in range(n[0])]


# ---- test seams (mxprof._testing, benchmarks) ----

reset_for_testing = lib.mxp_reset  # forget all state except interned objects
clock_fake = lib.mxp_clock_fake  # (1, now_ns) freezes the clock; (0, 0) thaws it
clock_fake_advance = lib.mxp_clock_fake_advance
