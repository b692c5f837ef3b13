"""Where the native sampler finds things in this CPython's memory.

The core's sampler thread (native/src/mxp_sampler.c) reads thread states,
frames, code objects and strings of this interpreter without the GIL.  It
needs the byte offsets of a handful of fields, which change with every
CPython minor version.  They are listed here, one row per version, as read
off that version's own headers (``tools/cpython_layout.py`` compiles a probe
against an interpreter's internal headers and prints its row), and for the
release builds of x86_64 and aarch64 Linux (the platforms mxprof builds for).

A row is never trusted blindly: :func:`check` has the core read the calling
thread's own stack (and a coroutine's, for asyncio tasks) and compares it
with what Python itself shows, function by function.  A version without a
row, a build whose layout differs (a debug or free-threaded build, a
patched interpreter) or a process whose memory the core cannot copy fails
the check; the sampler then falls back to sampling from a Python thread
(``mxprof._sampler``), less exactly, and says so once.
"""

from __future__ import annotations

import ctypes
import sys
import sysconfig
import threading
import types
from collections.abc import Collection
from typing import Any

from . import _native
from ._tasks import task_key

__all__ = ["LAYOUTS", "Unsupported", "check", "layout"]

_ALL = 0xFFFF_FFFF_FFFF_FFFF

# Strings (PyASCIIObject.state): kind in bits 2-4, compact bit 5, ascii bit 6,
# in every version listed.
_STR = {"str_state": 32, "str_length": 16, "str_kind_shift": 2, "str_compact_bit": 5,
        "str_ascii_bit": 6}  # fmt: skip

# Frames as objects (3.9, 3.10): f_back and f_code; thread states hold no OS
# thread id (it is read from the thread's struct pthread, see _pthread_tid).
_FRAME_OBJECTS = {
    "interp_threads": 8, "tstate_next": 8, "tstate_interp": 16, "tstate_native_id": -1,
    "tstate_thread_id": 176, "tstate_frame": 24, "cframe_frame": -1, "tstate_chunk": -1,
    "tstate_top": -1, "chunk_data": -1, "frame_code": 32, "frame_previous": 24,
    "frame_owner": -1, "frame_size": 40, "owner_generator": 0, "owner_skip": 255,
    "gen_frame": 0, "code_name": 112, "code_filename": 104, "code_firstlineno": 40,
    "str_ascii_data": 48, "str_compact_data": 72, "code_mask": _ALL,
}  # fmt: skip

# Interpreter frames (3.11 on) live in a per-thread stack of chunks, or inside
# their generator; owner 1 is a generator's, owners from owner_skip on are the
# interpreter's own (entry and shim frames).  gen_frame: where a generator's
# frame lies in the generator object (gi_iframe).  Each version after 3.11 is
# written as what changed since the one before.
_V311 = {
    "interp_threads": 16, "tstate_next": 8, "tstate_interp": 16, "tstate_native_id": 160,
    "tstate_thread_id": 152, "tstate_frame": 56, "cframe_frame": 8, "tstate_chunk": 296,
    "tstate_top": 304, "chunk_data": 24, "frame_code": 32, "frame_previous": 48,
    "frame_owner": 69, "frame_size": 72, "owner_generator": 1, "owner_skip": 3,
    "gen_frame": 80, "code_name": 128, "code_filename": 112, "code_firstlineno": 72,
    "str_ascii_data": 48, "str_compact_data": 72, "code_mask": _ALL,
}  # fmt: skip
_V312 = {
    **_V311, "interp_threads": 72, "tstate_native_id": 144, "tstate_thread_id": 136,
    "cframe_frame": 0, "tstate_chunk": 232, "tstate_top": 240, "frame_code": 0,
    "frame_previous": 8, "frame_owner": 70, "gen_frame": 72, "code_firstlineno": 68,
    "str_ascii_data": 40, "str_compact_data": 56,
}  # fmt: skip
# 3.13: no _PyCFrame any more; the thread state holds the innermost frame.
_V313 = {
    **_V312, "interp_threads": 7344, "tstate_native_id": 160, "tstate_thread_id": 152,
    "tstate_frame": 72, "cframe_frame": -1,
}  # fmt: skip
# 3.14: the frame's code is a tagged stack reference (its low bits are flags).
_V314 = {**_V313, "frame_owner": 74, "frame_size": 80, "code_mask": _ALL ^ 7}
_V315 = {
    **_V314, "interp_threads": 7336, "tstate_native_id": 184, "tstate_thread_id": 176,
    "tstate_chunk": 256, "tstate_top": 264,
}  # fmt: skip

LAYOUTS: dict[tuple[int, int], dict[str, int]] = {
    (3, 9): _FRAME_OBJECTS,
    (3, 10): _FRAME_OBJECTS,
    (3, 11): _V311,
    (3, 12): _V312,
    (3, 13): _V313,
    (3, 14): _V314,
    (3, 15): _V315,
}


class Unsupported(Exception):
    """The native sampler cannot read this interpreter (the message says why)."""


def _pthread_tid() -> int:
    """Where the OS thread id lies in a thread's struct pthread (3.9, 3.10,
    whose thread states do not hold it): the one offset at which two threads'
    own ids are found in their descriptors (``threading.get_ident()`` is the
    descriptor's address on Linux)."""
    if sys.platform != "linux":
        raise Unsupported("the OS thread id of a thread is read this way only on Linux")

    def candidates(ident: int, native: int) -> set[int]:
        raw = ctypes.string_at(ident, 2048)
        want = native.to_bytes(4, sys.byteorder)
        return {i for i in range(0, 2048, 4) if raw[i : i + 4] == want}

    found = candidates(threading.get_ident(), threading.get_native_id())
    ready, done = threading.Event(), threading.Event()
    other: dict[str, int] = {}

    def body() -> None:
        other["ident"], other["native"] = threading.get_ident(), threading.get_native_id()
        ready.set()
        done.wait(10)

    t = threading.Thread(target=body, name="mxprof-layout-check", daemon=True)
    t.start()
    try:
        if ready.wait(10):
            found &= candidates(other["ident"], other["native"])
    finally:
        done.set()
        t.join(10)
    if len(found) != 1:
        raise Unsupported("the OS thread id is not found in the thread's pthread descriptor")
    return found.pop()


def layout() -> dict[str, int]:
    """This interpreter's layout (the row, with its addresses and, on 3.9 and
    3.10, the pthread offset); raises Unsupported."""
    key = sys.version_info[:2]
    row = LAYOUTS.get(key)
    if row is None:
        known = ", ".join(f"{a}.{b}" for a, b in sorted(LAYOUTS))
        raise Unsupported(f"no frame layout for CPython {key[0]}.{key[1]} (known: {known})")
    if sys.implementation.name != "cpython":
        raise Unsupported(f"{sys.implementation.name} is not CPython")
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        raise Unsupported("a free-threaded build lays its objects out differently")
    if sysconfig.get_config_var("Py_DEBUG") or hasattr(sys, "gettotalrefcount"):
        raise Unsupported("a debug build lays its objects out differently")
    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    out = {**row, **_STR}
    out["interp"] = api.PyInterpreterState_Get() or 0
    out["code_type"] = id(types.CodeType)
    out["pthread_tid"] = _pthread_tid() if row["tstate_native_id"] < 0 else -1
    return out


def _tstate() -> int:
    api = ctypes.pythonapi
    api.PyThreadState_Get.restype = ctypes.c_void_p
    return int(api.PyThreadState_Get() or 0)


def _expected(
    frame: types.FrameType | None, cut: Collection[types.CodeType]
) -> list[tuple[str, str, int]]:
    """The stack Python shows from frame outwards, as the sampler names frames
    and up to the first frame of a code in cut (a launcher's)."""
    out = []
    while frame is not None and frame.f_code not in cut:
        code = frame.f_code
        out.append((getattr(code, "co_qualname", code.co_name), code.co_filename,
                    code.co_firstlineno))  # fmt: skip
        frame = frame.f_back
    return out


def _frames(ids: list[int]) -> list[tuple[str, str, int]]:
    return [_native.sample_frame_info(i) for i in ids]


def _compare(what: str, seen: list[tuple[str, str, int]], want: list[tuple[str, str, int]]) -> None:
    if seen != want:
        first = next((i for i, (a, b) in enumerate(zip(seen, want)) if a != b), len(seen))
        raise Unsupported(
            f"{what}: frame {first} read as "
            f"{seen[first] if first < len(seen) else 'nothing'!r}, Python shows "
            f"{want[first] if first < len(want) else 'nothing'!r}"
        )


def _read_here(
    tstate: int, cut: Collection[types.CodeType]
) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]], int]:
    """This thread's stack read by the core, what Python shows at the same
    point (the binding's frame innermost, where the read happened), and the
    task track the core found on it."""
    ids, track = _native.sampler_read(tstate)
    code = _native.sampler_read.__code__
    where = (getattr(code, "co_qualname", code.co_name), code.co_filename, code.co_firstlineno)
    return _frames(ids), [where, *_expected(sys._getframe(), cut)], track


# A function whose name and file are not ASCII: the sampler's reading of
# two-byte strings is checked with the rest.
_NON_ASCII = "def \u00e9t\u00e9_\u03bb(f):\n    return f()\n"
_namespace: dict[str, Any] = {}
exec(compile(_NON_ASCII, "<mxprof \u2014 check>", "exec"), _namespace)  # noqa: S102


def check(values: dict[str, int], cut: Collection[types.CodeType] = ()) -> None:
    """Give the core the layout and check it against this thread's own stack
    (a plain call, a non-ASCII function, a coroutine known as an asyncio
    task), whose frames from a code in cut on (a launcher's, already given to
    the core) are left out as the core leaves them; raises Unsupported naming
    the first difference."""
    try:
        _native.sampler_layout(values)
    except Exception as e:
        raise Unsupported(f"the core refused the layout: {e}") from None
    tstate = _tstate()
    threads = _native.sampler_threads()
    if (tstate, threading.get_native_id()) not in threads:
        raise Unsupported(
            "this thread is not found among the interpreter's threads as read "
            f"({len(threads)} read)"
        )

    def plain() -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]], int]:
        return _read_here(tstate, cut)

    seen, want, _ = _namespace["\u00e9t\u00e9_\u03bb"](plain)
    _compare("a thread's stack", seen, want)

    marker = 0xFFFFFF

    async def in_task() -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]], int]:
        return _read_here(tstate, cut)

    coro = in_task()
    key = task_key(coro)
    _native.sampler_task(key, marker)
    try:
        coro.send(None)
    except StopIteration as done:
        seen, want, track = done.value
    else:
        raise Unsupported("the check's coroutine did not finish")
    finally:
        _native.sampler_task(key, 0)
        coro.close()
    _compare("a coroutine's stack", seen, want)
    if track != marker:
        raise Unsupported("a coroutine running as a task is not recognised on the stack")
