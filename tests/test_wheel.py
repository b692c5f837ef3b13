"""Packaging: the portable wheel, source builds without a compiler, the core on aarch64.

The wheel comes from tools/build_wheel.py, or from $MXPROF_WHEEL when that names one
already built (CI can build once and test the file it publishes).  Installing it and
building from source use pip, so these tests need the package index that
``pip install .`` needs.
"""

import glob
import gzip
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

from mxprof import _testing

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MACHINE = platform.machine()
GLIBC_FLOOR = (2, 17)
# The libraries every manylinux system has; zlib must not be among the wheel's needs.
SYSTEM_LIBS = {"libc.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libm.so.6"}
EM_AARCH64 = 183

SMOKE = textwrap.dedent(
    """
    import json, sys, threading

    import mxprof

    out = sys.argv[1]
    mxprof.set_config(filename=out + "/smoke.json", aggregate_stats=True, continuous_dump=False)
    d = mxprof.Domain("smoke")
    step, items, done = d.new_task("step"), d.new_counter("items", 0), d.new_marker("done")
    mxprof.set_state("run")
    for _ in range(5):
        with step:
            items += 2


    def work():
        with d.new_task("worker"):
            pass


    worker = threading.Thread(target=work, name="smoke-worker")
    worker.start()
    worker.join()
    done.mark("process")
    mxprof.set_state("stop")
    mxprof.dump()
    table = mxprof.dumps()
    # gzip output needs the zlib linked into the extension.
    mxprof.set_config(filename=out + "/smoke.json.gz")
    mxprof.set_state("run")
    with step:
        pass
    mxprof.set_state("stop")
    mxprof.dump()
    print(json.dumps({"module": mxprof.__file__, "table": table, "items": items.value}))
    """
)


def clean_env(**changes):
    """os.environ without what would let a subprocess see this checkout's mxprof."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(changes)
    return env


def run(argv, timeout=300, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def output(proc):
    return f"--- exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def copy_source(into):
    """The checkout without build outputs (setuptools would reuse a stale build/)."""
    ignored = (".git", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o", ".*_cache")
    shutil.copytree(ROOT, into, ignore=shutil.ignore_patterns(*ignored))
    return into


# What building and checking the wheel needs beyond the test extra (zig alone is
# about 400 MB): .ci/run installs it before the slow tests.
WHEEL_TOOLS = ("ziglang", "auditwheel")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    missing = [m for m in WHEEL_TOOLS if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f"needs {', '.join(missing)} to build and check the wheel: "
            "pip install -r tools/wheel-requirements.txt"
        )
    given = os.environ.get("MXPROF_WHEEL")
    if given:
        return given
    out = tmp_path_factory.mktemp("dist")
    script = os.path.join(ROOT, "tools", "build_wheel.py")
    proc = run([sys.executable, script, "--out", str(out)], timeout=600, env=clean_env())
    assert proc.returncode == 0, output(proc)
    return proc.stdout.strip().splitlines()[-1]


def extension(wheel, into):
    """Extract the wheel's compiled module; return its path and the wheel's file names."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        sos = [n for n in names if n.endswith(".so") or ".so." in n]
        # The core, and the offline reader's own module (native/offline), nothing else.
        assert sorted(os.path.basename(n) for n in sos) == [
            "_fastjson.abi3.so",
            "_mxprof_native.abi3.so",
        ]
        (so,) = [n for n in sos if n.endswith("_mxprof_native.abi3.so")]
        z.extract(so, into)
    return os.path.join(into, so), names


def test_wheel_is_abi3_manylinux_with_zlib_inside(wheel, tmp_path):
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    name = os.path.basename(wheel)
    floor = "_".join(map(str, GLIBC_FLOOR))
    assert "-cp39-abi3-" in name
    assert f"manylinux_{floor}_{MACHINE}" in name
    so, names = extension(wheel, tmp_path)
    # One module for every CPython >= 3.9, and no grafted libraries (zlib is static).
    assert os.path.basename(so) == "_mxprof_native.abi3.so"
    assert not [n for n in names if ".libs/" in n]

    with open(so, "rb") as f:
        elf = ELFFile(f)
        needed, versions, exported = set(), set(), set()
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                needed |= {t.needed for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"}
            if isinstance(section, GNUVerNeedSection):
                for _, aux in section.iter_versions():
                    versions |= {a.name for a in aux}
        for sym in elf.get_section_by_name(".dynsym").iter_symbols():
            if sym["st_shndx"] != "SHN_UNDEF" and sym.name:
                exported.add(sym.name)
    assert {n for n in needed - SYSTEM_LIBS if not n.startswith("ld-linux-")} == set(), needed
    glibc = [tuple(map(int, v[6:].split("."))) for v in versions if v.startswith("GLIBC_2")]
    assert glibc and max(glibc) <= GLIBC_FLOOR, sorted(versions)
    # zlib's symbols stay inside: the module exports only its init function.
    assert exported == {"PyInit__mxprof_native"}

    proc = run([sys.executable, "-m", "auditwheel", "show", wheel])
    assert proc.returncode == 0, output(proc)
    assert f'"manylinux_{floor}_{MACHINE}"' in " ".join(proc.stdout.split())
    assert "libz" not in proc.stdout


def test_wheel_installs_without_a_compiler_and_records(wheel, tmp_path):
    venv = tmp_path / "venv"
    proc = run([sys.executable, "-m", "venv", str(venv)], env=clean_env())
    assert proc.returncode == 0, output(proc)
    python = str(venv / "bin" / "python")
    # No compiler to be found: CC fails and PATH holds only the new environment.
    no_cc = clean_env(CC="/bin/false", PATH=str(venv / "bin"))
    proc = run([python, "-m", "pip", "install", "--no-cache-dir", wheel], env=no_cc)
    assert proc.returncode == 0, output(proc)
    (tmp_path / "smoke.py").write_text(SMOKE)
    proc = run([python, "smoke.py", str(tmp_path)], cwd=tmp_path, env=no_cc, timeout=60)
    assert proc.returncode == 0, output(proc)
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    # The installed wheel ran, not this checkout.
    assert result["module"].startswith(str(venv))
    assert result["items"] == 10
    trace = _testing.load_trace(tmp_path / "smoke.json")
    assert len(_testing.events(trace, "X", "step")) == 5
    assert len(_testing.events(trace, "X", "worker")) == 1
    assert [e["args"]["items"] for e in _testing.events(trace, "C", "items")] == [2, 4, 6, 8, 10]
    assert len(_testing.events(trace, "i", "done")) == 1
    threads = {e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    assert {"MainThread", "smoke-worker"} <= threads
    for line in ("step", "worker", "items", "done"):
        assert line in result["table"]
    gz = json.loads(gzip.decompress((tmp_path / "smoke.json.gz").read_bytes()))
    assert len(_testing.events(gz, "X", "step")) == 1


def fake_cc_without_python_headers(path):
    """A "compiler" that compiles anything but what includes Python.h."""
    path.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do\n'
        '  case "$a" in *.c) if grep -q "Python.h" "$a"; then\n'
        '    echo "$a: fatal error: Python.h: No such file or directory" >&2; exit 1\n'
        "  fi ;; esac\n"
        "done\n"
    )
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("case", ["CC fails", "no compiler on PATH", "no Python headers"])
def test_source_build_without_a_compiler_says_what_to_install(case, tmp_path):
    src = copy_source(tmp_path / "src")
    python_dir = os.path.dirname(sys.executable)
    env = clean_env()
    if case == "CC fails":
        env["CC"] = "/bin/false"
        expected = ["no working C compiler (tried: /bin/false)", "a C compiler (gcc or clang)"]
    elif case == "no compiler on PATH":
        cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
        if os.path.isabs(cc):
            pytest.skip(f"this Python's compiler is an absolute path ({cc}), PATH cannot hide it")
        env.pop("CC", None)
        env["PATH"] = python_dir  # pip and python, nothing else
        expected = [f"no working C compiler (tried: {cc})", "No such file or directory"]
    else:
        env["CC"] = fake_cc_without_python_headers(tmp_path / "cc")
        expected = ["Python headers (Python.h) are missing", "python3-dev"]
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(src)]
    proc = run(argv, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, output(proc)
    assert "mxprof: cannot build its C core here" in text, output(proc)
    for words in expected + ["cp39-abi3", "apt-get install gcc python3-dev"]:
        assert words in text, output(proc)
    assert not glob.glob(str(tmp_path / "*.whl"))


def elf_machine(path):
    with open(path, "rb") as f:
        header = f.read(20)
    assert header[:4] == b"\x7fELF", path
    return int.from_bytes(header[18:20], "little")


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None,
    reason="aarch64-linux-gnu-gcc is not installed (Debian/Ubuntu: gcc-aarch64-linux-gnu)",
)
def test_core_cross_compiles_for_aarch64(tmp_path):
    proc = run([os.path.join(ROOT, "native", "cross.sh")], env=clean_env(OUT=str(tmp_path)))
    assert proc.returncode == 0, output(proc)
    sources = sorted(glob.glob(os.path.join(ROOT, "native", "src", "*.c")))
    objects = [tmp_path / (os.path.basename(s)[:-2] + ".o") for s in sources]
    assert sources and all(o.exists() for o in objects), sorted(os.listdir(tmp_path))
    assert {elf_machine(o) for o in objects} == {EM_AARCH64}
    assert elf_machine(tmp_path / "test_core") == EM_AARCH64
    if "tests not run" not in proc.stdout:  # qemu-user ran the core's C tests
        assert "native core tests passed" in proc.stdout, output(proc)
