"""scope(): nesting, append_mode, exceptions, threads, asyncio, the core's mirror."""

import asyncio
import threading

import pytest

import mxprof
from mxprof import _native
from mxprof._native import lib


def core_scope():
    """The calling thread's scope as the core sees it."""
    sid = lib.mxp_scope_current()
    return "<unk>:" if sid == 0 else _native.object_info(sid).name


def test_default_and_trailing_colon():
    assert mxprof.current_scope() == "<unk>:"
    with mxprof.scope("a") as name:
        assert name == "a:"
        assert mxprof.current_scope() == core_scope() == "a:"
    with mxprof.scope("b:") as name:
        assert name == "b:"
    assert mxprof.current_scope() == core_scope() == "<unk>:"


def test_nesting_appends_and_restores():
    with mxprof.scope("model") as outer:
        with mxprof.scope("layer1") as inner:
            with mxprof.scope("conv") as innermost:
                assert innermost == core_scope() == "model:layer1:conv:"
            assert core_scope() == inner == "model:layer1:"
        assert outer == "model:" == core_scope()


def test_append_mode_false_replaces():
    with mxprof.scope("model"):
        with mxprof.scope("optimizer", append_mode=False) as name:
            assert name == "optimizer:" == core_scope()
        assert core_scope() == "model:"


def test_default_scope_is_not_prefixed():
    with mxprof.scope("<unk>:"), mxprof.scope("x") as name:
        assert name == "x:"


def test_exception_inside_restores_everything():
    with pytest.raises(ZeroDivisionError), mxprof.scope("outer"), mxprof.scope("inner"):
        raise ZeroDivisionError
    assert mxprof.current_scope() == core_scope() == "<unk>:"


def test_bad_arguments():
    with pytest.raises(TypeError), mxprof.scope(5):
        pass
    with pytest.raises(TypeError), mxprof.scope("x", append_mode="yes"):
        pass
    with pytest.raises(mxprof.ConfigError), mxprof.scope("\udc80"):
        pass
    assert mxprof.current_scope() == "<unk>:"


def test_threads_have_their_own_scope():
    seen = {}
    ready = threading.Barrier(3)

    def worker(name):
        with mxprof.scope(name):
            ready.wait()  # all three inside their scopes at once
            seen[name] = (mxprof.current_scope(), core_scope())
            ready.wait()

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("t0", "t1")]
    with mxprof.scope("main"):
        for t in threads:
            t.start()
        ready.wait()
        main_seen = (mxprof.current_scope(), core_scope())
        ready.wait()
        for t in threads:
            t.join()
    assert seen == {"t0": ("t0:", "t0:"), "t1": ("t1:", "t1:")}
    assert main_seen == ("main:", "main:")


def test_asyncio_tasks_keep_their_own_scope():
    async def job(name, gate, out):
        with mxprof.scope(name):
            await gate.wait()  # others enter their scopes meanwhile
            out[name] = mxprof.current_scope()
            with mxprof.scope("inner"):
                await asyncio.sleep(0)
                out[name + "/inner"] = mxprof.current_scope()

    async def main():
        out = {}
        gate = asyncio.Event()
        with mxprof.scope("loop"):
            jobs = [asyncio.ensure_future(job(n, gate, out)) for n in ("a", "b", "c")]
            await asyncio.sleep(0)
            gate.set()
            await asyncio.gather(*jobs)
            out["loop"] = mxprof.current_scope()
        return out

    out = asyncio.run(main())
    assert out == {
        "a": "loop:a:",
        "b": "loop:b:",
        "c": "loop:c:",
        "a/inner": "loop:a:inner:",
        "b/inner": "loop:b:inner:",
        "c/inner": "loop:c:inner:",
        "loop": "loop:",
    }
    assert mxprof.current_scope() == "<unk>:"


def test_scope_is_independent_of_profiler_state(trace_file):
    mxprof.set_config(filename=trace_file)
    with mxprof.scope("s1"):
        mxprof.set_state("run")
        assert core_scope() == "s1:"
        mxprof.set_state("stop")
    assert core_scope() == "<unk>:"
