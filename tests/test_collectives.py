"""torch.distributed calls recorded by the torch adapter, and a DDP job whose slow rank is named.

The in-process tests run a one-rank gloo group; the DDP job spawns four
ranks (tests/_ddp_child.py), rank 3 sleeping before each backward.
"""

import json
import multiprocessing
import os
import socket
import sys
import time
import warnings

import pytest

import mxprof
from mxprof import _testing

torch = pytest.importorskip("torch", reason="the torch adapter needs PyTorch")
dist = pytest.importorskip("torch.distributed", reason="this PyTorch has no torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this PyTorch has no gloo backend", allow_module_level=True)

from mxprof.integrations.torch import _collectives, instrument, instrument_collectives  # noqa: E402
from mxprof.report.ranks import analyze  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # spawned children import it
import _ddp_child  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")
ASYNC = "torch.distributed.async"


@pytest.fixture
def group(tmp_path):
    """A one-rank gloo process group in this process."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield dist
    dist.destroy_process_group()


def ranges(trace, cat):
    return [e for e in _testing.events(trace, "X") if e.get("cat") == cat]


def thread_names(trace):
    return {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}


def test_names_say_op_dtype_bytes_group_and_peer():
    assert _collectives.describe("all_gather", [torch.zeros(3), torch.zeros(3)]) == ("float32", 24)
    assert _collectives.describe("x", [torch.zeros(2), torch.zeros(2, dtype=torch.int8)]) == (
        "mixed",
        10,
    )
    assert _collectives.describe("barrier", []) == ("none", 0)
    assert _collectives.call_name("recv", "bfloat16", 64, "0", "any") == (
        "recv(bfloat16, 64 B, group 0, peer any)"
    )
    assert _collectives.call_name("all_reduce", "float32", None, "3", label=" ddp bucket 1") == (
        "all_reduce(float32, ? B, group 3) ddp bucket 1"
    )


@pytest.mark.filterwarnings("ignore:.*all_gather_into_tensor. is deprecated")
def test_blocking_calls_are_ranges_on_the_calling_thread(group, trace_file):
    """Each call once, named by what it moves; all_gather_into_tensor (which
    calls all_gather_single) is one range; the calls still do their work."""
    _testing.start(trace_file)
    with instrument_collectives():
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.broadcast(torch.zeros(2, dtype=torch.int64), src=0)
        out = [torch.zeros(3)]
        dist.all_gather(out, torch.full((3,), 7.0))
        dist.all_gather_into_tensor(torch.zeros(3), torch.ones(3))
        dist.barrier()
    trace = _testing.finish(trace_file)
    assert t.tolist() == [1.0] * 4 and out[0].tolist() == [7.0] * 3
    got = ranges(trace, "torch.distributed")
    assert [e["name"] for e in got] == [
        "all_reduce(float32, 16 B, group 0)",
        "broadcast(int64, 16 B, group 0)",
        "all_gather(float32, 12 B, group 0)",
        "all_gather_into_tensor(float32, 12 B, group 0)",
        "barrier(none, 0 B, group 0)",
    ]
    assert {thread_names(trace)[e["tid"]] for e in got} == {"MainThread"}


def test_an_async_handle_is_a_range_until_its_work_completes(group, trace_file):
    _testing.start(trace_file)
    with instrument_collectives():
        work = dist.all_reduce(torch.ones(5, dtype=torch.float64), async_op=True)
        assert isinstance(work, dist.Work)
        work.wait()
        dist.all_reduce(torch.ones(5, dtype=torch.float64), async_op=True).wait()
    trace = _testing.finish(trace_file)
    got = ranges(trace, "torch.distributed.async")
    assert [e["name"] for e in got] == ["all_reduce(float64, 40 B, group 0)"] * 2
    assert {thread_names(trace)[e["tid"]] for e in got} == {"torch.distributed async"}
    assert ranges(trace, "torch.distributed") == []


def test_a_work_without_a_future_ends_its_range_at_wait():
    """gloo's isend/irecv work has no future: the handle returned is a Work
    whose first wait() (or an is_completed() saying so) ends the range."""

    class Inner:
        def wait(self, timeout=None):
            return True

        def is_completed(self):
            return True

        def source_rank(self):
            return 2

    class Counting(_collectives._Done):
        __slots__ = ("calls",)

        def __call__(self, _future=None):
            self.calls.append(self.start)
            super().__call__(_future)

    done = Counting(_collectives.RECORDER, 0, 0, 10, None, None)
    done.calls = []
    work = _collectives._waited(Inner(), done)
    assert isinstance(work, dist.Work)
    assert work.wait() is True and work.is_completed() and work.source_rank() == 2
    assert done.calls == [10, 0]  # ended at the first: the second finds it ended


def test_in_flight_handles_take_tracks_of_their_own(trace_file):
    _testing.start(trace_file)
    lanes = _collectives._Lanes()
    a, b = lanes.take(), lanes.take()
    lanes.give(a)
    assert a != b and lanes.take() == a


def test_nothing_is_recorded_while_stopped_or_without_profile_imperative(group, trace_file):
    with instrument_collectives():
        dist.all_reduce(torch.ones(2))  # before any run
        _testing.start(trace_file, profile_imperative=False)
        dist.all_reduce(torch.ones(2))
        mxprof.set_config(profile_imperative=True)
        dist.all_reduce(torch.ones(3))
    trace = _testing.finish(trace_file)
    assert [e["name"] for e in ranges(trace, "torch.distributed")] == [
        "all_reduce(float32, 12 B, group 0)"
    ]


def test_remove_puts_the_functions_back_when_the_last_user_leaves(group):
    original = dist.all_reduce
    first, second = instrument_collectives(), instrument_collectives()
    assert dist.all_reduce is not original and dist.distributed_c10d.all_reduce is dist.all_reduce
    first.remove()
    first.remove()  # twice is harmless and does not count twice
    assert dist.all_reduce is not original and second.active and not first.active
    second.remove()
    assert dist.all_reduce is original and dist.distributed_c10d.all_reduce is original


def test_a_call_that_cannot_be_described_still_runs_unrecorded(group, trace_file, monkeypatch):
    def broken(op, tensors):
        raise RuntimeError("odd tensor")

    monkeypatch.setattr(_collectives, "describe", broken)
    _testing.start(trace_file)
    before = _collectives.RECORDER.failures
    with instrument_collectives():
        t = torch.ones(2)
        dist.all_reduce(t)
        with pytest.raises(TypeError):  # the caller's own error is torch's, as without mxprof
            dist.all_reduce(t, 1, 2, 3, 4, 5)
    trace = _testing.finish(trace_file)
    assert t.tolist() == [1.0, 1.0]
    assert ranges(trace, "torch.distributed") == []
    assert _collectives.RECORDER.failures == before + 2


def test_names_beyond_the_cap_record_unknown_bytes(group, trace_file, monkeypatch):
    monkeypatch.setattr(_collectives, "MAX_NAMES", 1)
    recorder = _collectives.Recorder()
    _testing.start(trace_file)
    recorder.install()
    try:
        for n in (1, 2, 3):
            dist.all_reduce(torch.ones(n))
    finally:
        recorder.remove()
    assert len(recorder.blocking) == 2  # one name per size up to the cap, then one more
    trace = _testing.finish(trace_file)
    assert [e["name"] for e in ranges(trace, "torch.distributed")] == [
        "all_reduce(float32, 4 B, group 0)",
        "all_reduce(float32, ? B, group 0)",
        "all_reduce(float32, ? B, group 0)",
    ]


def test_ddp_buckets_are_named_and_averaged_as_ddp_does(group, trace_file):
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 2)
    reference = torch.nn.Linear(8, 2)
    reference.load_state_dict(net.state_dict())
    model = torch.nn.parallel.DistributedDataParallel(net)
    x = torch.randn(4, 8)
    _testing.start(trace_file)
    with instrument(model, name="ddp"):
        model(x).sum().backward()
    trace = _testing.finish(trace_file)
    reference(x).sum().backward()
    assert torch.equal(net.weight.grad, reference.weight.grad)
    got = ranges(trace, "torch.distributed.async")
    assert [e["name"] for e in got] == ["all_reduce(float32, 72 B, group 0) ddp bucket 0"]


def test_a_ddp_model_with_its_own_hook_keeps_it(group, trace_file):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    _testing.start(trace_file)
    with pytest.warns(UserWarning, match="buckets are not named"):
        handle = instrument(model)
    with handle:
        model(torch.randn(4, 8)).sum().backward()
    trace = _testing.finish(trace_file)
    # torch's hook calls torch.distributed.all_reduce: recorded, without a bucket label
    got = ranges(trace, "torch.distributed.async")
    assert [e["name"] for e in got] == ["all_reduce(float32, 72 B, group 0)"]


def test_collectives_false_leaves_torch_distributed_alone(group):
    original = dist.all_reduce
    with instrument(torch.nn.Linear(2, 2), collectives=False):
        assert dist.all_reduce is original
    with pytest.raises(TypeError, match="collectives must be a bool"):
        instrument(torch.nn.Linear(2, 2), collectives="yes")


# ---- CUDA: timed on the stream where cuda-python is there (a fake one here) ----


class FakeTensor:
    is_cuda = True
    device = "cuda:0"


def test_calls_on_cuda_tensors_are_timed_on_their_streams(trace_file, monkeypatch, clock):
    """The GPU span starts on the stream current at the issue and ends on the
    one current where the result is ready (a future's callback runs on
    streams synchronised with the work)."""
    from test_cuda import FakeCuda

    from mxprof.cuda import _runtime

    fake = FakeCuda()
    fake.step_ms = 0.5
    monkeypatch.setattr(_runtime, "_result", (_runtime.RuntimeState(fake), None))
    streams = iter([0x7, 0x9])
    monkeypatch.setattr(_collectives, "current_stream", lambda device: next(streams))
    gpu = _collectives._Gpu()
    _testing.start(trace_file)
    span = gpu.begin("all_reduce(float16, 8 B, group 0)", [FakeTensor()])
    gpu.end(span, "cuda:0")
    trace = _testing.finish(trace_file)
    (event,) = ranges(trace, "torch.distributed,gpu")
    assert event["name"] == "all_reduce(float16, 8 B, group 0)"
    assert event["dur"] == 500.0  # the end event half a ms after the start
    assert thread_names(trace)[event["tid"]] == "GPU 0 stream 0x7"
    assert [s for _, s in fake.records[-2:]] == [0x7, 0x9]


def test_without_cuda_python_cuda_calls_are_timed_on_the_host_only(monkeypatch):
    from mxprof.cuda import _runtime

    monkeypatch.setattr(_runtime, "_result", (None, "no cuda-python"))
    gpu = _collectives._Gpu()
    with pytest.warns(UserWarning, match="timed on the host only: CUDA is not available"):
        assert gpu.begin("x", [FakeTensor()]) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once
        assert gpu.begin("x", [FakeTensor()]) is None
    assert gpu.begin("x", [torch.zeros(1)]) is None  # CPU tensors never ask


# ---- a 4-rank DDP job on gloo with a slow rank ----


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ddp_job_records_collectives_per_rank_and_names_the_slow_rank(tmp_path):
    """Rank 3 sleeps 20 ms before each backward: every rank records its
    collectives with op, dtype, bytes and group; the per-rank files, the
    merged file, ``mxprof ranks`` and ``distributed.dumps(ranks=True)`` name
    worker 3 as the straggler, and the report's hint does too."""
    world, steps, slow = 4, 12, 3
    port = free_port()
    procs = [
        SPAWN.Process(
            target=_ddp_child.train, args=(str(tmp_path), r, world, port, steps, slow, 0.02)
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 180
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            p.kill()
    assert [p.exitcode for p in procs] == [0] * world
    files = ["trace.json"] + [f"worker{r}_trace.json" for r in range(1, world)]
    traces = [mxprof.load(tmp_path / f) for f in files]

    params = 32 * 64 + 64 + 64 * 8 + 8
    for rank, trace in enumerate(traces):
        counts = {}
        for e in trace:
            if e.category.startswith("torch.distributed"):
                counts[(e.name, e.category)] = counts.get((e.name, e.category), 0) + 1
        expected = {
            (f"all_reduce(float32, {4 * params} B, group 0) ddp bucket 0", ASYNC): steps,
            ("all_reduce(float32, 4 B, group 0)", "torch.distributed"): steps,
            ("broadcast(float64, 8 B, group 0)", "torch.distributed"): 1,
            ("all_gather(int64, 64 B, group 0)", "torch.distributed"): 1,
            ("all_reduce(float64, 48 B, group 0)", "torch.distributed.async"): 1,
            ("barrier(none, 0 B, group 0)", "torch.distributed"): 1,
        }  # fmt: skip
        if rank == 0:
            expected[("send(float32, 12 B, group 0, peer 1)", "torch.distributed")] = 1
            expected[("isend(float16, 10 B, group 0, peer 2)", ASYNC)] = 1
        if rank == 1:
            expected[("recv(float32, 12 B, group 0, peer 0)", "torch.distributed")] = 1
        if rank == 2:
            expected[("irecv(float16, 10 B, group 0, peer 0)", ASYNC)] = 1
        assert counts == expected, rank

    result = analyze(traces)
    assert result.ranks == [f"worker {r}" for r in range(world)]
    assert result.straggler is not None and result.straggler.label == "worker 3"
    assert len(result.steps) == world * steps
    mean = result.per_rank()
    fast = [mean[f"worker {r}"]["waiting"] for r in range(3)]
    # the others wait for it, it waits least; it idles through its sleep
    assert min(fast) > mean["worker 3"]["waiting"]
    assert mean["worker 3"]["idle"] > max(mean[f"worker {r}"]["idle"] for r in range(3))
    for s in result.steps:
        assert s.compute + s.communication + s.waiting + s.idle == s.total

    merged = analyze(mxprof.load(tmp_path / "merged.json"))
    assert merged.straggler is not None and merged.straggler.label == "worker 3"
    live = json.loads((tmp_path / "ranks.json").read_text())
    assert live["straggler"]["label"] == "worker 3"
    assert live["collectives"]["worker 0"]["send(float32, 12 B, group 0, peer 1)"]["bytes"] == 12

    from mxprof import cli
    from mxprof.report.hints import find_hints

    (hint,) = [h for h in find_hints(traces) if h.rule == "straggler"]
    assert hint.subjects[0] == "worker 3" and "for worker 3" in hint.title
    assert cli.main(["ranks", str(tmp_path / "merged.json")]) == 0
