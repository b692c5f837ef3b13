"""torch.profiler's workflow on mxprof's core: record_function, schedule, profile.

``profile`` drives the same session as ``set_config``/``set_state``/``dump``:
each active cycle of its schedule is one mxprof profile, written to its own
trace file; warmup steps record into a profile that is then restarted (its
events discarded); wait steps record nothing.
"""

from __future__ import annotations

import enum
import os
import shutil
from collections.abc import Callable
from typing import Any

from . import _native, stats
from ._children import with_infix
from ._render import category
from ._session import SESSION
from .averages import KeyAverages, Row
from .control import dump, set_config, set_state
from .domain import Domain
from .errors import ConfigError, StateError
from .ranges import Task

DOMAIN = Domain("user_annotation")  # Kineto's category for record_function
_functions: dict[str, Task] = {}


def record_function(name: str) -> Task:
    """An ad-hoc range in the domain ``user_annotation``.

    The range object is interned once per name and reused, so
    ``with record_function("x"):`` costs a dictionary lookup plus the two
    core calls of any range.

    Args:
        name: the range's name.

    Example:
        >>> import mxprof
        >>> with mxprof.record_function("data_prep"):
        ...     pass
        >>> @mxprof.record_function("predict")
        ... def predict(x):
        ...     return x
    """
    task = _functions.get(name)
    if task is None:
        task = _functions[name] = Task(DOMAIN, name)
    return task


class ProfilerAction(enum.Enum):
    """What a step of a schedule does (torch.profiler's names)."""

    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


Schedule = Callable[[int], ProfilerAction]


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"schedule: {name} must be an int >= {minimum}, got {value!r}")
    return value


def schedule(wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0) -> Schedule:
    """A step -> ProfilerAction function, as ``torch.profiler.schedule``.

    After ``skip_first`` steps, cycles of ``wait`` steps recording nothing,
    ``warmup`` steps recording into a profile that is then discarded, and
    ``active`` steps recorded and saved; ``repeat`` cycles (0: forever).

    Raises:
        ConfigError: a negative count or ``active`` < 1.

    Example:
        >>> s = schedule(wait=1, warmup=1, active=2)
        >>> [s(i).name for i in range(4)]
        ['NONE', 'WARMUP', 'RECORD', 'RECORD_AND_SAVE']
    """
    wait, warmup = _count("wait", wait, 0), _count("warmup", warmup, 0)
    active, repeat = _count("active", active, 1), _count("repeat", repeat, 0)
    skip_first = _count("skip_first", skip_first, 0)
    cycle = wait + warmup + active

    def action(step: int) -> ProfilerAction:
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if repeat and step >= repeat * cycle:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < wait:
            return ProfilerAction.NONE
        if pos < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if pos < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    return action


def _always_record(step: int) -> ProfilerAction:
    return ProfilerAction.RECORD


_RECORDING = (ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
_ACTIVE = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


class profile:  # noqa: N801 - torch.profiler's name, so ported code reads the same
    """Profile a loop step by step, as ``torch.profiler.profile``.

    Args:
        schedule: a step -> ProfilerAction function (see ``schedule``); None
            records every step as one cycle, saved by ``stop()``.
        on_trace_ready: called with this profile after each saved cycle.
        filename: the trace file.  With a schedule, each cycle writes its
            own: ``{cycle}`` in the name is replaced by the cycle number, or
            ``-cycle<N>`` is put before the extension.

    Example:
        >>> import mxprof
        >>> with mxprof.profile(schedule=mxprof.schedule(wait=1, warmup=1, active=2),
        ...                     filename="train.json") as prof:
        ...     for batch in range(8):
        ...         pass  # train on the batch
        ...         prof.step()
        >>> print(prof.key_averages().table(sort_by="self"))  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        schedule: Schedule | None = None,
        on_trace_ready: Callable[[profile], Any] | None = None,
        filename: str | os.PathLike[str] = "profile.json",
    ) -> None:
        if schedule is not None and not callable(schedule):
            raise TypeError(f"schedule must be callable, got {schedule!r}")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"on_trace_ready must be callable, got {on_trace_ready!r}")
        self.filename = os.fspath(filename)
        if not self.filename:
            raise ConfigError("profile: filename must not be empty")
        self._schedule = schedule or _always_record
        self._cycled = schedule is not None
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self.trace_files: list[str] = []  # one per saved cycle, in order
        self._action = ProfilerAction.NONE
        self._step_range: Task | None = None
        self._saved: KeyAverages | None = None
        self._previous: dict[str, Any] | None = None
        self._running = False

    # ---- lifecycle ----

    def start(self) -> None:
        """Begin at step 0 (``with profile(...)`` calls it)."""
        if self._running:
            raise StateError("profile.start(): this profile is already running")
        with SESSION.lock:
            cfg = SESSION.config
            self._previous = {"filename": cfg.filename, "aggregate_stats": cfg.aggregate_stats}
        set_config(aggregate_stats=True)
        self._running = True
        self.step_num = 0
        self._action = ProfilerAction.NONE
        self._enter(self._schedule(0))

    def step(self) -> None:
        """Mark the end of a step; the next step's action takes effect."""
        if not self._running:
            raise StateError("profile.step(): the profile is not running (call start())")
        self._close_step()
        if self._action == ProfilerAction.RECORD_AND_SAVE:
            self._save()
        self.step_num += 1
        self._enter(self._schedule(self.step_num))

    def stop(self) -> None:
        """End profiling; an active cycle in progress is saved."""
        if not self._running:
            return
        self._close_step()
        if self._action in _ACTIVE:
            self._save()
        elif self._action == ProfilerAction.WARMUP:
            self._discard()
        self._running = False
        self._action = ProfilerAction.NONE
        if self._previous is not None:
            set_config(**self._previous)
            self._previous = None

    def __enter__(self) -> profile:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- results ----

    def key_averages(self) -> KeyAverages:
        """Per-name statistics of the current (or last saved) active cycle.

        Rows: name, category, count, total, self, avg, min, max, p50, p90,
        p99 (ns), with ``.table(sort_by=..., row_limit=...)``.
        """
        if self._running and self._action in _ACTIVE:
            return current_averages()
        return self._saved if self._saved is not None else KeyAverages()

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> None:
        """Copy the last saved cycle's trace to path.

        Raises:
            StateError: no cycle has been saved yet.
        """
        if not self.trace_files:
            raise StateError("export_chrome_trace(): no trace has been saved yet")
        shutil.copyfile(self.trace_files[-1], os.fspath(path))

    # ---- internals ----

    def _cycle_file(self) -> str:
        if not self._cycled:
            return self.filename
        n = len(self.trace_files)
        if "{cycle}" in self.filename:
            return self.filename.replace("{cycle}", str(n))
        return with_infix(self.filename, f"-cycle{n}")

    def _enter(self, action: ProfilerAction) -> None:
        if not isinstance(action, ProfilerAction):
            raise TypeError(f"schedule({self.step_num}) returned {action!r}, not a ProfilerAction")
        prev, self._action = self._action, action
        if action in _RECORDING and prev not in _RECORDING:
            set_config(filename=self._cycle_file())
            set_state("run")
        if action in _ACTIVE and prev not in _ACTIVE:
            # Warmup's events are discarded: the cycle's profile starts now.
            if prev == ProfilerAction.WARMUP:
                SESSION.restart_profile()
            stats.reset()
        if action == ProfilerAction.NONE and prev in _RECORDING:
            set_state("stop")
        if action in _RECORDING:
            # A task of its own, not record_function's cache: a name per step
            # would make that cache grow for as long as the run lasts.
            self._step_range = Task(DOMAIN, f"ProfilerStep#{self.step_num}")
            self._step_range.start()

    def _close_step(self) -> None:
        if self._step_range is not None:
            self._step_range.stop()
            self._step_range = None

    def _discard(self) -> None:
        """End an unfinished warmup: its events go nowhere."""
        set_state("stop")
        path = SESSION.discard_profile()
        # A background write may have created the file with warmup events only.
        if os.path.exists(path):
            os.remove(path)

    def _save(self) -> None:
        self._saved = current_averages()
        set_state("stop")
        dump(finished=True)
        self.trace_files.append(SESSION.config.filename)
        self._action = ProfilerAction.NONE
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)


def current_averages() -> KeyAverages:
    """The session's range statistics as rows (ns)."""
    rows = KeyAverages()
    for s in _native.stats_snapshot():
        if s.kind not in (_native.KIND_TASK, _native.KIND_FRAME, _native.KIND_EVENT):
            continue
        info = _native.object_info(s.id)
        cat = category(
            info.domain, frame=s.kind == _native.KIND_FRAME, event=s.kind == _native.KIND_EVENT
        )
        rows.append(
            Row(info.name, cat, s.count, s.total, s.self, s.min, s.max, s.p50, s.p90, s.p99)
        )
    return rows
