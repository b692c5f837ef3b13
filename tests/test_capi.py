"""The C API (mxprof_capi.h, the capsule mxprof._C_API), driven by a tiny
extension compiled here from tests/capi_ext.c."""

import ctypes
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

import mxprof
from mxprof import _native, _testing

HERE = os.path.dirname(os.path.abspath(__file__))


def compile_extension(source, name, out_dir, include_dirs=(), libraries=()):
    """Build one C file into an importable extension module with the system's
    compiler; skip the test where there is none."""
    cc = (sysconfig.get_config_var("CC") or "gcc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) to build the test extension")
    so = os.path.join(out_dir, name + importlib.machinery.EXTENSION_SUFFIXES[0])
    includes = [sysconfig.get_paths()["include"], *include_dirs]
    argv = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-pthread", source, "-o", so]
    argv += [f"-I{d}" for d in includes] + [f"-l{lib}" for lib in libraries]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    out = tmp_path_factory.mktemp("capi")
    module = compile_extension(
        os.path.join(HERE, "capi_ext.c"), "capi_ext", str(out), [mxprof.get_include()]
    )
    assert module.init() == 0
    return module


def test_header_is_installed_with_the_package():
    assert os.path.isfile(os.path.join(mxprof.get_include(), "mxprof_capi.h"))
    assert "_C_API" not in mxprof.__all__ and "get_include" in mxprof.__all__


def test_c_ranges_nest_in_a_python_range_and_are_counted(ext, trace_file):
    d = mxprof.Domain("py")
    step = d.new_task("step")
    mxprof.set_config(filename=trace_file, aggregate_stats=True, continuous_dump=False)
    mxprof.set_state("run")
    assert ext.enabled() == 1
    with step:
        ext.work(3)
    mxprof.set_state("stop")
    mxprof.dump()
    assert ext.enabled() == 0

    trace = _testing.load_trace(trace_file)
    (py,) = _testing.events(trace, "X", "step")
    (outer,) = _testing.events(trace, "X", "c_outer")
    inners = _testing.events(trace, "X", "c_inner")
    (frame,) = _testing.events(trace, "X", "c_frame")
    assert len(inners) == 3
    for e in (outer, *inners, frame):
        assert e["tid"] == py["tid"] and e["pid"] == py["pid"]
    assert outer["cat"] == "native" and inners[0]["cat"] == "event"
    assert frame["args"]["frame"] == 0

    def inside(a, b):  # a lies within b
        return b["ts"] <= a["ts"] and a["ts"] + a["dur"] <= b["ts"] + b["dur"]

    assert inside(outer, py)
    assert all(inside(e, outer) for e in (*inners, frame))
    counters = _testing.events(trace, "C", "c_items")
    assert [e["args"]["c_items"] for e in counters] == [1, 2, 3]
    (mark,) = _testing.events(trace, "i", "c_done")
    assert mark["s"] == "t" and mark["tid"] == py["tid"]

    stats = json.loads(mxprof.dumps(format="json"))
    assert stats["Time"]["py"]["step"]["Count"] == 1
    assert stats["Time"]["native"]["c_outer"]["Count"] == 1
    assert stats["Time"]["event"]["c_inner"]["Count"] == 3
    assert stats["Counter"]["native"]["c_items"]["Last"] == 3
    assert stats["Marker"]["native"]["c_done"]["Count"] == 1


def test_c_and_python_share_objects(ext):
    mxprof.set_config(aggregate_stats=True, continuous_dump=False, write_trace=False)
    items = mxprof.Domain("native").new_counter("c_items", 10)
    mxprof.set_state("run")
    ext.work(2)
    items.increment(5)
    mxprof.set_state("stop")
    assert items.value == 17  # the same counter, whoever updates it
    stats = json.loads(mxprof.dumps(format="json"))
    assert stats["Counter"]["native"]["c_items"]["Count"] == 3


def test_threads_python_never_saw_record_on_their_own_tracks(ext, trace_file):
    mxprof.set_config(filename=trace_file, aggregate_stats=True, continuous_dump=False)
    mxprof.set_state("run")
    ext.threads(4, 100)
    mxprof.set_state("stop")
    mxprof.dump()
    stats = json.loads(mxprof.dumps(format="json"))
    assert stats["Time"]["event"]["c_inner"]["Count"] == 400
    assert stats["Time"]["native"]["c_outer"]["Count"] == 4
    trace = _testing.load_trace(trace_file)
    assert len({e["tid"] for e in _testing.events(trace, "X", "c_outer")}) == 4


def test_nothing_recorded_while_stopped(ext):
    mxprof.set_config(aggregate_stats=True, continuous_dump=False, write_trace=False)
    before = _native.counts()["ignored_calls"]
    ext.work(2)
    stats = json.loads(mxprof.dumps(format="json"))
    assert "native" not in stats["Time"]
    # 4 begins, 4 ends, 2 counter samples and a mark: each tallied, as from Python
    assert _native.counts()["ignored_calls"] - before == 11


def test_misuse_is_refused_and_tallied_never_a_crash(ext, trace_file):
    mxprof.set_config(filename=trace_file, aggregate_stats=True, continuous_dump=False)
    mxprof.set_state("run")
    codes = ext.misuse()
    mxprof.set_state("stop")
    mxprof.dump()
    assert codes == (-1,) * 10
    stats = json.loads(mxprof.dumps(format="json"))
    assert "native" not in stats["Time"]
    assert "native" not in stats.get("Counter", {})  # counter_set of a task id did nothing
    assert "native" not in stats.get("Marker", {})
    tallies = _testing.load_trace(trace_file)["otherData"]
    assert tallies["invalid_calls"] == 10
    assert "invalid calls" in mxprof.dumps().lower().replace("_", " ")


class _Table(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("size", ctypes.c_size_t)]


def test_a_capsule_of_another_major_version_is_refused(ext, monkeypatch):
    table = _Table(99, 0, ctypes.sizeof(_Table))
    name = ctypes.create_string_buffer(b"mxprof._C_API")
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    fake = new(ctypes.addressof(table), ctypes.addressof(name), None)
    monkeypatch.setattr(mxprof, "_C_API", fake)
    with pytest.raises(ImportError, match=r"version 99\.0 cannot serve .* built for 1\.0"):
        ext.init()


def test_the_capsule_is_named_for_pycapsule_import():
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = (ctypes.py_object,)
    assert get_name(mxprof._C_API) == b"mxprof._C_API"


@pytest.mark.slow
def test_benchmark_script_runs(tmp_path):
    script = os.path.join(os.path.dirname(HERE), "benchmarks", "capi_nvtx.py")
    argv = [sys.executable, script, "--number", "2000", "--repeats", "1"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "C range, trace + stats, nvtx off" in proc.stdout
    assert "target: a range from C <= 30 ns" in proc.stdout
