"""mxprof.cuda: the reasons it gives without CUDA, and what it records with a fake CUDA.

The GPU paths run twice over: against FakeCuda (a stand-in for the few
cuda-python calls mxprof makes, with a GPU clock the test sets), everywhere;
and against a real GPU in the tests marked ``needs_gpu``, which skip with the
probe's reason where there is none.
"""

import asyncio
import copy
import json
import subprocess
import sys
import types
import warnings

import pytest

import mxprof
from mxprof import _testing, cuda, memory
from mxprof._testing import finish, start
from mxprof.cuda import _runtime, _timing

MS = 1_000_000
GiB = 1 << 30

_no_gpu = pytest.mark.skipif(
    not cuda.available(), reason=f"needs a CUDA GPU: {cuda.unavailable_reason()}"
)


def needs_gpu(fn):
    """Marked ``gpu`` (``pytest -m gpu`` runs these on a GPU machine); skips elsewhere."""
    return pytest.mark.gpu(_no_gpu(fn))


def cuda_python_importable():
    try:
        _runtime._import_runtime()
    except ImportError:
        return False
    return True


# ---- a fake CUDA ----


class FakeEvent:
    def __init__(self, device):
        self.device = device
        self.t = None  # GPU ms when recorded
        self.stream = None
        self.done = False
        self.destroyed = False


class FakeCuda:
    """The Backend interface over a pretend machine of `ndev` GPUs.

    Events are stamped with `gpu_ms`, which then moves on by `step_ms`;
    they complete at once when `ready`, else when waited for or finished.
    `fail` maps a method name to the CUDA error it raises.
    """

    def __init__(self, ndev=2):
        self.ndev = ndev
        self.current = 0
        self.gpu_ms = 5000.0
        self.step_ms = 0.0
        self.ready = True
        self.fail = {}
        self.events = []
        self.records = []
        self.waits = 0
        self.allocs = {}  # ptr -> (device, nbytes, pool or None, stream or None)
        self.next_ptr = 0x7F00_0000_0000
        self.pools = []
        self.destroyed_pools = []
        self.streams = []
        self.device_switches = 0

    def _maybe_fail(self, what):
        if what in self.fail:
            raise cuda.CudaError(f"cuda{what}", self.fail[what])

    def device_count(self):
        return self.ndev

    def properties(self, ordinal):
        return (f"Fake GPU {ordinal}", 80 * GiB, 9, ordinal)

    def current_device(self):
        return self.current

    def set_device(self, ordinal):
        assert 0 <= ordinal < self.ndev
        self.device_switches += 1
        self.current = ordinal

    def mem_info(self):
        used = sum(a[1] for a in self.allocs.values() if a[0] == self.current)
        return 80 * GiB - used - (self.current + 1) * GiB, 80 * GiB

    def _new_ptr(self, record):
        self._maybe_fail("Malloc")
        ptr = self.next_ptr
        self.next_ptr += 1 << 20
        self.allocs[ptr] = record
        return ptr

    def malloc(self, nbytes):
        return self._new_ptr((self.current, nbytes, None, None))

    def free(self, ptr):
        if ptr not in self.allocs:
            raise cuda.CudaError("cudaFree", "cudaErrorInvalidValue")
        del self.allocs[ptr]

    def default_pool(self, ordinal):
        return ("default", ordinal)

    def pool_create(self, ordinal):
        pool = ("pool", ordinal, len(self.pools))
        self.pools.append(pool)
        return pool

    def pool_destroy(self, pool):
        self.destroyed_pools.append(pool)

    def pool_usage(self, pool):
        used = sum(a[1] for a in self.allocs.values() if a[2] == pool)
        return used, 2 * used

    def malloc_async(self, nbytes, pool, stream):
        return self._new_ptr((pool[1], nbytes, pool, stream))

    def free_async(self, ptr, stream):
        self.free(ptr)

    def stream_create(self):
        self.streams.append((self.current, 0xA000 + len(self.streams)))
        return self.streams[-1][1]

    def event_create(self):
        event = FakeEvent(self.current)
        self.events.append(event)
        return event

    def event_destroy(self, event):
        event.destroyed = True

    def event_record(self, event, stream):
        self._maybe_fail("EventRecord")
        assert event.device == self.current, "an event recorded on another device's stream"
        assert not event.destroyed
        event.t, event.stream, event.done = self.gpu_ms, stream, self.ready
        self.gpu_ms += self.step_ms
        self.records.append((event, stream))

    def _complete(self, event):
        # A stream runs in order: what was recorded on it before is done too.
        last = max(i for i, (e, _) in enumerate(self.records) if e is event)
        for e, stream in self.records[: last + 1]:
            if stream == event.stream:
                e.done = True

    def event_done(self, event):
        self._maybe_fail("EventQuery")
        if event.done:
            self._complete(event)
        return event.done

    def event_wait(self, event):
        self.waits += 1
        self._complete(event)

    def elapsed_ms(self, start, end):
        assert start.done and end.done, "cudaErrorNotReady"
        return end.t - start.t

    def finish(self):
        for event in self.events:
            event.done = True


@pytest.fixture
def fake(monkeypatch):
    backend = FakeCuda()
    monkeypatch.setattr(_runtime, "_result", (_runtime.RuntimeState(backend), None))
    return backend


def thread_names(trace):
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}


def gpu_events(trace, cat="cuda,gpu"):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") == cat]


def dumps_json():
    return json.loads(mxprof.dumps(format="json"))


# ---- without CUDA ----


def every_entry_point():
    d = mxprof.Domain("d")
    return {
        "device_count": cuda.device_count,
        "devices": cuda.devices,
        "memory_info": lambda: cuda.memory_info(0),
        "malloc": lambda: cuda.malloc(1024),
        "free": lambda: cuda.free(0x1000),
        "malloc_async": lambda: cuda.malloc_async(1024, stream=0),
        "free_async": lambda: cuda.free_async(0x1000, stream=0),
        "MemoryPool": lambda: cuda.MemoryPool(0),
        "MemoryPool.default": lambda: cuda.MemoryPool.default(0),
        "gpu_range": lambda: cuda.gpu_range("r"),
        "GpuTask": lambda: cuda.GpuTask(d, "t", stream=0),
        "Task(stream=)": lambda: mxprof.Task(d, "t", stream=0),
        "synchronize": cuda.synchronize,
    }


@pytest.mark.skipif(cuda.available(), reason="CUDA is available here")
@pytest.mark.parametrize("name", sorted(every_entry_point()))
def test_without_cuda_every_entry_point_raises_the_reason(name):
    reason = cuda.unavailable_reason()
    assert reason and cuda.available() is False
    with pytest.raises(mxprof.DeviceUnavailable) as info:
        every_entry_point()[name]()
    assert reason in str(info.value)


@pytest.mark.skipif(cuda.available(), reason="CUDA is available here")
@pytest.mark.skipif(not cuda_python_importable(), reason="cuda-python is not installed here")
def test_real_cuda_python_without_a_driver_names_the_driver(monkeypatch):
    monkeypatch.setattr(_runtime, "_result", None)  # probe afresh, for real
    assert cuda.available() is False
    reason = cuda.unavailable_reason()
    assert any(
        word in reason for word in ("libcuda", "cudaErrorInsufficientDriver", "cudaErrorNoDevice")
    ), reason
    with pytest.raises(mxprof.DeviceUnavailable, match="CUDA is not available"):
        cuda.device_count()


def test_without_cuda_python_the_reason_says_how_to_install(monkeypatch):
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails: ImportError
    monkeypatch.setattr(_runtime, "_result", None)
    assert cuda.available() is False
    reason = cuda.unavailable_reason()
    assert "cuda-python" in reason and 'pip install "mxprof[cuda]"' in reason
    for call in every_entry_point().values():
        with pytest.raises(mxprof.DeviceUnavailable) as info:
            call()
        assert "mxprof[cuda]" in str(info.value)


def test_the_probe_is_cached_and_never_raises(monkeypatch):
    calls = []

    def broken():
        calls.append(1)
        raise OSError("libcudart is corrupt")

    monkeypatch.setattr(_runtime, "_import_runtime", broken)
    monkeypatch.setattr(_runtime, "_result", None)
    assert cuda.available() is False and cuda.available() is False
    assert "fails to import" in cuda.unavailable_reason()
    assert "libcudart is corrupt" in cuda.unavailable_reason()
    assert calls == [1]


class FakeErr:
    def __init__(self, name, code):
        self.name, self.code = name, code

    def __int__(self):
        return self.code


def fake_runtime(count_result, driver=0, runtime=13040):
    def get_count():
        if isinstance(count_result, Exception):
            raise count_result
        return count_result

    ok = FakeErr("cudaSuccess", 0)
    return types.SimpleNamespace(
        cudaGetDeviceCount=get_count,
        cudaDriverGetVersion=lambda: (ok, driver),
        cudaRuntimeGetVersion=lambda: (ok, runtime),
        cudaGetErrorString=lambda err: (ok, b"some text"),
    )


def test_diagnose_names_each_reason(monkeypatch):
    insufficient = FakeErr("cudaErrorInsufficientDriver", 35)
    assert "libcuda.so.1 is missing" in _runtime._diagnose(fake_runtime((insufficient, None)))
    old = _runtime._diagnose(fake_runtime((insufficient, None), driver=12020, runtime=13040))
    assert old.startswith("cudaErrorInsufficientDriver: the driver supports CUDA 12.2")
    assert "cuda-python's CUDA 13.4" in old and ">= 580" in old
    assert 'pip install "cuda-python>=12,<13"' in old
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    none = _runtime._diagnose(fake_runtime((FakeErr("cudaErrorNoDevice", 100), None)))
    assert none.startswith("cudaErrorNoDevice") and "CUDA_VISIBLE_DEVICES=''" in none
    zero = _runtime._diagnose(fake_runtime((FakeErr("cudaSuccess", 0), 0)))
    assert zero.startswith("cudaErrorNoDevice") and "found 0 devices" in zero
    old_bindings = _runtime._diagnose(fake_runtime(RuntimeError("Failed to dlopen libcuda.so.1")))
    assert "libcuda.so.1 is missing or cannot be loaded" in old_bindings
    assert "Failed to dlopen" in old_bindings
    other = _runtime._diagnose(fake_runtime((FakeErr("cudaErrorDevicesUnavailable", 46), None)))
    assert other == "cudaErrorDevicesUnavailable from cudaGetDeviceCount: some text"
    assert _runtime._diagnose(fake_runtime((FakeErr("cudaSuccess", 0), 1))) is None


def test_import_mxprof_imports_no_cuda_module(tmp_path):
    # Compared with what was there before: cuda-bindings 12.9 installs a .pth
    # file that imports the bare ``cuda`` package at interpreter start.
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import mxprof\n"
        "d = mxprof.Domain('d'); t = mxprof.Task(d, 't')\n"
        "with t: pass\n"
        "import mxprof.cuda\n"
        "assert type(t) is mxprof.Task\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] == 'cuda'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_task_without_stream_is_a_plain_task():
    d = mxprof.Domain("d")
    assert type(mxprof.Task(d, "t")) is mxprof.Task
    assert type(mxprof.Task(d, "t", stream=None)) is mxprof.Task
    assert type(d.new_task("t")) is mxprof.Task
    # Its methods are the plain ranges' own: a stream costs a Task nothing.
    from mxprof.ranges import _Range

    assert mxprof.Task.start is _Range.start and mxprof.Task.__enter__ is _Range.__enter__
    task = mxprof.Task(d, "t")
    assert type(copy.copy(task)) is mxprof.Task and repr(copy.copy(task)) == "Task('d', 't')"


def test_a_task_subclass_does_not_silently_drop_a_stream():
    class Mine(mxprof.Task):
        __slots__ = ()

    assert type(Mine(mxprof.Domain("d"), "t")) is Mine
    with pytest.raises(TypeError, match="takes no stream"):
        Mine(mxprof.Domain("d"), "t", stream=0)


def test_stream_handles():
    class TorchLike:
        cuda_stream = 0x55D1_0000

    class CoreLike:
        def __cuda_stream__(self):
            return (0, 0x1234)

    class CupyLike:
        ptr = 77

    assert cuda.stream_handle(0) == 0
    assert cuda.stream_handle(TorchLike()) == 0x55D1_0000
    assert cuda.stream_handle(CoreLike()) == 0x1234
    assert cuda.stream_handle(CupyLike()) == 77
    with pytest.raises(TypeError, match="stream"):
        cuda.stream_handle("default")
    with pytest.raises(TypeError, match="bool"):
        cuda.stream_handle(True)
    with pytest.raises(ValueError, match="stream handle"):
        cuda.stream_handle(-1)


# ---- GPU ranges, with the fake ----


def test_gpu_range_maps_gpu_time_to_the_host_clock(fake, trace_file, clock):
    start(trace_file)
    fake.step_ms = 0.5  # anchor at 5000.0, start event at 5000.5
    with cuda.gpu_range("kernel"):
        clock(4 * MS)
        fake.gpu_ms = 5003.0  # end event
    trace = finish(trace_file)
    cpu = _testing.events(trace, "X", "kernel")
    (host,) = [e for e in cpu if e["cat"] == "cuda"]
    (gpu,) = gpu_events(trace)
    assert (host["ts"], host["dur"]) == (0.0, 4000.0)
    assert (gpu["name"], gpu["ts"], gpu["dur"]) == ("kernel", 500.0, 2500.0)
    assert thread_names(trace)[gpu["tid"]] == "GPU 0 stream 0"
    assert gpu["tid"] != host["tid"]
    row = dumps_json()["Time"]["cuda"]["kernel"]
    assert (row["Count"], row["Total"], row["GPU"]) == (1, 4.0, 2.5)
    table = mxprof.dumps().splitlines()
    assert "GPU (ms)" in table[table.index("cuda") + 2]
    line = next(ln.split() for ln in table if ln.startswith("kernel"))
    assert line[5] == "4.0000" and line[-1] == "2.5000"  # MXNet's Avg, then GPU total, last


def test_gpu_ranges_need_the_profiler_recording_at_their_start(fake, trace_file, clock):
    r = cuda.gpu_range("r")
    with r:  # stopped: nothing on the GPU either
        pass
    assert fake.records == []
    start(trace_file)
    mxprof.pause()
    with r:
        pass
    assert fake.records == []
    mxprof.resume()
    r.start()
    mxprof.pause()  # straddling a pause: kept whole
    r.stop()
    mxprof.resume()
    trace = finish(trace_file)
    assert len(gpu_events(trace)) == 1


def test_ranges_wait_for_their_events_and_the_last_write_waits_for_all(fake, trace_file, clock):
    start(trace_file)
    fake.ready = False
    fake.step_ms = 1.0
    k = cuda.gpu_range("k")
    for _ in range(3):
        with k:
            clock(1 * MS)
    assert len(_runtime.runtime_state().timing.pending) == 3
    assert "GPU" not in dumps_json()["Time"]["cuda"]["k"]  # nothing finished yet
    assert fake.waits == 1  # the anchor only: dumps() never blocks on ranges
    fake.events[2].done = True  # the first range's end (events[1] is its start)
    assert dumps_json()["Time"]["cuda"]["k"]["GPU"] == 1.0
    assert len(_runtime.runtime_state().timing.pending) == 2
    mxprof.set_state("stop")
    mxprof.dump(finished=True)  # the profile's last write waits for the rest
    trace = _testing.load_trace(trace_file)
    assert [e["dur"] for e in gpu_events(trace)] == [1000.0, 1000.0, 1000.0]
    assert _runtime.runtime_state().timing.pending == []


def test_synchronize_records_every_pending_range(fake, clock):
    mxprof.set_config(aggregate_stats=True, profile_api=False)
    mxprof.set_state("run")
    fake.ready = False
    fake.step_ms = 2.0
    with cuda.gpu_range("a"):
        pass
    cuda.synchronize()
    assert _runtime.runtime_state().timing.pending == []
    assert dumps_json()["Time"]["cuda"]["a"]["GPU"] == 2.0


def test_too_many_pending_ranges_make_the_host_wait(fake, monkeypatch, clock):
    monkeypatch.setattr(_timing, "MAX_PENDING", 4)
    mxprof.set_config(aggregate_stats=True, profile_api=False)
    mxprof.set_state("run")
    fake.ready = False
    r = cuda.gpu_range("r")
    for _ in range(3):
        with r:
            pass
    assert len(_runtime.runtime_state().timing.pending) == 3
    with r:
        pass
    assert _runtime.runtime_state().timing.pending == []
    assert dumps_json()["Time"]["cuda"]["r"]["GPU"] == 0.0
    assert next(s for s in mxprof._native.stats_snapshot() if s.id == r._gpu_id).count == 4


def test_events_are_reused_and_the_anchor_renewed(fake, trace_file, clock):
    start(trace_file)
    r = cuda.gpu_range("r")
    for _ in range(50):
        with r:
            pass
        mxprof.dumps()  # resolves, giving the events back
    assert len(fake.events) == 3  # one anchor, one start, one end
    anchor = fake.events[0]
    assert fake.waits == 1
    clock(2 * 1000 * MS)  # past ANCHOR_PERIOD_NS: the next range renews the anchor
    fake.gpu_ms = 9000.0
    fake.step_ms = 0.25
    with r:
        clock(1 * MS)
    assert fake.waits == 2 and len(fake.events) == 3
    assert fake.records[-3][1] == fake.streams[0][1]  # the new anchor, on the private stream
    assert anchor in {e for e, _ in fake.records[-2:]}  # the old one's event, reused
    trace = finish(trace_file)
    last = max(gpu_events(trace), key=lambda e: e["ts"])
    assert last["ts"] == 2_000_000.0 + 250.0  # from the new anchor, not the old one
    assert last["dur"] == 250.0
    assert all(not e.destroyed for e in fake.events)


def test_anchors_are_recorded_on_a_private_stream(fake, clock):
    mxprof.set_state("run")
    with cuda.gpu_range("r", stream=0x1000):
        pass
    (anchor, private), (begin, s1), (end, s2) = fake.records
    assert private == fake.streams[0][1] and (s1, s2) == (0x1000, 0x1000)


def test_one_track_per_device_and_stream(fake, trace_file, clock):
    start(trace_file)
    with cuda.gpu_range("a"), cuda.gpu_range("b", stream=0x55D1_2340):
        pass
    fake.set_device(1)
    with cuda.gpu_range("c"):
        pass
    with cuda.gpu_range("d", stream=2):
        pass
    trace = finish(trace_file)
    names = thread_names(trace)
    tracks = {e["name"]: names[e["tid"]] for e in gpu_events(trace)}
    assert tracks == {
        "a": "GPU 0 stream 0",
        "b": "GPU 0 stream 0x55d12340",
        "c": "GPU 1 stream 0",
        "d": "GPU 1 stream per-thread",
    }
    assert len(fake.streams) == 2  # a private stream per device


def test_task_with_a_stream_is_a_gpu_task_in_every_form(fake, trace_file, clock):
    d = mxprof.Domain("net")
    task = mxprof.Task(d, "step", stream=0)
    assert type(task) is cuda.GpuTask and isinstance(task, mxprof.Task)
    assert task.stream == 0 and str(task) == "step"
    assert type(d.new_task("step")) is mxprof.Task

    @task
    def decorated():
        clock(1 * MS)
        fake.gpu_ms += 3.0

    @task
    async def coroutine():
        clock(1 * MS)
        fake.gpu_ms += 4.0

    start(trace_file)
    task.start()
    fake.gpu_ms += 1.0
    task.stop()
    with task:
        fake.gpu_ms += 2.0
    decorated()
    asyncio.run(coroutine())
    trace = finish(trace_file)
    assert sorted(e["dur"] for e in gpu_events(trace, "net,gpu")) == [
        1000.0,
        2000.0,
        3000.0,
        4000.0,
    ]
    row = dumps_json()["Time"]["net"]["step"]
    assert (row["Count"], row["GPU"]) == (4, 10.0)


def test_a_gpu_task_extends_the_task_decorator_instead_of_copying_it():
    # One decorator, with ranges._Range's begin/end hooks: what plain tasks
    # do (asyncio tracks, NEW_THREAD) GPU tasks do too.
    assert cuda.GpuTask.__call__ is mxprof.Task.__call__
    assert cuda.GpuTask.hooked and not mxprof.Task.hooked


def test_a_gpu_task_inside_an_event_loop_records_its_host_range(fake, trace_file, clock):
    # The copied GpuTask.start took the core's MXP_IN_LOOP answer for "first
    # call on this thread" and recorded no host range inside an event loop.
    d = mxprof.Domain("net")
    task = mxprof.Task(d, "step", stream=0)

    async def main():
        with task:
            clock(1 * MS)
            fake.gpu_ms += 1.0
        task.start()
        clock(1 * MS)
        fake.gpu_ms += 2.0
        task.stop()

    start(trace_file)
    asyncio.run(main())
    trace = finish(trace_file)
    host = [e for e in _testing.events(trace, "X", "step") if e["cat"] == "net"]
    assert [e["dur"] for e in host] == [1000.0, 1000.0]
    assert sorted(e["dur"] for e in gpu_events(trace, "net,gpu")) == [1000.0, 2000.0]
    assert dumps_json()["Time"]["net"]["step"]["Count"] == 2


def test_a_stream_without_mxprof_cuda_raises_naming_it(monkeypatch):
    from mxprof import ranges

    monkeypatch.setattr(ranges, "_stream_task", None)
    monkeypatch.setitem(sys.modules, "mxprof.cuda", None)  # as if it failed to import
    with pytest.raises(mxprof.DeviceUnavailable, match=r"needs mxprof\.cuda"):
        mxprof.Task(mxprof.Domain("d"), "t", stream=0)


def test_a_raising_body_still_ends_both_ranges(fake, trace_file, clock):
    start(trace_file)
    task = cuda.gpu_range("boom")
    with pytest.raises(ValueError, match="boom"), task:
        fake.gpu_ms += 1.0
        raise ValueError("boom")
    trace = finish(trace_file)
    assert [e["dur"] for e in gpu_events(trace)] == [1000.0]
    assert len(_testing.events(trace, "X", "boom")) == 2


def test_gpu_ranges_nest_on_one_thread(fake, trace_file, clock):
    start(trace_file)
    outer = cuda.gpu_range("outer")
    outer.start()
    fake.gpu_ms += 1.0
    outer.start()
    fake.gpu_ms += 2.0
    outer.stop()
    fake.gpu_ms += 3.0
    outer.stop()
    outer.stop()  # one too many: tallied by the core, nothing on the GPU
    trace = finish(trace_file)
    assert sorted(e["dur"] for e in gpu_events(trace)) == [2000.0, 6000.0]


def test_gpu_range_returns_one_task_per_name_stream_and_domain(fake):
    d = mxprof.Domain("mine")
    assert cuda.gpu_range("x") is cuda.gpu_range("x", stream=0)
    assert cuda.gpu_range("x") is not cuda.gpu_range("x", stream=7)
    assert cuda.gpu_range("x", domain=d).domain is d
    assert cuda.gpu_range("x").domain is cuda.DOMAIN
    with pytest.raises(TypeError, match="Domain"):
        cuda.gpu_range("x", domain="mine")


def test_a_failing_cuda_call_drops_the_gpu_range_with_one_warning(fake, trace_file, clock):
    start(trace_file)
    r = cuda.gpu_range("r")
    with r:  # the anchor is made while it works
        pass
    fake.fail["EventRecord"] = "cudaErrorIllegalAddress"
    with pytest.warns(RuntimeWarning, match="cudaErrorIllegalAddress") as caught:
        for _ in range(3):
            with r:
                clock(1 * MS)
    assert len(caught) == 1
    assert _runtime.runtime_state().timing.lost == 3
    del fake.fail["EventRecord"]
    trace = finish(trace_file)
    assert len(gpu_events(trace)) == 1
    assert len([e for e in _testing.events(trace, "X", "r") if e["cat"] == "cuda"]) == 4


def test_a_failing_query_loses_only_that_range(fake, clock):
    mxprof.set_config(aggregate_stats=True, profile_api=False)
    mxprof.set_state("run")
    fake.ready = False
    with cuda.gpu_range("r"):
        pass
    fake.fail["EventQuery"] = "cudaErrorLaunchFailure"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mxprof.dumps()
    assert any("cudaErrorLaunchFailure" in str(w.message) for w in caught)
    assert _runtime.runtime_state().timing.pending == []
    del fake.fail["EventQuery"]
    with cuda.gpu_range("r"):
        pass
    cuda.synchronize()
    assert dumps_json()["Time"]["cuda"]["r"]["GPU"] == 0.0


def test_ranges_from_many_threads(fake, clock):
    import threading

    mxprof.set_config(aggregate_stats=True, profile_api=False)
    mxprof.set_state("run")
    r = cuda.gpu_range("t")

    def work():
        for _ in range(200):
            with r:
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cuda.synchronize()
    gpu = next(s for s in mxprof._native.stats_snapshot() if s.id == r._gpu_id)
    assert gpu.count == 800


# ---- devices and allocations, with the fake ----


def test_devices_and_memory_info(fake):
    assert cuda.available() and cuda.unavailable_reason() is None
    assert cuda.device_count() == 2
    assert cuda.devices() == [
        cuda.DeviceInfo(0, "Fake GPU 0", 80 * GiB, (9, 0)),
        cuda.DeviceInfo(1, "Fake GPU 1", 80 * GiB, (9, 1)),
    ]
    assert cuda.memory_info(1) == (78 * GiB, 80 * GiB)  # asked on device 1
    assert fake.current == 0  # and the current device put back
    with pytest.raises(mxprof.DeviceUnavailable, match="no GPU 2: 2 visible"):
        cuda.memory_info(2)
    with pytest.raises(TypeError, match="ordinal"):
        cuda.memory_info("gpu:0")


def test_malloc_and_free_are_recorded_for_the_scope(fake):
    mxprof.set_state("run")
    with mxprof.scope("encoder"):
        ptr = cuda.malloc(3 << 20, device=1, tag="weight")
    assert fake.allocs[ptr] == (1, 3 << 20, None, None) and fake.current == 0
    (alloc,) = memory.live()
    assert (alloc.ptr, alloc.nbytes, alloc.device, alloc.attribute) == (
        ptr,
        3 << 20,
        "gpu/1",
        "encoder:weight",
    )
    use = {u.name: u for u in memory.usage()}
    assert use["gpu/1"].current == 3 << 20 and use["encoder:"].current == 3 << 20
    cuda.free(ptr)
    assert ptr not in fake.allocs
    assert memory.live() == []
    assert {u.name: u.current for u in memory.usage()}["gpu/1"] == 0


def test_a_failed_malloc_records_nothing(fake):
    mxprof.set_state("run")
    fake.fail["Malloc"] = "cudaErrorMemoryAllocation"
    with pytest.raises(cuda.CudaError, match="cudaMalloc failed: cudaErrorMemoryAllocation"):
        cuda.malloc(1 << 40)
    assert memory.live() == [] and fake.allocs == {}
    with pytest.raises(ValueError, match="nbytes"):
        cuda.malloc(0)
    with pytest.raises(TypeError, match="tag"):
        cuda.malloc(16, tag=3)
    assert fake.allocs == {}


def test_free_of_an_unknown_pointer_is_counted_and_cuda_says_why(fake):
    mxprof.set_state("run")
    with pytest.raises(cuda.CudaError, match="cudaErrorInvalidValue"):
        cuda.free(0xDEAD)
    assert mxprof._native.counts()["unknown_frees"] == 1


def test_malloc_async_from_the_default_pool_and_a_created_one(fake):
    mxprof.set_state("run")
    a = cuda.malloc_async(1 << 20, stream=0x77, tag="act")
    assert fake.allocs[a] == (0, 1 << 20, ("default", 0), 0x77)
    with cuda.MemoryPool(1) as pool:
        handle = pool.handle
        b = cuda.malloc_async(2 << 20, stream=0x77, pool=pool)
        assert fake.allocs[b][:3] == (1, 2 << 20, pool.handle)
        assert pool.usage() == (2 << 20, 4 << 20)
        assert {(x.device, x.nbytes) for x in memory.live()} == {
            ("gpu/0", 1 << 20),
            ("gpu/1", 2 << 20),
        }
        with pytest.raises(ValueError, match="differs"):
            cuda.malloc_async(16, stream=0, device=0, pool=pool)
        cuda.free_async(b, stream=0x77)
    assert fake.destroyed_pools == [handle] and pool.handle is None
    assert cuda.MemoryPool.default(0).handle == ("default", 0)
    cuda.free_async(a, stream=0x77)
    assert memory.live() == [] and fake.allocs == {}


def test_allocations_are_not_recorded_while_stopped(fake):
    ptr = cuda.malloc(4096)
    assert ptr in fake.allocs and memory.live() == []
    cuda.free(ptr)
    assert fake.allocs == {}


def test_dump_writes_the_gpu_memory_csv_for_live_allocations(fake, trace_file):
    start(trace_file)
    with mxprof.scope("decoder"):
        ptr = cuda.malloc(1000, device=0, tag="cache")
    mxprof.set_state("stop")
    mxprof.dump()
    with open(memory.csv_path("gpu_memory_profile"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[1] == '"decoder:cache","1000","0","1000","0"'
    cuda.free(ptr)


# ---- with a real GPU ----


def runtime():
    return _runtime._import_runtime()


@needs_gpu
def test_gpu_real_devices_and_memory_info():
    infos = cuda.devices()
    assert len(infos) == cuda.device_count() >= 1
    assert infos[0].name and infos[0].total_memory > GiB and infos[0].compute_capability >= (3, 0)
    free_bytes, total = cuda.memory_info(0)
    assert total == infos[0].total_memory or abs(total - infos[0].total_memory) < GiB
    assert 0 < free_bytes <= total


@needs_gpu
def test_gpu_real_malloc_free_are_recorded(trace_file):
    start(trace_file)
    ptr = cuda.malloc(64 << 20, tag="buf")
    assert ptr != 0
    assert {u.name: u.current for u in memory.usage()}["gpu/0"] == 64 << 20
    assert [(a.ptr, a.device, a.tag) for a in memory.live()] == [(ptr, "gpu/0", "buf")]
    mxprof.set_state("stop")
    mxprof.dump()
    with open(memory.csv_path("gpu_memory_profile"), encoding="utf-8") as f:
        assert f'"<unk>:buf","{64 << 20}","0"' in f.read()
    cuda.free(ptr)
    assert memory.live() == []


@needs_gpu
def test_gpu_real_malloc_async_and_pools():
    mxprof.set_state("run")
    rt = runtime()
    err, stream = rt.cudaStreamCreate()
    assert int(err) == 0
    ptr = cuda.malloc_async(8 << 20, stream=stream, tag="async")
    assert {u.name: u.current for u in memory.usage()}["gpu/0"] == 8 << 20
    with cuda.MemoryPool(0) as pool:
        other = cuda.malloc_async(4 << 20, stream=stream, pool=pool)
        assert rt.cudaStreamSynchronize(stream)[0] == 0
        used, reserved = pool.usage()
        assert used >= 4 << 20 and reserved >= used
        cuda.free_async(other, stream=stream)
        assert rt.cudaStreamSynchronize(stream)[0] == 0
    cuda.free_async(ptr, stream=stream)
    assert rt.cudaStreamSynchronize(stream)[0] == 0
    assert memory.live() == []
    rt.cudaStreamDestroy(stream)


@needs_gpu
def test_gpu_real_range_times_a_memset(trace_file):
    rt = runtime()
    start(trace_file)
    size = 256 << 20
    ptr = cuda.malloc(size)
    with cuda.gpu_range("warmup"):  # the first range makes the anchor
        pass
    with cuda.gpu_range("memset"):
        assert int(rt.cudaMemsetAsync(ptr, 1, size, 0)[0]) == 0
    cuda.synchronize()
    cuda.free(ptr)
    trace = finish(trace_file)
    (host,) = [e for e in _testing.events(trace, "X", "memset") if e["cat"] == "cuda"]
    (gpu,) = [e for e in gpu_events(trace) if e["name"] == "memset"]
    assert gpu["dur"] > 0
    slack = 2000.0  # µs
    assert host["ts"] - slack <= gpu["ts"] <= host["ts"] + host["dur"] + slack
    assert thread_names(trace)[gpu["tid"]] == "GPU 0 stream 0"
    assert dumps_json()["Time"]["cuda"]["memset"]["GPU"] > 0


def test_one_pre_write_hook_resolves_gpu_ranges():
    from mxprof._session import SESSION

    hooks = [h for h in SESSION.write_hooks if h.__module__.startswith("mxprof.cuda")]
    assert hooks == [_runtime._sync_hook]
