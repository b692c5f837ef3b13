"""mxprof.memory: attribution by scope, threads and tasks, the outputs, bad input."""

import asyncio
import json
import os
import threading

import pytest

import mxprof
from mxprof import _testing, memory

CSV_HEADER = '"Attribute Name","Requested Size","Device","Actual Size","Reuse?"\n'


def start(tmp_path, **config):
    mxprof.set_config(
        filename=os.fspath(tmp_path / "trace.json"), aggregate_stats=True, profile_api=False
    )
    if config:
        mxprof.set_config(**config)
    mxprof.set_state("run")


def by_name(kind):
    return {u.name: u for u in memory.usage() if u.kind == kind}


def test_nested_scopes_attribute_each_allocation(tmp_path):
    start(tmp_path)
    a = memory.record_alloc(100, "gpu:0")
    with mxprof.scope("model"):
        b = memory.record_alloc(200, "gpu:0", tag="weight")
        with mxprof.scope("layer1"):
            c = memory.record_alloc(300, "gpu:0", tag="bias", actual=512)
            d = memory.record_alloc(50, "cpu")
        e = memory.record_alloc(400, "gpu:0")
    scopes = by_name("scope")
    assert {k: v.current for k, v in scopes.items()} == {
        "<unk>:": 100,
        "model:": 600,
        "model:layer1:": 562,
    }
    devices = by_name("device")
    assert devices["gpu/0"].current == 100 + 200 + 512 + 400
    assert devices["cpu/0"].current == 50
    attrs = sorted((x.attribute, x.nbytes, x.actual, x.device) for x in memory.live())
    assert attrs == [
        ("<unk>:", 100, 100, "gpu/0"),
        ("model:", 400, 400, "gpu/0"),
        ("model:layer1:", 50, 50, "cpu/0"),
        ("model:layer1:bias", 300, 512, "gpu/0"),
        ("model:weight", 200, 200, "gpu/0"),
    ]
    for h in (a, b, c, d, e):
        assert memory.record_free(h) is True
    assert memory.live() == []
    scopes = by_name("scope")
    assert all(u.current == 0 for u in memory.usage())
    assert scopes["model:"].peak == 600 and scopes["model:"].allocs == scopes["model:"].frees == 2
    assert by_name("device")["gpu/0"].peak == 1212
    assert by_name("device")["gpu/0"].allocated == 1212


def test_each_thread_keeps_its_own_scope(tmp_path):
    start(tmp_path)
    barrier = threading.Barrier(4)
    errors = []

    def worker(i):
        try:
            with mxprof.scope(f"worker{i}"):
                barrier.wait()  # all four scopes are open at once
                for _ in range(1000):
                    memory.record_alloc(i + 1, "gpu:0")
                barrier.wait()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    scopes = by_name("scope")
    for i in range(4):
        assert scopes[f"worker{i}:"].current == 1000 * (i + 1)
        assert scopes[f"worker{i}:"].allocs == 1000
    assert "<unk>:" not in scopes
    assert by_name("device")["gpu/0"].current == 1000 * (1 + 2 + 3 + 4)


def test_each_asyncio_task_keeps_its_own_scope(tmp_path):
    """Tasks interleave on one thread; each allocation goes to its own task's scope."""
    start(tmp_path)

    async def job(name, nbytes):
        with mxprof.scope(name):
            for _ in range(5):
                await asyncio.sleep(0)  # the other tasks run (and set their scopes) here
                memory.record_alloc(nbytes, "gpu:0")

    async def main():
        await asyncio.gather(job("a", 1), job("b", 10), job("c", 100))

    asyncio.run(main())
    assert {k: v.current for k, v in by_name("scope").items()} == {"a:": 5, "b:": 50, "c:": 500}


def test_an_exception_inside_a_scope_restores_the_outer_one(tmp_path):
    start(tmp_path)
    with mxprof.scope("outer"):
        with pytest.raises(ZeroDivisionError), mxprof.scope("inner"):
            memory.record_alloc(7, "cpu")
            1 / 0  # noqa: B018
        memory.record_alloc(11, "cpu")
    memory.record_alloc(13, "cpu")
    assert {k: v.current for k, v in by_name("scope").items()} == {
        "outer:inner:": 7,
        "outer:": 11,
        "<unk>:": 13,
    }


def test_frees_from_another_thread_find_their_allocations(tmp_path):
    start(tmp_path)
    with mxprof.scope("producer"):
        ptrs = [memory.record_alloc(64, "gpu:1", ptr=0x10000 + 64 * i) for i in range(100)]
    assert ptrs == [0x10000 + 64 * i for i in range(100)]
    results = []
    t = threading.Thread(target=lambda: results.extend(memory.record_free(p) for p in ptrs))
    t.start()
    t.join()
    assert results == [True] * 100
    producer = by_name("scope")["producer:"]
    assert (producer.current, producer.peak, producer.allocs, producer.frees) == (0, 6400, 100, 100)
    assert _testing_counts()["unknown_frees"] == 0


def test_threads_allocating_at_once_each_get_their_own_handles(tmp_path):
    start(tmp_path)
    per_thread, handles = 20_000, [[] for _ in range(4)]

    def work(mine):
        mine.extend(memory.record_alloc(8, "cpu") for _ in range(per_thread))

    threads = [threading.Thread(target=work, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [h for mine in handles for h in mine]
    assert len(set(every)) == len(every) == 4 * per_thread
    assert all(memory.record_free(h) for h in every)
    cpu = by_name("device")["cpu/0"]
    assert (cpu.current, cpu.allocs, cpu.frees) == (0, 4 * per_thread, 4 * per_thread)


def _testing_counts():
    from mxprof import _native

    return _native.counts()


def test_unknown_frees_are_counted_not_raised(tmp_path):
    start(tmp_path)
    h = memory.record_alloc(10, "cpu")
    assert memory.record_free(h) is True
    assert memory.record_free(h) is False  # twice
    assert memory.record_free(0xDEAD) is False  # never allocated
    assert memory.record_free(0) is False  # nothing: not counted
    assert _testing_counts()["unknown_frees"] == 2
    stats = json.loads(mxprof.dumps(format="json"))
    assert stats["Profiler"]["unknown_frees"] == 2
    mxprof.set_state("stop")
    mxprof.dump()
    trace = _testing.load_trace(tmp_path / "trace.json")
    assert trace["otherData"]["unknown_frees"] == 2


def test_a_live_pointer_allocated_again_frees_the_old_allocation_first(tmp_path):
    start(tmp_path)
    memory.record_alloc(100, "cpu", ptr=0x1000)
    memory.record_alloc(30, "cpu", ptr=0x1000)
    cpu = by_name("device")["cpu/0"]
    assert (cpu.current, cpu.peak, cpu.allocs, cpu.frees) == (30, 100, 2, 1)
    assert [(a.ptr, a.nbytes) for a in memory.live()] == [(0x1000, 30)]


def test_counter_tracks_and_allocation_instants_in_the_trace(tmp_path):
    start(tmp_path, memory_events=True)
    with mxprof.scope("net"):
        a = memory.record_alloc(4096, "gpu:0", tag="w")
        b = memory.record_alloc(1024, "gpu:0", tag="b", actual=2048)
    memory.record_free(a)
    memory.record_free(b)
    mxprof.set_state("stop")
    mxprof.dump()
    trace = _testing.load_trace(tmp_path / "trace.json")
    gpu = _testing.events(trace, "C", "Memory: gpu/0")
    assert [e["args"]["Memory: gpu/0"] for e in gpu] == [4096, 6144, 2048, 0]
    assert {e["cat"] for e in gpu} == {"Device Storage"}
    net = _testing.events(trace, "C", "net:")
    assert [e["args"]["net:"] for e in net] == [4096, 6144, 2048, 0]
    assert {e["cat"] for e in net} == {"Scope Storage"}
    instants = [e for e in _testing.events(trace, "i") if e["cat"] == "Device Storage"]
    assert [(e["name"], e["s"], e["args"]) for e in instants] == [
        ("alloc", "t", {"device": "gpu/0", "attribute": "net:w", "bytes": 4096}),
        ("alloc", "t", {"device": "gpu/0", "attribute": "net:b", "bytes": 1024}),
        ("free", "t", {"device": "gpu/0", "attribute": "net:w", "bytes": 4096}),
        ("free", "t", {"device": "gpu/0", "attribute": "net:b", "bytes": 1024}),
    ]
    ts = [e["ts"] for e in gpu]
    assert ts == sorted(ts)


def test_no_instants_unless_asked(tmp_path):
    start(tmp_path)
    memory.record_free(memory.record_alloc(10, "gpu:0"))
    mxprof.set_state("stop")
    mxprof.dump()
    trace = _testing.load_trace(tmp_path / "trace.json")
    assert _testing.events(trace, "i") == []
    assert len(_testing.events(trace, "C", "Memory: gpu/0")) == 2


def test_memory_is_gated_by_the_state_and_profile_memory(tmp_path):
    assert memory.record_alloc(10, "cpu") == 0  # never ran
    mxprof.set_config(profile_memory=False, filename=os.fspath(tmp_path / "t.json"))
    mxprof.set_state("run")
    assert memory.record_alloc(10, "cpu") == 0
    assert memory.usage() == [] or all(u.allocs == 0 for u in memory.usage())
    mxprof.set_config(profile_all=True)  # turns every source on
    h = memory.record_alloc(10, "cpu")
    assert h != 0
    mxprof.set_config(profile_all=False, profile_memory=True)
    # Paused: the books are kept (a free finds its allocation) but no sample is written.
    mxprof.pause()
    h2 = memory.record_alloc(5, "cpu")
    assert memory.record_free(h) is True
    mxprof.resume()
    assert by_name("device")["cpu/0"].current == 5
    assert memory.record_free(h2) is True
    mxprof.set_state("stop")
    assert memory.record_alloc(10, "cpu") == 0
    mxprof.dump()
    trace = _testing.load_trace(tmp_path / "t.json")
    samples = [e["args"]["Memory: cpu/0"] for e in _testing.events(trace, "C", "Memory: cpu/0")]
    assert samples == [10, 0]  # the paused alloc (15) and free (5) are not in the trace


def test_dumps_memory_section(tmp_path, clock):
    start(tmp_path)
    with mxprof.scope("enc"):
        h = memory.record_alloc(3000, "gpu:0")
        memory.record_alloc(1000, "gpu:0")
    memory.record_free(h)
    table = mxprof.dumps()
    lines = table.splitlines()
    i = lines.index("Device Storage")
    assert lines[i + 1] == "=" * 17
    assert lines[i + 2].split() == [
        "Name", "Total", "Count", "Min", "Use", "(kB)", "Max", "Use", "(kB)",
        "Avg", "Use", "(kB)", "Peak", "Use", "(kB)",
    ]  # fmt: skip
    assert "  Min Use  (kB)" in lines[i + 2]  # MXNet's two spaces
    # Samples 3000, 4000, 1000 bytes: min 1 kB, max 4 kB, mean 2.667 kB, peak 4 kB.
    assert lines[i + 4].split() == ["Memory:", "gpu/0", "3", "1.0000", "4.0000", "2.6667", "4.0000"]
    j = lines.index("Scope Storage")
    assert lines[j + 4].split() == ["enc:", "3", "1.0000", "4.0000", "2.6667", "4.0000"]
    data = json.loads(mxprof.dumps(format="json"))
    assert data["Memory"]["Device Storage"]["Memory: gpu/0"] == {
        "Count": 3,
        "Min": 1.0,
        "Max": 4.0,
        "Avg": pytest.approx(2.666667),
        "Peak": 4.0,
    }
    assert data["Memory"]["Scope Storage"]["enc:"]["Count"] == 3
    assert "Memory: gpu/0" not in json.dumps(data["Counter"])  # not a plain counter


def test_a_statistics_reset_restarts_the_peak_at_what_is_in_use(tmp_path):
    start(tmp_path)
    h = memory.record_alloc(5000, "gpu:0")
    memory.record_alloc(1000, "gpu:0")
    memory.record_free(h)
    mxprof.dumps(reset=True)
    gpu = by_name("device")["gpu/0"]
    assert (gpu.current, gpu.peak, gpu.allocs, gpu.frees) == (1000, 1000, 0, 0)
    memory.record_alloc(500, "gpu:0")
    data = json.loads(mxprof.dumps(format="json"))
    assert data["Memory"]["Device Storage"]["Memory: gpu/0"]["Peak"] == 1.5


def test_gpu_csv_exact_header_and_rows(tmp_path):
    prefix = os.fspath(tmp_path / "sub" / "gpumem")
    os.makedirs(tmp_path / "sub")
    start(tmp_path, gpu_memory_profile_filename_prefix=prefix)
    with mxprof.scope("net"):
        memory.record_alloc(5120, "gpu:0", ptr=0xA000, tag="dense0:weight", actual=8192)
        memory.record_alloc(640, 1, tag="data", actual=4096, reuse=True)  # an int is a GPU
        memory.record_alloc(99, "cpu", tag="host")  # not a GPU: not in the CSV
        gone = memory.record_alloc(1, "gpu:0", tag="freed")
        memory.record_free(gone)  # freed: not in the CSV
    memory.record_alloc(33554432, "gpu:0", tag="")
    mxprof.dump(finished=False)
    path = f"{prefix}-pid_{os.getpid()}.csv"
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    assert text == (
        CSV_HEADER
        + '"<unk>:","33554432","0","33554432","0"\n'
        + '"net:data","640","1","4096","1"\n'
        + '"net:dense0:weight","5120","0","8192","0"\n'
    )
    # Every dump rewrites it whole with what is live then.
    memory.record_free(0xA000)
    mxprof.set_state("stop")
    mxprof.dump()
    with open(path, encoding="utf-8", newline="") as f:
        assert f.read() == (
            CSV_HEADER
            + '"<unk>:","33554432","0","33554432","0"\n'
            + '"net:data","640","1","4096","1"\n'
        )
    assert not os.path.exists(path + ".tmp")


def test_no_csv_without_gpu_allocations(tmp_path):
    start(tmp_path)
    memory.record_alloc(10, "cpu")
    mxprof.set_state("stop")
    mxprof.dump()
    assert [p for p in os.listdir(tmp_path) if p.endswith(".csv")] == []


def test_an_unwritable_csv_raises_after_the_trace_is_written(tmp_path):
    start(tmp_path, gpu_memory_profile_filename_prefix=os.fspath(tmp_path / "missing" / "g"))
    memory.record_alloc(10, "gpu:0")
    mxprof.set_state("stop")
    with pytest.raises(mxprof.OutputError, match="GPU memory profile"):
        mxprof.dump()
    trace = _testing.load_trace(tmp_path / "trace.json")
    assert len(_testing.events(trace, "C", "Memory: gpu/0")) == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((-1,), {}, ValueError, "nbytes must be >= 0"),
        (("10",), {}, TypeError, "nbytes must be an int"),
        ((True,), {}, TypeError, "nbytes must be an int"),
        ((10, "tpu:0"), {}, ValueError, "device must be 'cpu'"),
        ((10, -1), {}, ValueError, "ordinal must be >= 0"),
        ((10, 1.5), {}, TypeError, "device must be"),
        ((10, "cpu", "0x10"), {}, TypeError, "ptr must be an int"),
        ((10, "cpu", 0), {}, ValueError, "ptr must not be 0"),
        ((10, "cpu", None, 5), {}, TypeError, "tag must be a str"),
        ((10,), {"actual": -5}, ValueError, "actual must be >= 0"),
    ],
)
def test_bad_input_raises_and_records_nothing(tmp_path, args, kwargs, error, match):
    start(tmp_path)
    with pytest.raises(error, match=match):
        memory.record_alloc(*args, **kwargs)
    assert memory.live() == []
    assert all(u.allocs == 0 for u in memory.usage())


def test_record_free_rejects_what_is_not_a_pointer(tmp_path):
    start(tmp_path)
    with pytest.raises(TypeError, match="ptr must be an int"):
        memory.record_free("0x10")
    with pytest.raises(ValueError, match="ptr must be within"):
        memory.record_free(-1)


def test_device_names():
    assert memory.device_name("gpu") == "gpu/0"
    assert memory.device_name("GPU/3") == "gpu/3"
    assert memory.device_name("cuda:2") == "gpu/2"
    assert memory.device_name(4) == "gpu/4"
    assert memory.device_name("cpu:1") == "cpu/1"
