"""Print the native sampler's layout row for a CPython, read off its own headers.

    python tools/cpython_layout.py [PYTHON ...]

For each interpreter named (default: the one running this script), compiles
a small C probe against that interpreter's internal headers (``Py_BUILD_CORE``)
and prints the offsets ``mxprof/_pylayout.py`` lists for its version: where a
thread state keeps its next state, OS thread id and innermost frame, where a
frame keeps its code and caller, where a code object keeps its names, and how
a str is laid out.  Paste the row into ``LAYOUTS`` for a new version; the
layout check (``mxprof._pylayout.check``) then verifies it on every start.

Needs a C compiler and the interpreter's headers (``python3.X-dev``, which
installs ``internal/`` too).  ``owner_generator``, ``owner_skip`` and
``code_mask`` are printed from the headers' enum and tag definitions where
they exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

PROBE = r"""
#define Py_BUILD_CORE 1
#include <Python.h>
#include <frameobject.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#endif
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX >= 0x030E0000
#include "internal/pycore_stackref.h"
#endif

#define P(name, expr) \
    printf("%s\"%s\": %lld", first ? "" : ", ", name, (long long)(expr)), first = 0

int main(void) {
    int first = 1;
    printf("{");
#if PY_VERSION_HEX >= 0x030B0000
    P("interp_threads", offsetof(PyInterpreterState, threads.head));
    P("tstate_native_id", offsetof(PyThreadState, native_thread_id));
    P("tstate_chunk", offsetof(PyThreadState, datastack_chunk));
    P("tstate_top", offsetof(PyThreadState, datastack_top));
    P("chunk_data", offsetof(_PyStackChunk, data));
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
    P("frame_size", offsetof(_PyInterpreterFrame, localsplus));
    P("owner_generator", FRAME_OWNED_BY_GENERATOR);
    P("owner_skip", FRAME_OWNED_BY_FRAME_OBJECT + 1);
    P("gen_frame", offsetof(PyGenObject, gi_iframe));
    P("code_name", offsetof(PyCodeObject, co_qualname));
#else
    P("interp_threads", offsetof(PyInterpreterState, tstate_head));
    P("tstate_native_id", -1);
    P("tstate_chunk", -1);
    P("tstate_top", -1);
    P("chunk_data", -1);
    P("frame_previous", offsetof(PyFrameObject, f_back));
    P("frame_owner", -1);
    P("frame_size", offsetof(PyFrameObject, f_code) + 8);
    P("owner_generator", 0);
    P("owner_skip", 255);
    P("gen_frame", 0);
    P("code_name", offsetof(PyCodeObject, co_name));
#endif
#if PY_VERSION_HEX >= 0x030D0000
    P("tstate_frame", offsetof(PyThreadState, current_frame));
    P("cframe_frame", -1);
    P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
#elif PY_VERSION_HEX >= 0x030B0000
    P("tstate_frame", offsetof(PyThreadState, cframe));
    P("cframe_frame", offsetof(_PyCFrame, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
#else
    P("tstate_frame", offsetof(PyThreadState, frame));
    P("cframe_frame", -1);
    P("frame_code", offsetof(PyFrameObject, f_code));
#endif
#if PY_VERSION_HEX >= 0x030E0000
    P("code_tag_bits", Py_TAG_BITS);
#else
    P("code_tag_bits", 0);
#endif
    P("tstate_next", offsetof(PyThreadState, next));
    P("tstate_interp", offsetof(PyThreadState, interp));
    P("tstate_thread_id", offsetof(PyThreadState, thread_id));
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    P("str_ascii_data", sizeof(PyASCIIObject));
    P("str_compact_data", sizeof(PyCompactUnicodeObject));
    printf("}\n");
    return 0;
}
"""


def row(python: str) -> dict[str, int]:
    """The layout row of interpreter python, from its own headers."""
    info = subprocess.run(
        [python, "-c", "import sys, sysconfig; print(sys.version_info[0], sys.version_info[1]);"
         "print(sysconfig.get_paths()['include'])"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    include = info[1]
    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "probe.c"), os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(PROBE)
        subprocess.run(
            [cc, "-I", include, "-I", os.path.join(include, "internal"), src, "-o", exe],
            check=True,
        )
        out: dict[str, int] = json.loads(subprocess.run([exe], capture_output=True, text=True,
                                                        check=True).stdout)  # fmt: skip
    bits = out.pop("code_tag_bits")
    out["code_mask"] = 0xFFFF_FFFF_FFFF_FFFF ^ (7 if bits else 0)
    return out


def main() -> int:
    for python in sys.argv[1:] or [sys.executable]:
        print(python, json.dumps(row(python), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
