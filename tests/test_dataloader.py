"""torch's real DataLoader end to end: worker batches, the waits, flows, steps, the stage hint.

Each scenario runs in a fresh interpreter (workers are followed children,
whose configuration travels in the environment) with a bounded timeout;
the assertions read what was recorded: batch numbers, workers, pairs,
flows (in the Perfetto engine where Node runs), per-step numbers, hints.
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch", reason="the DataLoader tests need torch (pip install 'mxprof[torch]')")

import mxprof  # noqa: E402
from mxprof.report.hints import find_hints  # noqa: E402
from mxprof.trace.dataloader import BATCH, WAIT, FlowCollector, loader  # noqa: E402
from mxprof.trace.merge import merge  # noqa: E402
from mxprof.trace.processes import job  # noqa: E402

TIMEOUT = 240  # s: a loaded 2-core machine; a hang fails the test instead of the run

SCRIPT = textwrap.dedent(
    """
    import os, sys, time, json
    import torch, mxprof
    from mxprof.integrations.torch import instrument_dataloader

    class Data(torch.utils.data.Dataset):
        def __init__(self, n, delay, die_at=-1):
            self.n, self.delay, self.die_at = n, delay, die_at
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            if i == self.die_at:
                os._exit(3)  # a worker that dies without a word
            time.sleep(self.delay)
            return torch.full((4,), float(i))

    class Stream(torch.utils.data.IterableDataset):
        def __init__(self, n):
            self.n = n
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            k, m = (info.id, info.num_workers) if info else (0, 1)
            for i in range(k, self.n, m):
                time.sleep(0.001)
                yield torch.tensor([float(i)])

    class Collate:  # a class at module level: spawn pickles it by name
        def __init__(self, delay):
            self.delay = delay
        def __call__(self, items):
            time.sleep(self.delay)
            return torch.utils.data.default_collate(items)

    if __name__ == "__main__":
        cfg = json.loads(sys.argv[1])
        mxprof.set_config(filename=cfg["out"], follow_children=True, aggregate_stats=True,
                          dump_period=cfg.get("dump_period", 0.05))
        if cfg.get("iterable"):
            data = Stream(cfg["n"])
        else:
            data = Data(cfg["n"], cfg["delay"], cfg.get("die_at", -1))
        collate = Collate(cfg.get("collate_delay", 0.0))
        loader = torch.utils.data.DataLoader(
            data, batch_size=cfg["batch"], num_workers=cfg["workers"], collate_fn=collate,
            persistent_workers=cfg.get("persistent", False),
            multiprocessing_context=cfg.get("context"))
        step = mxprof.Domain("train").new_frame("step")
        mxprof.set_state("run")
        got = []
        profiled = instrument_dataloader(loader)
        try:
            for epoch in range(cfg.get("epochs", 1)):
                for batch in profiled:
                    with step:
                        got.append(batch)
                        time.sleep(cfg["compute"])
        except RuntimeError as e:
            print("RAISED", str(e).splitlines()[0])
        mxprof.set_state("stop")
        mxprof.dump()
        print("BATCHES", len(got))
    """
)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """One run with two fork workers and a slow data set, shared by the tests that read it."""
    return run(tmp_path_factory.mktemp("two_workers"), workers=2, delay=0.002)


def run(tmp_path, **cfg):
    """Run the scenario; the merged trace's path and the script's output."""
    script = tmp_path / "scenario.py"
    script.write_text(SCRIPT)
    out = tmp_path / "main.json"
    cfg = {"out": str(out), "n": 48, "batch": 4, "delay": 0.0, "compute": 0.0, **cfg}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("MXPROF_FOLLOW_CHILDREN", None)
    done = subprocess.run(
        [sys.executable, str(script), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    children = sorted(glob.glob(str(tmp_path / "main.*.json")))
    merged = tmp_path / "merged.json"
    merge([str(out), *children], merged)
    return merged, done.stdout, children


def explain(ld, children):
    """What was recorded, for an assertion's message: the run's files are gone by then."""
    lines = [f"children: {children}"]
    for b in ld.batches:
        lines.append(
            f"batch {b.index} worker {b.worker} {b.proc.label} {b.ts}..{b.end} samples {b.samples}"
        )
    for w in ld.waits:
        got = None if w.batch is None else (w.batch.index, w.batch.proc.label, w.batch.ts)
        lines.append(f"wait {w.index} {w.ts}..{w.end} -> {got}")
    for path in children:
        events = json.loads(pathlib.Path(path).read_text())["traceEvents"]
        mine = [
            (e.get("ph"), e.get("name"), e.get("ts"), e.get("dur"), e.get("args"))
            for e in events
            if e.get("cat") == "dataloader" and e.get("name") != "DataLoader getitem"
        ]
        lines.append(f"{path}: {len(events)} events; {mine}")
    return "\n".join(lines)


def flows_of(path):
    events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e.get("ph") in ("s", "f")]


def test_workers_batches_waits_and_flows(two_workers):
    merged, out, children = two_workers
    assert "BATCHES 12" in out
    assert len(children) == 2  # each worker process profiled into its own file
    trace = mxprof.load(merged)
    ld = loader(job([trace]))
    assert ld is not None
    assert sorted(ld.workers) == [0, 1]
    assert sorted(b.index for b in ld.batches) == list(range(12))
    # torch hands batch i to worker i % 2 (round robin, nothing failed)
    assert all(b.worker == b.index % 2 for b in ld.batches)
    assert all(b.samples == 4 and b.getitem > 0 and b.collate > 0 for b in ld.batches)
    assert all(b.getitem <= b.end - b.ts for b in ld.batches)
    # every wait that returned a batch is paired with the batch of its number,
    # made in a worker and begun before the wait ended
    paired = [w for w in ld.waits if w.batch is not None]
    assert [w.index for w in paired] == list(range(12))
    assert all(w.batch.index == w.index and w.batch.ts < w.end for w in paired)
    assert all(w.batch.proc is not ld.main for w in paired)
    # one s/f flow pair per paired wait, s in the worker's batch, f in the main's wait
    flows = flows_of(merged)
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    ends = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert len(starts) == len(ends) == 12
    assert set(starts) == set(ends)
    main_pid = {e["pid"] for e in ends.values()}
    assert len(main_pid) == 1 and main_pid.isdisjoint(e["pid"] for e in starts.values())
    assert all(e["bp"] == "e" for e in ends.values())
    # per step: the data wait before it and each worker's busy time in its window
    assert len(ld.steps) == 12
    last = ld.steps[-1].window[1]
    before = sum(w.end - w.ts for w in ld.waits if w.end <= last)
    assert sum(s.wait for s in ld.steps) == before  # the epoch's end (after the last step) in none
    assert ld.steps[0].wait == ld.waits[0].end - ld.waits[0].ts  # the first batch: startup
    for s in ld.steps:
        assert set(s.busy) <= {0, 1}
        assert all(0 <= ns <= s.window[1] - s.window[0] for ns in s.busy.values())
    assert sum(sum(s.busy.values()) for s in ld.steps) > 0


def test_flows_bound_in_perfetto(two_workers):
    sys.path.insert(0, os.path.dirname(__file__))
    try:
        import _perfetto_engine as pe
    finally:
        sys.path.pop(0)
    merged, _, _ = two_workers
    try:
        engine = pe.Engine.start()
    except pe.Unavailable as e:
        pytest.skip(f"Perfetto engine: {e}")
    try:
        assert engine.load(str(merged)) == []
        rows = engine.query(
            "select a.name x, b.name y from flow f join slice a on f.slice_out = a.id "
            "join slice b on f.slice_in = b.id"
        )
    finally:
        engine.close()
    # Every flow joins a worker's batch to a main-process wait (v52 orders a
    # v1 flow's two slices by start, so a wait begun first comes out first).
    assert len(rows) == 12
    assert all({r["x"], r["y"]} == {BATCH, WAIT} for r in rows)


def test_stage_hint_fires_for_a_slow_dataset(tmp_path):
    merged, _, _ = run(tmp_path, workers=2, delay=0.004, compute=0.001)
    found = {h.rule: h for h in find_hints([mxprof.load(merged)])}
    h = found["dataloader-stage"]
    assert "the slow stage is getitem" in h.title
    assert "too few workers (2 for" in h.title
    assert h.severity == "high"
    assert any(line.startswith("worker 0 (") for line in h.evidence)
    assert any(line.startswith("worker 1 (") for line in h.evidence)
    assert "raise num_workers from 2 to" in h.suggestion


def test_stage_hint_names_a_slow_collate(tmp_path):
    merged, _, _ = run(tmp_path, workers=2, collate_delay=0.02, compute=0.001, n=32)
    h = {h.rule: h for h in find_hints([mxprof.load(merged)])}["dataloader-stage"]
    assert "the slow stage is collate" in h.title
    assert h.suggestion.startswith("Make collate_fn cheaper")
    assert "DataLoader collate" in h.subjects


def test_per_step_in_stats_ranks_and_report(two_workers, tmp_path, capsys):
    from mxprof.cli import main
    from mxprof.report.ranks import analyze
    from mxprof.trace.dataloader import to_dict

    merged, _, _ = two_workers
    trace = mxprof.load(merged)
    expected = to_dict(loader(job([trace])))
    assert main(["stats", str(merged), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["DataLoader"] == expected
    assert [s["step"] for s in expected["steps"]] == list(range(12))
    first = expected["steps"][0]
    assert first["waited_for"]["0"] == first["wait"]  # batch 0 comes from worker 0
    assert all(
        s["busy"][w] + s["idle"][w] == s["window"] for s in expected["steps"] for w in ("0", "1")
    )
    assert main(["stats", str(merged)]) == 0
    text = capsys.readouterr().out
    assert "DataLoader: " in text and "12 batches, 12 joined to their wait" in text
    assert analyze([trace]).to_dict()["dataloader"] == expected
    html = tmp_path / "r.html"
    assert main(["report", str(merged), "-o", str(html)]) == 0
    page = html.read_text()
    assert '"name": "data wait: worker 0"' in page or '"name":"data wait: worker 0"' in page
    assert "worker 1 busy" in page


def test_pin_memory_thread_recorded(tmp_path):
    import torch
    import torch.utils.data._utils.pin_memory as pin

    from mxprof.integrations.torch import instrument_dataloader

    out = tmp_path / "pin.json"
    mxprof.set_config(filename=str(out), aggregate_stats=True)
    data = torch.utils.data.TensorDataset(torch.zeros(4))
    with pytest.warns(UserWarning, match="not profiled"):  # no workers run here
        handle = instrument_dataloader(
            torch.utils.data.DataLoader(data, num_workers=1, pin_memory=True)
        )
    mxprof.set_state("run")

    def do_one_step(idx):  # as torch's pin-memory loop: the batch number in idx
        return pin.pin_memory("not a tensor", None)

    assert do_one_step(5) == "not a tensor"
    mxprof.set_state("stop")
    mxprof.dump()
    handle.remove()
    events = list(mxprof.load(out))
    assert [e.name for e in events if e.ph == "X" and e.category == "dataloader"] == [
        "DataLoader pin"
    ]
    assert [e.args for e in events if e.name == "DataLoader pin index"] == [
        {"DataLoader pin index": 5}
    ]
    assert pin.pin_memory.__name__ == "pin_memory" and pin.pin_memory.__module__.startswith(
        "torch"
    )  # given back at remove()


def test_stage_hint_silent_for_a_fast_dataset(tmp_path):
    merged, _, _ = run(tmp_path, workers=2, delay=0.0, compute=0.02, n=32)
    trace = mxprof.load(merged)
    ld = loader(job([trace]))
    assert ld is not None and len(ld.batches) == 8  # recorded, just not slow
    assert "dataloader-stage" not in {h.rule for h in find_hints([trace])}


def test_no_workers(tmp_path):
    merged, out, children = run(tmp_path, workers=0, delay=0.001, n=16)
    assert "BATCHES 4" in out and children == []
    trace = mxprof.load(merged)
    ld = loader(job([trace]))
    assert ld is not None
    # Made inside the wait, on the main thread: batch ranges nested in the waits.
    assert [b.index for b in ld.batches] == [0, 1, 2, 3]
    assert all(b.proc is ld.main and b.samples == 4 for b in ld.batches)
    for w in ld.waits[:4]:
        assert w.batch is not None and w.ts <= w.batch.ts and w.batch.end <= w.end
    assert flows_of(merged) == []  # one process: nothing to join across


def test_iterable_dataset(tmp_path):
    merged, out, _ = run(tmp_path, workers=2, iterable=True, n=24)
    assert "BATCHES 6" in out
    ld = loader(job([mxprof.load(merged)]))
    assert ld is not None
    made = [b for b in ld.batches if b.samples]
    assert sum(b.samples for b in made) >= 24  # each next() of the stream a getitem
    paired = sorted(w.index for w in ld.waits if w.batch is not None)
    # the epoch's last wait joins the worker's fetch that found the stream exhausted
    assert paired[:6] == list(range(6)) and len(paired) <= 7


@pytest.mark.parametrize("persistent", [False, True])
def test_two_epochs(tmp_path, persistent):
    # No background write during the run (dump_period 60 s): every worker's
    # file is written as it exits. Persistent workers outlive the loop and
    # are ended at the main process's exit: mxprof ends them torch's way
    # (told to stop) instead of multiprocessing's SIGTERM, on which torch's
    # worker leaves by _exit and its file would be missing.
    merged, out, children = run(
        tmp_path, workers=2, epochs=2, persistent=persistent, n=16, dump_period=60
    )
    assert "BATCHES 8" in out
    # persistent workers live through both epochs; otherwise each epoch forks two
    assert len(children) == (2 if persistent else 4)
    ld = loader(job([mxprof.load(merged)]))
    assert ld is not None
    paired = [w for w in ld.waits if w.batch is not None]
    assert [w.index for w in paired] == [0, 1, 2, 3, 0, 1, 2, 3], explain(ld, children)
    # numbers restart per epoch: each wait joins its own epoch's batch
    assert len({id(w.batch) for w in paired}) == 8, explain(ld, children)
    assert all(w.batch.end <= w.end for w in paired)
    assert len(flows_of(merged)) == 16


def test_spawn(tmp_path):
    merged, out, children = run(tmp_path, workers=2, context="spawn", n=16)
    assert "BATCHES 4" in out
    assert len(children) == 2
    ld = loader(job([mxprof.load(merged)]))
    assert ld is not None and sorted(ld.workers) == [0, 1]
    assert sorted(w.index for w in ld.waits if w.batch is not None) == [0, 1, 2, 3]


def test_worker_that_dies(tmp_path):
    # Sample 9 kills its worker: torch raises in the main process, whose
    # profile is still written whole (the subprocess's timeout bounds a hang).
    merged, out, _ = run(tmp_path, workers=2, n=32, die_at=9)
    assert "RAISED DataLoader worker (pid" in out
    trace = mxprof.load(tmp_path / "main.json")
    waits = [e for e in trace if e.name == WAIT]
    assert waits and all(e.dur is not None for e in waits)
    ld = loader(job([mxprof.load(merged)]))
    assert ld is not None
    assert 2 not in {w.index for w in ld.waits if w.batch is not None}  # never made


def test_flow_collector_pairs_by_number_and_time():
    c = FlowCollector()
    ev = [
        {"ph": "X", "cat": "dataloader", "name": BATCH, "ts": 10.0, "dur": 5.0, "pid": 2, "tid": 1},
        {"ph": "C", "cat": "dataloader", "name": "DataLoader batch index", "ts": 10.0,
         "pid": 2, "args": {"DataLoader batch index": 0}},
        {"ph": "X", "cat": "dataloader", "name": BATCH, "ts": 30.0, "dur": 5.0, "pid": 2, "tid": 1},
        {"ph": "C", "cat": "dataloader", "name": "DataLoader batch index", "ts": 30.0,
         "pid": 2, "args": {"DataLoader batch index": 0}},
        {"ph": "X", "cat": "dataloader", "name": WAIT, "ts": 12.0, "dur": 8.0, "pid": 1, "tid": 1},
        {"ph": "C", "cat": "dataloader", "name": "DataLoader wait index", "ts": 12.0,
         "pid": 1, "args": {"DataLoader wait index": 0}},
        {"ph": "X", "cat": "dataloader", "name": WAIT, "ts": 33.0, "dur": 4.0, "pid": 1, "tid": 1},
        {"ph": "C", "cat": "dataloader", "name": "DataLoader wait index", "ts": 33.0,
         "pid": 1, "args": {"DataLoader wait index": 0}},
    ]  # fmt: skip
    c.see(ev)
    flows = c.flows()
    starts = [e for e in flows if e["ph"] == "s"]
    ends = [e for e in flows if e["ph"] == "f"]
    # epoch 2's wait for batch 0 joins epoch 2's batch 0, not epoch 1's
    assert [(s["ts"], f["ts"]) for s, f in zip(starts, ends)] == [(12.5, 19.999), (32.5, 36.999)]


def test_instrument_dataloader_bad_input():
    import torch

    from mxprof.integrations.torch import instrument_dataloader

    with pytest.raises(TypeError, match="needs a DataLoader, got list"):
        instrument_dataloader([1, 2])
    loader_ = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4)))
    first = instrument_dataloader(loader_)
    with pytest.raises(mxprof.ConfigError, match="already instrumented"):
        instrument_dataloader(loader_)
    first.remove()
    assert loader_.worker_init_fn is None
    instrument_dataloader(loader_).remove()
    mxprof.set_config(follow_children=False)
    with_workers = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.zeros(4)), num_workers=2
    )
    with pytest.warns(UserWarning, match=r"not profiled \(set_config\(follow_children=True\)\)"):
        instrument_dataloader(with_workers).remove()


def synthetic(path, pin_ms=0.0):
    """A merged trace as instrument_dataloader and merge write it (ms times):
    per step k a 10 ms wait, then a 10 ms step; worker k % 2 makes batch k in
    1 ms inside the wait (so the workers idle while the loop waits)."""
    ev = []

    def rng(name, pid, tid, ts, dur, cat="dataloader", args=None):
        e = {"name": name, "cat": cat, "ph": "X", "ts": ts * 1e3, "dur": dur * 1e3}
        ev.append({**e, "pid": pid, "tid": tid, **({"args": args} if args else {})})

    def cnt(name, pid, ts, value):
        ev.append({"name": name, "cat": "dataloader", "ph": "C", "ts": ts * 1e3, "pid": pid,
                   "tid": 1, "args": {name: value}})  # fmt: skip

    for k in range(10):
        t = 20.0 * k
        rng("DataLoader wait", 1, 1, t, 10.0)
        cnt("DataLoader wait index", 1, t + 0.001, k)
        rng("step", 1, 1, t + 10.0, 10.0, cat="train,frame", args={"frame": k})
        w = 2 + k % 2
        rng("DataLoader batch", w, 1, t + 1.0, 1.0)
        cnt("DataLoader batch index", w, t + 1.001, k)
        cnt("DataLoader worker", w, t + 1.001, k % 2)
        rng("DataLoader getitem", w, 1, t + 1.01, 0.5)
        rng("DataLoader collate", w, 1, t + 1.6, 0.3)
        if pin_ms:
            rng("DataLoader pin", 1, 2, t + 2.0, pin_ms)
            cnt("DataLoader pin index", 1, t + 2.001, k)
    path.write_text(json.dumps({"traceEvents": ev, "displayTimeUnit": "ms"}))
    return mxprof.load(path)


def test_stage_hint_prefetch_too_small(tmp_path):
    trace = synthetic(tmp_path / "idle.json")
    ld = loader(job([trace]))
    assert [w.batch.index for w in ld.waits] == list(range(10))
    h = {h.rule: h for h in find_hints([trace])}["dataloader-stage"]
    # step time 10..200 ms holds 9 waits (90 ms: 47 %); worker 0 lives 1..162 ms,
    # where the waits cover 9 + 7 x 10 + 2 = 81 ms and it is busy 5 x 1 ms: 6.2 %;
    # worker 1 lives 21..182 ms: 9 + 7 x 10 + 2 = 81 ms likewise: 10 / 160 = 6.25 %
    assert h.title == (
        "Steps wait on data 47 % of step time while the workers are busy only 6.3 % of "
        "the wait: prefetch too small"
    )
    assert "raise prefetch_factor" in h.suggestion


def test_stage_hint_pin(tmp_path):
    trace = synthetic(tmp_path / "pin.json", pin_ms=15.0)
    ld = loader(job([trace]))
    assert all(w.batch.pin == 15_000_000 for w in ld.waits)
    h = {h.rule: h for h in find_hints([trace])}["dataloader-stage"]
    assert h.title == (
        "Steps wait on data 47 % of step time: pinning memory takes 15.000ms per batch, "
        "more than a step's 10.000ms"
    )
    assert "DataLoader pin" in h.subjects
