"""cffi builder for the mxprof core (out-of-line API mode).

The cdef is the marked region of ``include/mxprof.h``, so the header is the
single source of truth; every ``#define NAME value`` there becomes
``#define NAME ...`` so the compiler, not this file, supplies the value.

GIL policy: cffi releases the GIL around every C call, which costs about
25 ns -- half the price of a hot call.  The per-event functions take
microseconds at worst and never wait on Python, so they keep the GIL.  The
functions that can run long (writing a trace, merging statistics, switching
files) are wrapped in the preamble to release it explicitly.
"""

import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "include", "mxprof.h")
SOURCES = sorted(
    os.path.join("native", "src", f)
    for f in os.listdir(os.path.join(HERE, "src"))
    if f.endswith(".c")
)

# Calls that may block on I/O or the writer lock: they release the GIL.
RELEASING = (
    ("int", "mxp_trace_flush", "int finish", "finish"),
    ("int", "mxp_trace_path_set", "const char *path, size_t path_len", "path, path_len"),
    ("int", "mxp_trace_discard", "void", ""),
    ("int", "mxp_profile_begin", "void", ""),
    (
        "int",
        "mxp_stats_snapshot",
        "mxp_stat *out, uint32_t cap, uint32_t *n_out, int reset",
        "out, cap, n_out, reset",
    ),
    ("void", "mxp_stats_reset", "void", ""),
    ("int64_t", "mxp_stats_recorded_ns", "void", ""),
    ("int", "mxp_max_events_set", "uint64_t max_events", "max_events"),
    ("int", "mxp_trace_errno", "void", ""),
    ("void", "mxp_reset", "void", ""),
    ("int", "mxp_noop_released", "uint32_t id", "id"),  # a benchmark baseline
    ("int", "mxp_flush_wait", "int64_t timeout_ns", "timeout_ns"),
    # The sampler: starting and stopping join its thread (a sample under way ends
    # first); reading a stack may wait for one.  None of them needs Python.
    ("int", "mxp_sampler_start", "double hz, int mode, uint64_t seed", "hz, mode, seed"),
    ("int", "mxp_sampler_stop", "void", ""),
    (
        "int",
        "mxp_sampler_read",
        "uint64_t tstate, uint32_t *frames_out, uint32_t cap, uint32_t *n_out, uint32_t *track_out",
        "tstate, frames_out, cap, n_out, track_out",
    ),
    # `mxprof ctl`'s read of a thread's open ranges takes the registry lock.
    (
        "int",
        "mxp_ranges_open",
        "int64_t os_tid, uint32_t *ids_out, int64_t *ages_out, uint32_t cap, uint32_t *n_out",
        "os_tid, ids_out, ages_out, cap, n_out",
    ),
    (
        "int",
        "mxp_sampler_threads",
        "uint64_t *tstates_out, int64_t *os_tids_out, uint32_t cap, uint32_t *n_out",
        "tstates_out, os_tids_out, cap, n_out",
    ),
)


def read_cdef(path=HEADER):
    """Return the cdef text: the header's marked region, values elided."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    match = re.search(r"/\* MXP_CDEF_BEGIN \*/(.*?)/\* MXP_CDEF_END \*/", text, re.S)
    if match is None:
        raise RuntimeError(f"{path}: no MXP_CDEF_BEGIN/END region")
    return re.sub(r"^#define (\w+) .*$", r"#define \1 ...", match.group(1), flags=re.M)


def preamble():
    """C glue placed before cffi's generated wrappers."""
    lines = ['#include "mxprof.h"', ""]
    for ret, name, params, args in RELEASING:
        call = f"{name}({args})"
        if ret == "void":
            body = f"Py_BEGIN_ALLOW_THREADS {call}; Py_END_ALLOW_THREADS"
        else:
            body = f"{ret} r; Py_BEGIN_ALLOW_THREADS r = {call}; Py_END_ALLOW_THREADS return r;"
        lines.append(f"static {ret} mxpy_{name}({params}) {{ {body} }}")
    for _, name, _, _ in RELEASING:
        lines.append(f"#define {name}(...) mxpy_{name}(__VA_ARGS__)")
    lines += [
        "",
        "/* Every other call keeps the GIL (see native/build_ffi.py). */",
        "#undef Py_BEGIN_ALLOW_THREADS",
        "#undef Py_END_ALLOW_THREADS",
        "#define Py_BEGIN_ALLOW_THREADS {",
        "#define Py_END_ALLOW_THREADS }",
    ]
    return "\n".join(lines) + "\n"


CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"]
LDFLAGS = ["-pthread"]
# MXPROF_SANITIZE=undefined (or any -fsanitize= list) builds the extension under
# that sanitizer, failing at the first report: tests/test_sanitized.py runs the
# Python tests of the core's entry points against such a build.
SANITIZE = os.environ.get("MXPROF_SANITIZE", "")
if SANITIZE:
    CFLAGS += [f"-fsanitize={SANITIZE}", "-fno-sanitize-recover=all", "-g"]
    CFLAGS += ["-fno-omit-frame-pointer"]
    LDFLAGS += [f"-fsanitize={SANITIZE}"]


def have_zlib():
    """Whether zlib's header is installed: gzip output is built only then."""
    import sysconfig

    dirs = [sysconfig.get_paths().get("include", ""), "/usr/include", "/usr/local/include"]
    dirs += os.environ.get("CPATH", "").split(os.pathsep)
    return any(d and os.path.exists(os.path.join(d, "zlib.h")) for d in dirs)


ZLIB = have_zlib()

ffibuilder = FFI()
ffibuilder.cdef(read_cdef())
ffibuilder.set_source(
    "mxprof._mxprof_native",
    preamble(),
    sources=SOURCES,
    include_dirs=[os.path.join("native", "include"), os.path.join("native", "src")],
    extra_compile_args=CFLAGS,
    extra_link_args=LDFLAGS,
    define_macros=[("MXPI_HAVE_ZLIB", "1")] if ZLIB else [],
    # dl: NVTX (mxp_nvtx.c) loads a tool named by NVTX_INJECTION64_PATH; glibc before
    # 2.34 keeps dlopen in libdl.
    libraries=(["z"] if ZLIB else []) + ["dl"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
