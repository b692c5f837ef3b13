"""Per-call costs from Python: baselines, mxprof in every mode, and peers.

Every case is a statement timed by timeit with its names bound as locals of
the timing loop (a global or attribute lookup would be timed too).  Within a
repeat every case runs once, after all were warmed up; the result is the
median over repeats, in ns per statement.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mxprof
from mxprof import _testing
from mxprof._native import lib


class _Empty:
    def __enter__(self) -> _Empty:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _plain() -> None:
    pass


@dataclass
class Group:
    """Cases sharing a setup: ``enter`` prepares the state, ``leave`` undoes it."""

    name: str
    cases: dict[str, str]
    names: dict[str, Any]
    enter: Callable[[], None] = lambda: None
    leave: Callable[[], None] = lambda: None
    number: float = 1.0  # fraction of the iterations (for slow peers)
    samples: dict[str, list[float]] = field(default_factory=dict)


BASELINE_CASES = {
    "empty loop": "pass",
    "empty with": "with empty: pass",
    "undecorated call": "plain()",
    "floor: no-op cffi call": "noop(1)",
    "no-op cffi call, GIL released": "released(1)",
    "floor + clock read": "clock(1)",
}

MXPROF_CASES = {
    "task.start(); task.stop()": "task.start(); task.stop()",
    "with task": "with task: pass",
    "decorated call": "decorated()",
    "counter += 1": "counter += 1",
    "counter.set_value(i)": "counter.set_value(7)",
    "marker.mark()": "marker.mark()",
    "with record_function(name)": "with record_function('bench'): pass",
}

MODES = ("recording", "aggregate-only", "paused", "stopped")


def _mxprof_names() -> dict[str, Any]:
    d = mxprof.Domain("bench")
    task = d.new_task("task")
    return {
        "task": task,
        "decorated": task(_plain),
        "counter": d.new_counter("counter", 0),
        "marker": d.new_marker("marker"),
        "record_function": mxprof.record_function,
    }


def _set_mode(mode: str, tmp: str) -> Callable[[], None]:
    def enter() -> None:
        _testing.reset()
        mxprof.set_config(
            filename=os.path.join(tmp, "calls.json"),
            aggregate_stats=True,
            continuous_dump=False,
            profile_api=False,
            max_events=0,
            write_trace=mode != "aggregate-only",
        )
        if mode != "stopped":
            mxprof.set_state("run")
        if mode == "paused":
            mxprof.pause()

    return enter


def _discard() -> None:
    lib.mxp_trace_discard()  # keep buffered records from piling up between cases


def mxprof_groups(tmp: str) -> list[Group]:
    base = Group(
        "baselines",
        BASELINE_CASES,
        {
            "empty": _Empty(),
            "plain": _plain,
            "noop": lib.mxp_noop,
            "released": lib.mxp_noop_released,
            "clock": lib.mxp_noop_clock,
        },
    )
    groups = [base]
    for mode in MODES:
        g = Group(f"mxprof, {mode}", MXPROF_CASES, _mxprof_names(), enter=_set_mode(mode, tmp))
        g.leave = _discard
        groups.append(g)
    return groups


# ---- peers (each only when installed) ----


def _nvtx() -> Group | None:
    try:
        import nvtx
    except ImportError:
        return None
    return Group(
        "nvtx (no tool attached)",
        {
            "with nvtx.annotate(name)": "with annotate('bench'): pass",
            "push_range(); pop_range()": "push('bench'); pop()",
        },
        {"annotate": nvtx.annotate, "push": nvtx.push_range, "pop": nvtx.pop_range},
    )


def _viztracer(tmp: str) -> Group | None:
    try:
        from viztracer import VizTracer
    except ImportError:
        return None
    tracer = VizTracer(verbose=0, output_file=os.path.join(tmp, "viz.json"), tracer_entries=1 << 20)

    def enter() -> None:
        tracer.start()

    def leave() -> None:
        tracer.stop()
        tracer.clear()

    return Group(
        "viztracer (tracing)",
        {"with tracer.log_event(name)": "with log_event('bench'): pass"},
        {"log_event": tracer.log_event},
        enter=enter,
        leave=leave,
        number=0.1,
    )


def _torch() -> Group | None:
    try:
        import torch
    except ImportError:
        return None
    state: dict[str, Any] = {}

    def enter() -> None:
        state["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        state["prof"].start()

    def leave() -> None:
        state.pop("prof").stop()

    return Group(
        "torch.profiler (profiling)",
        {"with record_function(name)": "with record_function('bench'): pass"},
        {"record_function": torch.profiler.record_function},
        enter=enter,
        leave=leave,
        number=0.02,
    )


def _mxnet(tmp: str) -> Group | None:
    try:
        from mxnet import profiler
    except ImportError:
        return None
    profiler.set_config(
        filename=os.path.join(tmp, "mxnet.json"), continuous_dump=False, aggregate_stats=False
    )
    task = profiler.Task(profiler.Domain("bench"), "task")

    def enter() -> None:
        profiler.set_state("run")

    def leave() -> None:
        profiler.set_state("stop")
        profiler.dump(finished=False)  # drain its queue so memory stays flat

    return Group(
        "MXNet profiler (running)",
        {"task.start(); task.stop()": "task.start(); task.stop()"},
        {"task": task},
        enter=enter,
        leave=leave,
        number=0.2,
    )


def peer_groups(tmp: str) -> list[Group]:
    return [g for g in (_nvtx(), _viztracer(tmp), _torch(), _mxnet(tmp)) if g is not None]


def _time(stmt: str, names: dict[str, Any], number: int) -> float:
    setup = "; ".join(f"{k} = names[{k!r}]" for k in names) or "pass"
    return timeit.timeit(stmt, setup, globals={"names": names}, number=number) / number * 1e9


def measure(number: int, repeats: int, peers: bool = True) -> list[Group]:
    """Time every case; returns the groups with their samples filled in."""
    tmp = tempfile.mkdtemp(prefix="mxprof-bench-")
    groups = mxprof_groups(tmp) + (peer_groups(tmp) if peers else [])
    for g in groups:  # warm-up
        g.samples = {case: [] for case in g.cases}
        g.enter()
        for stmt in g.cases.values():
            _time(stmt, g.names, max(1, int(number * g.number) // 10))
        g.leave()
    for _ in range(repeats):
        for g in groups:
            g.enter()
            for case, stmt in g.cases.items():
                g.samples[case].append(_time(stmt, g.names, max(1, int(number * g.number))))
            g.leave()
    _testing.reset()
    return groups


def medians(groups: list[Group]) -> dict[str, dict[str, float]]:
    return {g.name: {c: statistics.median(v) for c, v in g.samples.items()} for g in groups}
