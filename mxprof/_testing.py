"""Test support: return the profiler to a clean state, drive a fake clock.

Not part of the public API; used by mxprof's own test suite.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, Callable

from . import _memstep, _native, control, flight, memory
from ._session import SESSION


def reset() -> None:
    """Stop everything and forget all state except interned objects' ids."""
    with SESSION.lock:
        if SESSION.flusher is not None:
            SESSION.flusher.stop()
        _native.reset_for_testing()
        memory.reset()
        flight.RECORDER.reset()
        SESSION.reset()
        SESSION.sync()
        _memstep.SAMPLER.forget()


@contextlib.contextmanager
def fake_clock(start_ns: int = 0) -> Iterator[Callable[[int], None]]:
    """Freeze the core's clock at start_ns; yields ``advance(ns)``.

    Example:
        >>> with fake_clock() as advance:  # doctest: +SKIP
        ...     task.start(); advance(1_000_000); task.stop()   # exactly 1 ms
    """
    _native.clock_fake(1, start_ns)
    try:
        yield _native.clock_fake_advance
    finally:
        _native.clock_fake(0, 0)


def start(trace_file: object, **config: Any) -> None:
    """Record into trace_file with statistics on and mxprof's own tasks off."""
    control.set_config(filename=str(trace_file), aggregate_stats=True, profile_api=False, **config)
    control.set_state("run")


def finish(trace_file: object) -> dict[str, Any]:
    """Stop, write, and parse the trace file."""
    control.set_state("stop")
    control.dump()
    return load_trace(trace_file)


def load_trace(path: object) -> dict[str, Any]:
    """Parse a trace file strictly (any JSON error fails the test)."""
    with open(str(path), encoding="utf-8") as f:
        return json.load(f)  # type: ignore[no-any-return]


def events(trace: dict[str, Any], ph: str | None = None, name: str | None = None) -> list[Any]:
    """The trace's events, optionally only those of one phase and/or name."""
    return [
        e
        for e in trace["traceEvents"]
        if (ph is None or e["ph"] == ph) and (name is None or e.get("name") == name)
    ]


def run_ranges(task: Any, n: int) -> None:
    """Record n ranges of task with start()/stop()."""
    for _ in range(n):
        task.start()
        task.stop()


def count(path: object, name: str = "t") -> int:
    """How many complete ("X") ranges named name the trace file at path holds."""
    return len(events(load_trace(path), "X", name))


def cli(*args: object, cwd: object, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mxprof *args`` in cwd (not the repository root, whose
    mxprof/ has no compiled core); check=True fails on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, "-m", "mxprof", *map(str, args)],
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc
