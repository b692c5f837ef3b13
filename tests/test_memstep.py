"""memory_steps (mxprof/_memstep.py) and the leak rule (mxprof/trace/leak.py):
the rule on synthetic series both ways, then live runs asserting on what was
recorded (counters, markers, leaks(), dumps(), the report's hint).  Waits
are bounded; nothing asserts on wall time."""

import ctypes
import glob
import json
import math
import multiprocessing
import os
import random
import sys
import time
import types

import pytest
from _isolated import isolated

import mxprof
from mxprof import _memstep, _testing, memory
from mxprof._render import format_bytes
from mxprof.cli import main
from mxprof.errors import ConfigError
from mxprof.report.hints import find_hints
from mxprof.trace.leak import copy_on_read, first_leak, leak, theil_sen

MB = 2**20
LIMIT = 60.0  # s: the longest a wait may take on a loaded machine
LINUX = os.path.exists("/proc/self/smaps_rollup")
needs_proc = pytest.mark.skipif(not LINUX, reason="needs /proc/self/smaps_rollup")
# A leak is seen in RSS: after hundreds of tests the interpreter's heap has free
# resident pages a new MiB reuses, so the live leaks are made in a fresh one.
fresh, _run_isolated = isolated(__file__, "measures RSS growth, which needs a fresh heap")


# ---- the rule on synthetic series ----


def noisy(seed, steps, shape, noise=2 * MB):
    r = random.Random(seed)
    return [300 * MB + shape(k) + r.uniform(-noise, noise) for k in range(steps)]


@pytest.mark.parametrize("seed", range(20))
def test_a_leak_of_1_mb_per_step_fires_within_20_steps(seed):
    values = noisy(seed, 200, lambda k: MB * k)
    found = first_leak(values)
    assert found is not None
    at, growth = found
    assert at < 20  # the 20th step at the latest
    assert 0.8 * MB < growth.rate < 1.2 * MB
    assert growth.steps == 16


@pytest.mark.parametrize("seed", range(20))
def test_noise_spikes_and_warm_up_that_stops_stay_silent_over_200_steps(seed):
    spikes = random.Random(seed + 1000)
    allocator = noisy(seed, 200, lambda k: 8 * MB if spikes.random() < 0.05 else 0)
    assert first_leak(allocator) is None
    linear_warm_up = noisy(seed, 200, lambda k: 3 * MB * min(k, 10), noise=MB)
    assert first_leak(linear_warm_up) is None
    decaying_warm_up = noisy(seed, 200, lambda k: 60 * MB * (1 - math.exp(-k / 4)), noise=MB)
    assert first_leak(decaying_warm_up) is None


def test_one_jump_is_not_a_leak_and_a_later_leak_is_found_where_it_began():
    jump = [100 * MB] * 8 + [150 * MB] * 192
    assert first_leak(jump) is None
    late = [100 * MB] * 100 + [100 * MB + MB * k for k in range(100)]
    at, growth = first_leak(late)
    assert 100 < at < 120 and growth.rate == MB


def test_the_rule_is_robust_to_one_spike_and_needs_a_window():
    assert theil_sen([0, 1, 2, 3, 1000, 5, 6, 7]) == 1.0
    assert leak([MB * k for k in range(5)]) is None  # too few values
    assert leak([MB * k for k in range(16)], min_rate=2 * MB) is None  # below min_rate
    assert leak([MB * k for k in range(16)]).rate == MB


def test_copy_on_read_is_shared_turning_private():
    assert copy_on_read([100 * MB, 60 * MB], [10 * MB, 50 * MB]) == (40 * MB, 40 * MB)
    assert copy_on_read([100 * MB, 100 * MB], [10 * MB, 50 * MB]) is None  # a plain leak
    assert copy_on_read([100 * MB], [10 * MB]) is None


# ---- configuration ----


@pytest.mark.parametrize(
    "key, value",
    [
        ("memory_steps", 2),
        ("memory_period", -1),
        ("leak_steps", 3),
        ("leak_steps", 10**6),
        ("leak_min_bytes", "1 MB"),
        ("leak_sites_steps", -1),
        ("trigger_leak", "yes"),
    ],
)
def test_bad_keys_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        mxprof.set_config(**{key: value})


# ---- live ----


def run_steps(trace_file, steps, body, **config):
    """Record steps Frames calling body(k) inside each; the step at which the
    first leak was flagged (None: none)."""
    _testing.start(trace_file, memory_steps=True, memory_period=0, **config)
    step = mxprof.Domain("train").new_frame("step")
    flagged = None
    for k in range(steps):
        with step:
            body(k)
        if flagged is None and _memstep.leaks():
            flagged = k
    return flagged


@pytest.fixture(autouse=True)
def _fresh_pages():
    """Blocks of a MiB from fresh pages, as in a new process. glibc raises its
    mmap threshold when a big block is freed, so after the tests before this
    module a MiB came from the heap's already resident free pages, and RSS
    did not grow with the leak; a fixed threshold keeps such blocks mmap'd."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, glibc's default
    except (OSError, AttributeError):
        pass  # another C library: nothing to pin
    yield


def touched(n):
    """n MiB made resident (each page written)."""
    block = bytearray(n * MB)
    block[::4096] = b"x" * (n * MB // 4096)
    return block


@fresh
@needs_proc
def test_a_leaking_loop_is_flagged_live_with_its_scope_and_allocation_site(trace_file, capsys):
    kept = []

    def body(k):
        with mxprof.scope("cache"):
            memory.record_alloc(MB, "cpu")  # the scope's bytes grow with the leak
        kept.append(touched(1))  # the leak's line (tracemalloc names it)

    flagged = run_steps(trace_file, 24, body, leak_sites_steps=3)
    assert flagged is not None and flagged < 20
    (found,) = memory.leaks()  # the public name of _memstep.leaks()
    assert found["series"] == "rss" and found["steps"] == 16
    assert found["process"] == f"main (pid {os.getpid()})"
    assert 0.8 * MB < found["rate_per_step"] < 1.3 * MB
    assert (found["scope"], found["scope_growth"]) == ("cache:", 15 * MB)
    site, per_step = found["sites"][0]
    assert site.endswith(f"{os.path.basename(__file__)}:{touched.__code__.co_firstlineno + 2}")
    assert 0.9 * MB < per_step < 1.1 * MB
    stats = mxprof.dumps()
    assert "Process Memory\n" in stats and "\nrss " in stats
    mxprof.set_state("stop")
    mxprof.dump()
    trace = mxprof.load(trace_file)
    rss = [e for e in trace if e.ph == "C" and (e.category, e.name) == ("Process Memory", "rss")]
    assert len(rss) == 24  # one per step end
    marks = [e.name for e in trace if e.ph == "i" and e.category == "Process Memory"]
    assert marks == [f"leak: rss +{format_bytes(found['rate_per_step'])}/step over 16 steps in "
                     f"main (pid {os.getpid()}), most in scope cache:"]  # fmt: skip
    sites = [e.name for e in trace if e.ph == "C" and e.category == "Allocation Sites"]
    assert site in sites
    (hint,) = [h for h in find_hints([trace]) if h.rule == "memory-leak"]
    assert hint.severity == "high" and "rss of pid" in hint.title
    assert hint.evidence[0].split(": rss grew")[0] == f"pid {os.getpid()}"
    # The report's rule flags the step the live one did (the first RSS sample may
    # already hold a step's growth or not: the window may end at 15 or later).
    assert f"over steps {flagged - 15} to {flagged}" in hint.evidence[0]
    assert any(f"scope 'cache:' grew most: {15}.00 MiB" in line for line in hint.evidence)
    assert any(site in line for line in hint.evidence)
    # mxprof stats: the counters, and the same rule's answer
    assert main(["stats", trace_file, "--format", "json"]) == 0
    (proc,) = json.loads(capsys.readouterr().out)["Memory"]["processes"]
    assert proc["process"] == f"pid {os.getpid()}"
    rss = next(c for c in proc["counters"] if c["name"] == "rss")
    assert (
        rss["samples"] == 24 and rss["last"] - rss["first"] > 16 * MB
    )  # of 24 MiB kept: the first steps may reuse resident pages
    assert proc["leak"]["series"] == "rss" and proc["leak"]["window"] == 16
    assert int(proc["leak"]["at"].removeprefix("step ")) == flagged
    assert main(["stats", trace_file]) == 0
    assert "    leak: rss +" in capsys.readouterr().out


@fresh
@needs_proc
def test_freed_steps_and_warm_up_that_stops_stay_silent_over_200_steps(trace_file):
    cache = []

    def body(k):
        scratch = touched(4)  # taken and given back within the step
        if k < 10:
            cache.append(touched(2))  # warm-up: a cache filling, then full
        del scratch

    assert run_steps(trace_file, 200, body) is None
    assert _memstep.leaks() == []
    mxprof.set_state("stop")
    mxprof.dump()
    trace = mxprof.load(trace_file)
    assert [h.rule for h in find_hints([trace]) if h.rule == "memory-leak"] == []


class FakeCuda:
    """torch.cuda as the sampler reads it: device 1 leaks 1 MiB per read."""

    def __init__(self):
        self.reads = 0

    def is_initialized(self):
        return True

    def device_count(self):
        return 2

    def memory_allocated(self, d):
        self.reads += d
        return 64 * MB + d * self.reads * MB

    def memory_reserved(self, d):
        return 128 * MB


def test_the_cuda_allocator_is_sampled_per_device_and_its_leak_named(trace_file, monkeypatch):
    fake = types.SimpleNamespace(cuda=FakeCuda())
    monkeypatch.setitem(sys.modules, "torch", fake)
    flagged = run_steps(trace_file, 20, lambda k: None, leak_sites_steps=0)
    assert flagged == 15
    (found,) = [f for f in _memstep.leaks() if f["series"].startswith("cuda")]
    assert (found["series"], found["rate_per_step"]) == ("cuda:1 allocated", MB)
    assert found["sites"] is None  # leak_sites_steps=0: tracemalloc stays off
    monkeypatch.delitem(sys.modules, "torch")
    mxprof.set_state("stop")
    mxprof.dump()
    trace = mxprof.load(trace_file)
    counters = {}
    for e in trace:
        if e.ph == "C" and e.category == "Process Memory":
            counters.setdefault(e.name, []).append(e.args[e.name])
    assert counters["cuda:0 allocated"] == [64 * MB] * 20
    assert counters["cuda:0 reserved"] == [128 * MB] * 20
    assert counters["cuda:1 allocated"] == [64 * MB + k * MB for k in range(1, 21)]


def test_without_proc_it_says_so_once(trace_file, monkeypatch):
    monkeypatch.setattr(_memstep.SAMPLER, "_open", lambda path: -1)
    with pytest.warns(RuntimeWarning, match="unavailable on this system") as caught:
        run_steps(trace_file, 30, lambda k: None)
    assert len([w for w in caught if "unavailable" in str(w.message)]) == 1
    mxprof.set_state("stop")
    mxprof.dump()
    assert not [e for e in mxprof.load(trace_file) if e.category == "Process Memory"]


@needs_proc
def test_the_period_samples_smaps_rollup_off_the_steps(trace_file):
    _testing.start(trace_file, memory_steps=True, memory_period=0.01)
    deadline = time.monotonic() + LIMIT
    while _memstep.SAMPLER.counters.get("uss") is None or len(_memstep.SAMPLER.rolled) < 3:
        assert time.monotonic() < deadline, "no period samples"
        time.sleep(0.01)
    mxprof.set_state("stop")
    mxprof.dump()
    names = {e.name for e in mxprof.load(trace_file) if e.category == "Process Memory"}
    assert {"rss", "pss", "uss", "shared"} <= names


@fresh
@needs_proc
def test_a_leak_takes_a_flight_recorder_snapshot(tmp_path):
    kept = []
    run_steps(
        tmp_path / "run.json",
        20,
        lambda k: kept.append(touched(1)),
        flight_recorder=30,
        flight_recorder_interval=0,
    )
    deadline = time.monotonic() + LIMIT
    while not glob.glob(str(tmp_path / "*.flight*leak*")):
        assert time.monotonic() < deadline, "no snapshot"
        time.sleep(0.01)
    (path,) = glob.glob(str(tmp_path / "*.flight*leak*"))
    deadline = time.monotonic() + LIMIT
    while True:  # written by the background writer: read it once complete
        try:
            with open(path) as f:
                snapshot = json.load(f)
            break
        except ValueError:
            assert time.monotonic() < deadline, "snapshot never complete"
            time.sleep(0.01)
    meta = snapshot["otherData"]["flight_recorder"]
    assert meta["reason"] == "leak"
    assert meta["details"]["series"] == "rss"
    assert meta["details"]["process"] == f"main (pid {os.getpid()})"


# ---- a followed worker: no steps of its own, its period samples are its steps ----

OBJECTS = []


def _worker_touching_inherited_objects(chunks, sleep):
    """A worker reading (and so writing the refcounts of) objects it inherited."""
    per = len(OBJECTS) // chunks
    for c in range(chunks):
        total = 0
        for x in OBJECTS[c * per : (c + 1) * per]:
            total += x
        time.sleep(sleep)


@fresh
@needs_proc
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_worker_whose_shared_pages_turn_private_is_named_with_copy_on_read(tmp_path):
    OBJECTS[:] = [10**6 + k for k in range(1_600_000)]  # ~50 MiB of int objects, shared
    try:
        _testing.start(
            tmp_path / "main.json",
            follow_children=True,
            memory_steps=True,
            memory_period=0.05,
            leak_sites_steps=0,
        )
        ctx = multiprocessing.get_context("fork")
        worker = ctx.Process(target=_worker_touching_inherited_objects, args=(40, 0.06))
        worker.start()
        worker.join(LIMIT)
        assert worker.exitcode == 0
    finally:
        OBJECTS.clear()
    mxprof.set_state("stop")
    mxprof.dump()
    child = mxprof.load(tmp_path / f"main.{worker.pid}.json")
    marks = [e.name for e in child if e.ph == "i" and e.category == "Process Memory"]
    assert len(marks) == 1
    assert marks[0].startswith("leak: uss +")
    assert f"in child {worker.name} (pid {worker.pid})" in marks[0]
    assert marks[0].endswith("shared pages turning private")
    (hint,) = [h for h in find_hints([child]) if h.rule == "memory-leak"]
    assert hint.title.startswith(f"Memory leak: uss of pid {worker.pid} grows")
    cow = "  copy-on-read: shared pages turning private"
    assert any(line.startswith(cow) for line in hint.evidence)


# ---- torch's DataLoader: each worker samples itself ----

KEPT = []


class LeakyDataset:
    """Each item its worker makes keeps 1 MiB alive in that worker."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        KEPT.append(touched(1))
        return i


@fresh
@needs_proc
@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_dataloader_worker_leaking_1_mb_per_batch_is_named(tmp_path):
    torch_data = pytest.importorskip("torch.utils.data", reason="PyTorch is not installed")
    _testing.start(
        tmp_path / "main.json",
        follow_children=True,
        memory_steps=True,
        memory_period=0.05,
        leak_sites_steps=0,
    )
    loader = torch_data.DataLoader(
        LeakyDataset(), batch_size=1, num_workers=2, multiprocessing_context="fork"
    )
    step = mxprof.Domain("train").new_frame("step")
    with step:
        pass
    for _ in loader:
        with step:
            time.sleep(0.03)  # the main loop is slower than the workers: they wait to produce
    del loader
    mxprof.set_state("stop")
    mxprof.dump()
    workers = sorted(set(glob.glob(str(tmp_path / "main.*.json"))))
    assert len(workers) == 2
    named = []
    for path in workers:
        trace = mxprof.load(path)
        marks = [e.name for e in trace if e.ph == "i" and e.category == "Process Memory"]
        assert len(marks) == 1 and marks[0].startswith("leak: uss +")
        named.append(marks[0].split(" in ")[1].split(" (pid")[0])
        (hint,) = [h for h in find_hints([trace]) if h.rule == "memory-leak"]
        assert hint.evidence[0].split(" per step over ")[1].startswith("16 samples")
        # its period's samples are its steps: flagged within 20 of them
        uss = [e.args["uss"] for e in trace if e.ph == "C" and e.name == "uss"]
        assert first_leak(uss)[0] < 20
    assert sorted(named) == ["DataLoader worker 0", "DataLoader worker 1"]
    main = mxprof.load(tmp_path / "main.json")
    assert [h for h in find_hints([main]) if h.rule == "memory-leak"] == []


@pytest.mark.gpu
def test_a_cuda_leak_is_read_from_torchs_allocator(trace_file):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.zeros(1, device="cuda")  # the program initialises CUDA; mxprof never does
    kept = []

    def body(k):
        kept.append(torch.empty(MB, dtype=torch.uint8, device="cuda"))

    flagged = run_steps(trace_file, 20, body, leak_sites_steps=0)
    assert flagged is not None and flagged < 20
    cuda = [f for f in _memstep.leaks() if f["series"] == "cuda:0 allocated"]
    assert len(cuda) == 1 and cuda[0]["rate_per_step"] == MB
    mxprof.set_state("stop")
    mxprof.dump()
    allocated = [
        e.args["cuda:0 allocated"] for e in mxprof.load(trace_file) if e.name == "cuda:0 allocated"
    ]
    assert len(allocated) == 20 and allocated[-1] - allocated[0] == 19 * MB


@pytest.mark.parametrize(
    "marks", ["not slow", pytest.param("slow", marks=pytest.mark.slow)], ids=["fast", "slow"]
)
def test_live_leaks_in_a_process_of_its_own(marks):
    _run_isolated(marks)
