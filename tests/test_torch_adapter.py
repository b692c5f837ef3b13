"""mxprof.integrations.torch: module tasks, scopes, backward, memory, removal."""

import gc
import json
import threading

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the torch extra)")
nn = torch.nn

import mxprof  # noqa: E402
from mxprof import _native, _testing, memory  # noqa: E402
from mxprof._native import lib  # noqa: E402
from mxprof.integrations.torch import _memory as mxtorch_memory  # noqa: E402
from mxprof.integrations.torch import instrument, uninstrument  # noqa: E402

_no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def needs_cuda(fn):
    """Marked ``gpu`` (``pytest -m gpu`` runs these on a GPU machine); skips elsewhere."""
    return pytest.mark.gpu(_no_cuda(fn))


# Backward ranges are recorded whole after the fact; the core converts their
# times to its clock with a calibration that moves by a few ns between calls.
SLACK = 1.0  # us


def core_scope():
    sid = lib.mxp_scope_current()
    return "<unk>:" if sid == 0 else _native.object_info(sid).name


class Inner(nn.Module):
    """Records the scope it runs in, both as Python and the core see it."""

    def __init__(self, fail=False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fail = fail
        self.seen = []

    def forward(self, x):
        self.seen.append((mxprof.current_scope(), core_scope()))
        if self.fail:
            raise ValueError("inner failed")
        return self.fc(x)


class Net(nn.Module):
    def __init__(self, fail=False):
        super().__init__()
        self.block = nn.Sequential()
        self.block.add_module("inner", Inner(fail))
        self.block.add_module("act", nn.Tanh())
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block(x))


PATHS = ["model", "model.block", "model.block.inner", "model.block.inner.fc", "model.block.act"]
PATHS += ["model.head"]


def run(trace_file, fn, **config):
    """Profile fn(); return (statistics JSON, trace)."""
    mxprof.set_config(filename=trace_file, aggregate_stats=True, **config)
    mxprof.set_state("run")
    try:
        fn()
    finally:
        mxprof.set_state("stop")
    mxprof.dump()
    return json.loads(mxprof.dumps(format="json")), _testing.load_trace(trace_file)


def counts(stats, domain="torch"):
    return {name: row["Count"] for name, row in stats["Time"].get(domain, {}).items()}


def x():
    return torch.randn(3, 4)


def test_each_module_call_is_a_task_named_by_its_path(trace_file):
    net = Net()
    handle = instrument(net)
    assert handle.paths == PATHS
    stats, trace = run(trace_file, lambda: [net(x()) for _ in range(3)])
    assert counts(stats) == dict.fromkeys(PATHS, 3)
    names = {e["name"] for e in _testing.events(trace, "X") if e["cat"] == "torch"}
    assert names == set(PATHS)


def test_a_module_called_twice_counts_twice_and_a_shared_one_is_hooked_once(trace_file):
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = self.a  # the same module under a second name

        def forward(self, x):
            return self.b(self.a(x))

    net = Twice()
    handle = instrument(net, name="twice", domain="mine")
    assert handle.paths == ["twice", "twice.a"]
    assert len(net.a._forward_hooks) == len(net.a._forward_pre_hooks) == 1
    stats, _ = run(trace_file, lambda: [net(x()) for _ in range(3)])
    assert counts(stats, "mine") == {"twice": 3, "twice.a": 6}


def test_tasks_nest_in_the_trace(trace_file):
    net = Net()
    instrument(net)
    _, trace = run(trace_file, lambda: net(x()))
    ev = {e["name"]: e for e in _testing.events(trace, "X") if e["cat"] == "torch"}
    for child, parent in [
        ("model.block", "model"),
        ("model.block.inner", "model.block"),
        ("model.block.inner.fc", "model.block.inner"),
        ("model.block.act", "model.block"),
        ("model.head", "model"),
    ]:
        c, p = ev[child], ev[parent]
        assert c["tid"] == p["tid"]
        assert p["ts"] <= c["ts"] and c["ts"] + c["dur"] <= p["ts"] + p["dur"], (child, parent)
    assert ev["model.block"]["ts"] + ev["model.block"]["dur"] <= ev["model.head"]["ts"]


def test_scopes_nest_like_gluon_and_follow_the_callers_scope(trace_file):
    net = Net()
    inner = net.block.inner
    instrument(net)

    def body():
        net(x())
        with mxprof.scope("train"):
            net(x())
        assert mxprof.current_scope() == core_scope() == "<unk>:"

    run(trace_file, body)
    assert inner.seen == [
        ("model:block:inner:", "model:block:inner:"),
        ("train:model:block:inner:", "train:model:block:inner:"),
    ]


def test_an_exception_in_forward_closes_every_task_and_restores_the_scope(trace_file):
    net = Net(fail=True)
    instrument(net)

    def body():
        with mxprof.scope("outer"):
            with pytest.raises(ValueError, match="inner failed"):
                net(x())
            assert mxprof.current_scope() == core_scope() == "outer:"
        assert mxprof.current_scope() == core_scope() == "<unk>:"
        net.block.inner.fail = False
        net(x())

    stats, trace = run(trace_file, body)
    assert stats["Profiler"]["unmatched_stops"] == 0
    assert stats["Profiler"]["non_lifo_stops"] == 0
    got = counts(stats)
    assert got["model"] == got["model.block"] == got["model.block.inner"] == 2
    assert got["model.block.inner.fc"] == got["model.head"] == 1
    assert net.block.inner.seen[1] == ("model:block:inner:",) * 2


def test_backward_tasks_for_a_training_step(trace_file):
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 1))
    handle = instrument(net)
    assert handle.skipped_backward == ["model.1"]
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def steps():
        for _ in range(2):
            opt.zero_grad()
            net(x()).sum().backward()
            opt.step()

    stats, trace = run(trace_file, steps)
    got = counts(stats)
    assert {n for n in got if n.endswith(".backward")} == {
        "model.backward",
        "model.0.backward",
        "model.2.backward",
    }
    assert all(c == 2 for c in got.values())
    assert got["model.1"] == 2  # in place: forward timed, no backward
    tracks = {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    back = [e for e in _testing.events(trace, "X") if e["name"].endswith(".backward")]
    assert len(back) == 6
    assert {tracks[e["tid"]] for e in back} == {
        f"torch backward (MainThread {threading.get_ident():x})"
    }
    root = [e for e in back if e["name"] == "model.backward"]
    for e in back:  # within a pass, every module's backward lies in the model's
        # The pass's root is the last one to begin before e (the nearest by start
        # time may be the next pass's, when this pass is slow under load).
        r = max((r for r in root if r["ts"] - SLACK <= e["ts"]), key=lambda r: r["ts"])
        assert r["ts"] - SLACK <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"] + SLACK


def test_a_backward_ends_when_the_gradients_of_its_inputs_are_ready(trace_file):
    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 8)

        def forward(self, x):
            return tuple(self.fc(x).chunk(2, dim=1))

    class Merge(nn.Module):
        def forward(self, a, b):
            return (a * b).sum(dim=1, keepdim=True)

    class Net2(nn.Module):
        def __init__(self):
            super().__init__()
            self.split = Split()
            self.merge = Merge()
            self.out = nn.Linear(1, 1)

        def forward(self, x):
            a, b = self.split(x)
            return self.out(self.merge(a, b=b))  # one input by keyword

    net = Net2()
    instrument(net)
    _, trace = run(trace_file, lambda: net(x()).sum().backward())
    ev = {e["name"]: e for e in _testing.events(trace, "X") if e["name"].endswith(".backward")}
    assert set(ev) == {f"model{p}.backward" for p in ("", ".split", ".split.fc", ".merge", ".out")}

    def end(name):
        return ev[name]["ts"] + ev[name]["dur"]

    # Each ends before its predecessor begins: they follow each other, unlike the
    # model's (its input needs no gradient), which lasts until the pass ends.
    assert end("model.out.backward") <= ev["model.merge.backward"]["ts"] + SLACK
    assert end("model.merge.backward") <= ev["model.split.backward"]["ts"] + SLACK
    assert end("model.split.backward") >= end("model.split.fc.backward") - SLACK
    assert end("model.backward") >= end("model.split.backward") - SLACK


def test_backward_hooks_leave_in_place_patterns_and_gradients_alone(trace_file):
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.bn = nn.BatchNorm1d(4)
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            out = self.bn(self.fc(x))
            out += x  # in place on a hooked module's output
            return self.act(out)

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), Residual(), nn.Linear(4, 1))

    plain, hooked = make(), make()
    instrument(hooked)
    data = x()
    plain(data).sum().backward()
    stats, _ = run(trace_file, lambda: hooked(data).sum().backward())
    for a, b in zip(plain.parameters(), hooked.parameters()):
        assert torch.equal(a.grad, b.grad)
    got = counts(stats)
    for path in ["model", "model.0", "model.2", "model.2.fc", "model.2.bn", "model.3"]:
        assert got[path + ".backward"] == 1, path
    assert "model.1.backward" not in got and "model.2.act.backward" not in got


def test_no_backward_under_no_grad_or_when_disabled(trace_file):
    net, other = Net(), Net()
    instrument(net)
    instrument(other, name="other", backward=False)

    def body():
        with torch.no_grad():
            net(x())
        other(x()).sum().backward()

    stats, _ = run(trace_file, body)
    assert not [n for n in counts(stats) if n.endswith(".backward")]
    assert counts(stats)["other.head"] == 1


def test_backward_on_another_thread_gets_its_own_track(trace_file):
    net = nn.Linear(4, 1)
    instrument(net)

    def body():
        loss = net(x()).sum()
        t = threading.Thread(target=loss.backward, name="bw")
        t.start()
        t.join()

    _, trace = run(trace_file, body)
    (back,) = _testing.events(trace, "X", "model.backward")
    tracks = {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}
    assert tracks[back["tid"]].startswith("torch backward (bw ")


def test_uninstrument_removes_every_hook(trace_file):
    net = Net()
    handle = instrument(net)
    assert handle.active
    assert uninstrument(net.block) is True  # any covered module names the whole call
    assert uninstrument(net) is False
    assert not handle.active
    for m in net.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
        assert not m._backward_hooks and not m._backward_pre_hooks
    handle.remove()  # again: nothing happens

    def body():
        net(x()).sum().backward()
        assert net.block.inner.seen[-1] == ("<unk>:", "<unk>:")

    stats, trace = run(trace_file, body)
    assert counts(stats) == {}
    assert not [e for e in _testing.events(trace, "X") if e["cat"] == "torch"]


def test_context_manager_removes_at_the_end(trace_file):
    net = Net()
    with instrument(net) as handle:
        assert handle.active
    assert not handle.active
    assert all(not m._forward_hooks for m in net.modules())


def test_instrumenting_twice_is_an_error_until_removed():
    net = Net()
    handle = instrument(net)
    with pytest.raises(mxprof.StateError, match="model is already instrumented as 'model'"):
        instrument(net)
    with pytest.raises(mxprof.StateError, match="'model.block'"):
        instrument(net.block, name="b")
    assert len(net._forward_hooks) == 1
    handle.remove()
    with instrument(net.block, name="b") as again:
        assert again.paths[0] == "b"


def test_bad_arguments():
    with pytest.raises(TypeError, match="nn.Module"):
        instrument(lambda t: t)
    with pytest.raises(mxprof.ConfigError, match="memory must be"):
        instrument(Net(), memory="gpu")
    with pytest.raises(TypeError, match="domain"):
        instrument(Net(), domain=3)
    with pytest.raises(TypeError, match="backward"):
        instrument(Net(), backward="yes")
    with pytest.raises(mxprof.ConfigError):
        instrument(Net(), name="")
    net = Net()
    assert instrument(net, memory=False).memory is None
    uninstrument(net)
    assert instrument(net, memory="delta").memory == "delta"


@pytest.mark.parametrize("extra", [{}, {"profile_all": True}])
def test_profile_imperative_gates_the_adapter(trace_file, extra):
    net = Net()
    instrument(net)
    stats, _ = run(trace_file, lambda: net(x()).sum().backward(), profile_imperative=False, **extra)
    if extra:
        assert counts(stats)["model.block.inner"] == 1
        assert net.block.inner.seen == [("model:block:inner:",) * 2]
    else:
        assert counts(stats) == {}
        assert net.block.inner.seen == [("<unk>:", "<unk>:")]


def test_threads_keep_their_own_scopes(trace_file):
    net = Net()
    instrument(net)
    barrier = threading.Barrier(2)

    def worker(i):
        with mxprof.scope(f"t{i}"):
            barrier.wait()
            for _ in range(20):
                net(x())

    def body():
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    stats, trace = run(trace_file, body)
    assert counts(stats) == dict.fromkeys(PATHS, 40)
    assert stats["Profiler"]["unmatched_stops"] == stats["Profiler"]["non_lifo_stops"] == 0
    seen = net.block.inner.seen
    assert all(python == core for python, core in seen)
    assert sorted({s for s, _ in seen}) == ["t0:model:block:inner:", "t1:model:block:inner:"]
    assert len(seen) == 40
    tids = {e["tid"] for e in _testing.events(trace, "X", "model")}
    assert len(tids) == 2


def test_keyboard_interrupt_is_cleaned_up_by_remove(trace_file):
    class Interrupt(nn.Module):
        def forward(self, x):
            raise KeyboardInterrupt

    net = nn.Sequential(nn.Linear(4, 4), Interrupt())
    handle = instrument(net)

    def body():
        with pytest.raises(KeyboardInterrupt):
            net(x())
        assert mxprof.current_scope() == "model:1:"  # torch skipped the always-call hooks
        handle.remove()
        assert mxprof.current_scope() == core_scope() == "<unk>:"

    stats, _ = run(trace_file, body)
    assert stats["Profiler"]["unmatched_stops"] == 0
    assert counts(stats) == {"model": 1, "model.0": 1, "model.1": 1}


def test_no_memory_is_recorded_on_cpu(trace_file):
    net = Net()
    instrument(net)
    run(trace_file, lambda: net(x()).sum().backward(), profile_memory=True)
    assert memory.live() == []
    assert all(u.allocs == 0 for u in memory.usage())


# ---- memory logic with the device faked, so that it runs without a GPU ----


class FakeAllocator:
    def __init__(self):
        self.allocated = self.requested = 0
        self.pending = []

    def stats(self, ordinal):
        assert ordinal == 0
        return self.allocated, self.requested


def test_allocator_tracker_attributes_each_block_to_the_current_scope(trace_file):
    fake = FakeAllocator()
    tracker = mxtorch_memory._AllocatorTracker(
        stats=fake.stats,
        current=lambda: 0,
        blocks=lambda: ({0x1000: (0, 4096, 4000, False)}, [0]),
    )
    fake.allocated, fake.requested = 4096, 4000  # a block live before tracking began
    tracker.start()
    live = {}

    def alloc(ptr, actual, requested):
        fake.allocated += actual
        fake.requested += requested
        tracker.on_alloc(ptr)

    def free(ptr, actual, requested):
        tracker.on_free(ptr)  # torch calls back before it updates its statistics
        fake.allocated -= actual
        fake.requested -= requested

    def body():
        with mxprof.scope("model"), mxprof.scope("fc"):
            alloc(0x2000, 1024, 1000)
        free(0x1000, 4096, 4000)  # known from the snapshot: not recorded, books stay right
        with mxprof.scope("model"):
            alloc(0x3000, 512, 500)
        live.update({a.ptr: a for a in memory.live()})
        free(0x2000, 1024, 1000)
        tracker.on_free(0x9999)  # unknown: ignored

    run(trace_file, body, profile_memory=True)
    assert set(live) == {0x2000, 0x3000}
    assert live[0x2000][1:6] == (1000, 1024, "gpu/0", "model:fc:", "")
    assert live[0x3000][1:5] == (500, 512, "gpu/0", "model:")
    assert [a.ptr for a in memory.live()] == [0x3000]
    usage = {u.name: u for u in memory.usage()}
    assert usage["model:fc:"].peak == 1024 and usage["model:fc:"].current == 0
    assert usage["gpu/0"].current == 512


def test_allocator_tracker_recovers_from_an_unknown_free(trace_file):
    fake = FakeAllocator()
    tracker = mxtorch_memory._AllocatorTracker(
        stats=fake.stats, current=lambda: 0, blocks=lambda: ({}, [0])
    )
    fake.allocated = fake.requested = 100  # a block the tracker never learnt of
    tracker.start()
    sizes = []

    def body():
        tracker.on_free(0x50)
        fake.allocated = fake.requested = 0
        for ptr in (0x60, 0x70):
            fake.allocated += 64
            fake.requested += 64
            tracker.on_alloc(ptr)
            sizes.append({a.ptr: a.actual for a in memory.live()}.get(ptr))

    run(trace_file, body, profile_memory=True)
    assert sizes == [None, 64]  # the first size is unknowable; the next is exact again


def test_allocator_tracker_follows_profile_imperative(trace_file):
    fake = FakeAllocator()
    tracker = mxtorch_memory._AllocatorTracker(
        stats=fake.stats, current=lambda: 0, blocks=lambda: ({}, [0])
    )
    tracker.start()

    def body():
        fake.allocated = fake.requested = 256
        tracker.on_alloc(0x10)
        assert memory.live() == []

    run(trace_file, body, profile_memory=True, profile_imperative=False)


def test_delta_mode_records_what_each_module_left_allocated(trace_file, monkeypatch):
    bytes_in_use = [0]

    class Grow(nn.Module):
        def __init__(self, n, child=None):
            super().__init__()
            self.n = n
            self.child = child

        def forward(self, t):
            bytes_in_use[0] += self.n
            return self.child(t) if self.child is not None else t

    net = Grow(100, Grow(40))
    monkeypatch.setattr(mxtorch_memory, "cuda_ordinal", lambda m, module, args: 0)
    monkeypatch.setattr(mxtorch_memory, "cuda_allocated", lambda ordinal: bytes_in_use[0])
    handle = instrument(net, memory="delta")
    snapshots = []

    def body():
        for _ in range(3):
            net(x())
            snapshots.append({u.name: u.current for u in memory.usage() if u.current})

    run(trace_file, body, profile_memory=True)
    assert snapshots[0] == {"gpu/0": 140, "model:": 100, "model:child:": 40}
    assert snapshots[2] == snapshots[0]  # each pass replaces the previous pass's records
    assert {a.tag for a in memory.live()} == {"activations"}
    handle.remove()
    assert memory.live() == []


# ---- real CUDA (skipped without a GPU) ----


def test_a_dropped_handle_gives_back_its_use_of_the_allocator_tracker():
    gc.collect()  # handles that other tests dropped
    before = mxtorch_memory.TRACKER.users
    handle = instrument(Net(), memory="allocator")
    assert mxtorch_memory.TRACKER.users == before + 1
    del handle
    gc.collect()
    assert mxtorch_memory.TRACKER.users == before
    with instrument(Net(), memory="allocator"):
        assert mxtorch_memory.TRACKER.users == before + 1
    assert mxtorch_memory.TRACKER.users == before


@needs_cuda
def test_cuda_allocator_mode_attributes_blocks_to_module_scopes(trace_file):
    gc.collect()  # handles other tests dropped give the tracker back
    net = Net().cuda()
    handle = instrument(net, memory=True)
    if handle.memory != "allocator":
        pytest.skip("this torch offers no per-allocation callbacks")
    data = torch.randn(64, 4, device="cuda")
    kept = []

    def body():
        kept.append(net(data))
        kept.append({a.scope for a in memory.live()})

    run(trace_file, body, profile_memory=True)
    assert {"model:block:inner:fc:", "model:head:"} <= kept[1]
    usage = {u.name: u for u in memory.usage()}
    assert usage["gpu/0"].allocs >= 2
    handle.remove()
    assert not mxtorch_memory.TRACKER.attached


@needs_cuda
def test_cuda_delta_mode_records_activations(trace_file):
    net = Net().cuda()
    instrument(net, memory="delta")
    data = torch.randn(1024, 4, device="cuda")
    kept = []
    run(trace_file, lambda: kept.append(net(data)), profile_memory=True)
    scopes = {a.scope for a in memory.live() if a.tag == "activations"}
    assert "model:head:" in scopes
