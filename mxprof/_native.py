"""The only importer of the compiled core: ``ffi``, ``lib`` and thin helpers.

Everything above this module speaks Python; everything below it is the C API
declared in ``native/include/mxprof.h``.  Errors come back from C as negative
codes and leave here as exceptions (``check``).
"""

from __future__ import annotations

import errno as _errno
from typing import Any, Callable, NamedTuple, TypeVar

from .errors import ProfilerError

try:
    from ._mxprof_native import ffi, lib
except ImportError as e:  # pragma: no cover - depends on how mxprof was installed
    import os

    raise ImportError(
        f"mxprof's compiled core is missing from {os.path.dirname(__file__)}: this looks "
        "like the source tree, which has no compiled core unless installed with "
        "'pip install -e .'.  Install mxprof ('pip install .') and import it from "
        "another directory."
    ) from e

lib.mxp_init()

__all__ = [
    "COUNT_FIELDS",
    "ObjectInfo",
    "Stat",
    "check",
    "counts",
    "ffi",
    "lib",
    "object_info",
    "read_all",
    "register",
    "stats_counts",
    "stats_snapshot",
    "strerror",
    "utf8",
]

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

_MESSAGES = {
    lib.MXP_E_INVALID: "invalid argument",
    lib.MXP_E_NOMEM: "out of memory",
    lib.MXP_E_IO: "I/O error",
    lib.MXP_E_STATE: "not possible in the current state",
    lib.MXP_E_FULL: "table full",
}


def check(rc: int, what: str) -> int:
    """Raise ProfilerError for a negative return code; return rc otherwise."""
    if rc < 0:
        raise ProfilerError(f"{what}: {_MESSAGES.get(rc, f'error {rc}')}")
    return rc


def utf8(text: str, what: str) -> bytes:
    """Encode a name for the core, rejecting what is not valid Unicode text."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        from .errors import ConfigError

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
    if rc < 0 and rc != lib.MXP_E_FULL:
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
        if rc != lib.MXP_E_FULL:
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


COUNT_FIELDS = (
    "dropped_events",
    "unmatched_stops",
    "non_lifo_stops",
    "ignored_calls",
    "unknown_frees",
    "cut_ranges",
    "saturated_values",
)


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
    import os

    return f"{_errno.errorcode.get(code, code)} ({os.strerror(code)})"
