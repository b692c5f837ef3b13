"""Build script: the C core is compiled by cffi (see native/build_ffi.py).

Two things beyond cffi's defaults:

- The wheel is tagged ``cp39-abi3``: cffi already builds the extension against
  the limited API (its name ends in ``.abi3.so``), so one wheel serves every
  CPython from 3.9 on.  Builds where cffi cannot use the limited API (debug and
  free-threaded interpreters) keep the interpreter's own tag.
- Before compiling, build_ext checks that a C compiler and the Python headers
  work, so that a machine without them gets a message naming what to install
  (or the wheel to use) instead of the compiler's raw "No such file or
  directory".
"""

import os
import re
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.errors import CCompilerError, DistutilsError, ExecError
except ImportError:  # setuptools < 59 names them only in distutils
    from distutils.errors import CCompilerError, DistutilsError
    from distutils.errors import DistutilsExecError as ExecError

HERE = os.path.dirname(os.path.abspath(__file__))

# The first CPython whose limited API the extension is built against; cffi's
# generated module uses nothing newer.
LIMITED_API = "cp39"

NO_COMPILER = """\
mxprof: cannot build its C core here: {what}.
  ({cause})
Either install a prebuilt wheel, which needs no compiler
  (Linux x86_64 with glibc 2.17 or newer, CPython 3.9 or newer):
  pip install --only-binary=mxprof mxprof    or    pip install mxprof-*-cp39-abi3-*.whl
or install {need} and try again, for example:
  Debian/Ubuntu: apt-get install gcc python3-dev zlib1g-dev
  Fedora/RHEL:   dnf install gcc python3-devel zlib-devel
  Alpine:        apk add build-base python3-dev zlib-dev
(set CC to pick another compiler such as clang; zlib is optional, for .gz traces)"""


def read_version():
    with open(os.path.join(HERE, "mxprof", "_version.py"), encoding="utf-8") as f:
        return re.search(r'__version__ = "([^"]+)"', f.read()).group(1)


def limited_api_tag():
    """The wheel's limited-API tag, or None where cffi builds a full-API module."""
    if sys.implementation.name != "cpython":
        return None
    if hasattr(sys, "gettotalrefcount") or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    return LIMITED_API


def compiler_name(compiler):
    """The compiler's program, as build_ext will run it."""
    argv = getattr(compiler, "compiler_so", None) or getattr(compiler, "compiler", None)
    return argv[0] if argv else type(compiler).__name__


def short_cause(message, cc):
    """The compiler's failure in one line (setuptools quotes the whole argv)."""
    status = re.search(r"returned non-zero exit status (-?\d+)", message)
    return f"{cc} exited with status {status.group(1)}" if status else message


class checked_build_ext(build_ext):
    """build_ext that first proves the toolchain works (see NO_COMPILER)."""

    def build_extensions(self):
        self._check_toolchain()
        super().build_extensions()

    def _try_compile(self, name, text):
        os.makedirs(self.build_temp, exist_ok=True)
        path = os.path.join(self.build_temp, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            self.compiler.compile([path])  # the object lands beside the source
        except (CCompilerError, ExecError, OSError) as exc:
            return short_cause(str(exc) or type(exc).__name__, compiler_name(self.compiler))
        return None

    def _check_toolchain(self):
        cc = compiler_name(self.compiler)
        error = self._try_compile("mxprof_probe_cc.c", "int mxprof_probe(void) { return 0; }\n")
        if error is not None:
            what = f"no working C compiler (tried: {cc})"
            need = "a C compiler (gcc or clang)"
        else:
            error = self._try_compile(
                "mxprof_probe_py.c",
                "#include <Python.h>\nint mxprof_probe(void) { return Py_IsInitialized(); }\n",
            )
            if error is None:
                return
            what = f"the Python headers (Python.h) are missing for {sys.executable}"
            need = "the Python development headers"
        raise DistutilsError(NO_COMPILER.format(what=what, cause=error, need=need))


tag = limited_api_tag()
setup(
    version=read_version(),
    cffi_modules=[
        "native/build_ffi.py:ffibuilder",
        # The offline reader's fast path: optional, a module of its own (mxprof.trace._fastjson).
        "native/offline/build_fastjson.py:ffibuilder",
    ],
    cmdclass={"build_ext": checked_build_ext},
    options={"bdist_wheel": {"py_limited_api": tag}} if tag else {},
)
