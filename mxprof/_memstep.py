"""memory_steps: this process's memory per step, and the leak rule live.

With ``memory_steps`` on, while the profile records:

- at every step end (a Frame's end, told by ``_triggers.STEPS``, the one
  observer of steps): the resident size from ``/proc/self/statm`` (about
  2 us) and, where the program has initialised CUDA through torch, each
  device's ``torch.cuda.memory_allocated``/``memory_reserved``;
- every ``memory_period`` seconds, on the ``mxprof-triggers`` thread (off
  the program's threads): ``/proc/self/smaps_rollup``'s Rss, Pss, USS
  (Private_Clean + Private_Dirty) and shared (Shared_Clean + Shared_Dirty).
  Reading it walks the process's page tables: 70 us in a bare interpreter,
  2.6 ms with torch loaded on the machine of benchmarks/memstep.py, which is
  why step ends read only statm.

Each value is a counter of domain ``Process Memory`` (``trace.leak``), so
it is a counter track in the trace and a row of ``dumps()``'s Memory
section.  The bytes in use per scope (``mxprof.memory``) are kept by the core
already (``Scope Storage``); the sampler only notes them per step, to name
the scope that grew most.

The leak rule (``trace.leak.leak``, the function the report's hint runs
too) looks after each sample at the last ``leak_steps`` values of ``rss``
and of each ``cuda:N allocated`` at step ends; in a process where no step
ends (a DataLoader worker: ``follow_children`` runs this sampler in each
followed process) the period's samples are its steps and ``uss`` is
watched, so that shared pages turning private (copy-on-read) count.  A
leak is reported once per series until the rule is silent again: a marker
``leak ...`` in the trace, an entry of :func:`leaks`, a flight recorder
snapshot (``trigger_leak``, reason ``leak``) and, with ``leak_sites_steps``,
``tracemalloc`` for that many steps, whose growing sites become counters of
domain ``Allocation Sites`` (``file:line``, bytes per step).

No ``/proc`` (another OS): one warning says that process memory is not
sampled; the CUDA allocator still is.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import tracemalloc
import warnings
from typing import TYPE_CHECKING, Any

from . import _children, _native, flight
from ._render import format_bytes
from .domain import Domain
from .memory import usage, used
from .trace.leak import PROCESS_MEMORY, SITES, copy_on_read, leak

if TYPE_CHECKING:
    from ._session import Session
    from .counter import Counter

__all__ = ["SAMPLER", "leaks", "process_role"]

SITES_TOP = 10  # growing allocation sites recorded after a leak
SITES_MIN_BYTES = 1024  # per step: smaller growth is the interpreter's churn, not the leak
_PACKAGE = os.path.dirname(os.path.abspath(__file__))
# A fork child inherits this module loaded (another pid); a spawned one loads
# it while the parent's offer is still the one in its environment (the
# child's own export for its children replaces it later).
_LOADED_PID = os.getpid()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LOADED_AS_CHILD = _children.inherited() is not None


def process_role() -> str:
    """Which process this is, in the words a leak report uses: ``DataLoader
    worker K`` (torch's ``get_worker_info``), ``child NAME`` (a followed
    child: its multiprocessing name) or ``main``, with its pid.

    Example:
        >>> process_role().startswith("main (pid ")  # doctest: +SKIP
        True
    """
    pid = os.getpid()
    data = sys.modules.get("torch.utils.data")
    info = None
    with contextlib.suppress(Exception):
        info = data.get_worker_info() if data is not None else None
    if info is not None:
        return f"DataLoader worker {info.id} (pid {pid})"
    mp = sys.modules.get("multiprocessing")
    parent = None
    with contextlib.suppress(Exception):
        parent = mp.parent_process() if mp is not None else None
    if parent is not None or pid != _LOADED_PID or _LOADED_AS_CHILD:
        name = mp.current_process().name if mp is not None else "child"
        return f"child {name} (pid {pid})"
    return f"main (pid {pid})"


def _rollup(text: bytes) -> dict[str, int]:
    """rss, pss, uss, shared in bytes from smaps_rollup's text (kB lines)."""
    kb: dict[bytes, int] = {}
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(b":")
        parts = rest.split()
        if parts:
            kb[key] = int(parts[0])
    return {
        "rss": kb.get(b"Rss", 0) << 10,
        "pss": kb.get(b"Pss", 0) << 10,
        "uss": (kb.get(b"Private_Clean", 0) + kb.get(b"Private_Dirty", 0)) << 10,
        "shared": (kb.get(b"Shared_Clean", 0) + kb.get(b"Shared_Dirty", 0)) << 10,
    }


class _Sites:
    """tracemalloc over a few steps after a leak: the sites that grew."""

    def __init__(self, steps: int) -> None:
        self.started = not tracemalloc.is_tracing()  # stopped at the end only if ours
        if self.started:
            tracemalloc.start(1)
        self.steps = self.left = steps
        self.first = tracemalloc.take_snapshot()

    def step(self) -> list[tuple[str, float]] | None:
        """Count a step; after the last, the top growing sites (``file:line``,
        bytes per step), mxprof's own and tracemalloc's left out."""
        self.left -= 1
        if self.left > 0:
            return None
        last = tracemalloc.take_snapshot()
        self.stop()
        drop = [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, os.path.join(_PACKAGE, "*")),
        ]
        grown = last.filter_traces(drop).compare_to(self.first.filter_traces(drop), "lineno")
        out: list[tuple[str, float]] = []
        for stat in grown:
            if stat.size_diff > 0 and len(out) < SITES_TOP:
                frame = stat.traceback[0]
                out.append((f"{frame.filename}:{frame.lineno}", stat.size_diff / self.steps))
        return out

    def stop(self) -> None:
        if self.started and tracemalloc.is_tracing():
            tracemalloc.stop()
        self.started = False


class _Sampler:
    """The sampler's state; one per process (:data:`SAMPLER`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # step ends (any thread) and the period's thread
        self.session: Session | None = None
        self.on = False
        self.statm = -2  # fd; -2 not opened yet, -1 none
        self.rollup = -2
        self.warned = False
        self.found: list[dict[str, Any]] = []
        self.reset()

    def reset(self) -> None:
        """Forget the series (a new profile, or a forked child's own memory)."""
        self.window = 16
        self.min_rate = 256 << 10
        self.sites_steps = 0
        self.trigger = False
        self.stepped = False  # a step ended in this process
        self.series: dict[str, collections.deque[float]] = {}
        self.flagged: set[str] = set()  # series reported and not silent since
        self.scopes: collections.deque[dict[str, int]] = collections.deque(maxlen=16)
        self.rolled: collections.deque[dict[str, int]] = collections.deque(maxlen=16)
        self.counters: dict[str, Counter] = {}
        self.last_period = 0
        self.sites: _Sites | None = None

    def configure(self, session: Session, on: bool) -> None:
        """Apply the session's configuration (``_triggers.apply``)."""
        cfg = session.config
        with self.lock:
            if on and not self.on:
                self.reset()
                self.found = []
            self.session = session
            self.on = on
            if self.window != cfg.leak_steps:
                self.window = cfg.leak_steps
                self.series = {
                    k: collections.deque(v, cfg.leak_steps) for k, v in self.series.items()
                }
                self.scopes = collections.deque(self.scopes, cfg.leak_steps)
                self.rolled = collections.deque(self.rolled, cfg.leak_steps)
            self.min_rate = cfg.leak_min_bytes
            self.sites_steps = cfg.leak_sites_steps
            self.trigger = cfg.trigger_leak
            self.period_ns = int(cfg.memory_period * 1e9)
            if not on and self.sites is not None:
                self.sites.stop()
                self.sites = None

    def recording(self) -> bool:
        s = self.session
        return s is not None and s.state == "run" and not s.paused and s.profile_open

    # ---- reading ----

    def _open(self, path: str) -> int:
        try:
            return os.open(path, os.O_RDONLY)
        except OSError:
            return -1

    def _unavailable(self) -> None:
        if not self.warned:
            self.warned = True
            warnings.warn(
                "mxprof: memory_steps: /proc/self/statm and /proc/self/smaps_rollup are "
                "unavailable on this system: the process's rss/pss/uss are not sampled "
                "(the CUDA allocator still is)",
                RuntimeWarning,
                stacklevel=2,
            )

    def _rss(self) -> int | None:
        if self.statm == -2:
            self.statm = self._open("/proc/self/statm")
        if self.statm < 0:
            self._unavailable()
            return None
        return int(os.pread(self.statm, 128, 0).split()[1]) * _PAGE

    def _smaps(self) -> dict[str, int] | None:
        if self.rollup == -2:
            self.rollup = self._open("/proc/self/smaps_rollup")
        if self.rollup < 0:
            self._unavailable()
            return None
        return _rollup(os.pread(self.rollup, 4096, 0))

    def _set(self, name: str, value: int) -> None:
        counter = self.counters.get(name)
        if counter is None:
            counter = self.counters[name] = Domain(PROCESS_MEMORY).new_counter(name)
        counter.set_value(value)

    # ---- sampling ----

    def step_end(self) -> None:
        """A step ended (any thread): sample the cheap values, run the rule."""
        if not self.on or not self.recording():
            return
        with self.lock:
            self.stepped = True
            values: dict[str, int] = {}
            rss = self._rss()
            if rss is not None:
                values["rss"] = rss
            values.update(_cuda())
            for name, value in values.items():
                self._set(name, value)
            self._note(values)

    def tick(self) -> None:
        """From the period's thread: read smaps_rollup when the period is due."""
        if not self.on or not self.period_ns or not self.recording():
            return
        now = _native.clock_ns()
        if now - self.last_period < self.period_ns:
            return
        self.last_period = now
        rolled = self._smaps()  # outside the lock: the walk can take milliseconds
        with self.lock:
            if rolled is None:
                if not self.stepped:
                    cuda = _cuda()
                    for name, value in cuda.items():
                        self._set(name, value)
                    self._note(cuda)
                return
            for name, value in rolled.items():
                self._set(name, value)
            self.rolled.append(rolled)
            if not self.stepped:  # no steps here: the period's samples are its steps
                values: dict[str, int] = {"uss": rolled["uss"]}
                cuda = _cuda()
                for name, value in cuda.items():
                    self._set(name, value)
                values.update(cuda)
                self._note(values)

    def _note(self, values: dict[str, int]) -> None:
        """One step's values: keep them, run the rule, count tracemalloc's steps."""
        if self.sites is not None:  # counted before a new leak could start it
            with contextlib.suppress(Exception):
                self._sites_step(self.sites)
        # The scopes' bytes, to name the one that grew most: read only where
        # mxprof.memory has recorded (the core's table costs a call to copy).
        if used():
            self.scopes.append({u.name: u.current for u in usage() if u.kind == "scope"})
        for name, value in values.items():
            if name.endswith("reserved"):
                continue  # allocated is what a leak grows; reserved follows it
            kept = self.series.get(name)
            if kept is None:
                kept = self.series[name] = collections.deque(maxlen=self.window)
            kept.append(value)
            if len(kept) < self.window:
                continue
            growth = leak(list(kept), self.min_rate)
            if growth is None:
                self.flagged.discard(name)
            elif name not in self.flagged:
                self.flagged.add(name)
                self._report(name, growth.rate, growth.first, growth.last)

    def _sites_step(self, sites: _Sites) -> None:
        top = sites.step()
        if top is None:
            return
        self.sites = None
        kept = [(where, round(rate)) for where, rate in top if rate >= SITES_MIN_BYTES]
        self.found[-1]["sites"] = [list(site) for site in kept]
        for where, rate in kept:
            Domain(SITES).new_counter(where).set_value(rate)

    def _report(self, name: str, rate: float, first: float, last: float) -> None:
        details: dict[str, Any] = {
            "process": process_role(),
            "series": name,
            "rate_per_step": round(rate),
            "steps": self.window,
            "from_bytes": round(first),
            "to_bytes": round(last),
            "scope": None,
            "scope_growth": 0,
            "copy_on_read": None,
            "sites": None,
        }
        if len(self.scopes) >= 2:
            before, after = self.scopes[0], self.scopes[-1]
            grown = [(after[k] - before.get(k, 0), k) for k in after]
            grown = [g for g in grown if g[0] > 0]
            if grown:
                delta, details["scope"] = max(grown)
                details["scope_growth"] = delta
        if len(self.rolled) >= 2:
            cow = copy_on_read([r["shared"] for r in self.rolled], [r["uss"] for r in self.rolled])
            if cow is not None:
                lost, gained = cow
                details["copy_on_read"] = {
                    "shared_lost": round(lost),
                    "private_gained": round(gained),
                }
        self.found.append(details)
        where = f", most in scope {details['scope']}" if details["scope"] else ""
        cow_note = ", shared pages turning private" if details["copy_on_read"] else ""
        title = (
            f"leak: {name} +{format_bytes(rate)}/step over {self.window} steps in "
            f"{details['process']}{where}{cow_note}"
        )
        with contextlib.suppress(Exception):
            Domain(PROCESS_MEMORY).new_marker(title).mark("process")
        session = self.session
        if self.trigger and session is not None and session.ring and session.profile_open:
            with contextlib.suppress(Exception):
                flight.trigger("leak", details, wait=False)
        if self.sites_steps and self.sites is None:
            with contextlib.suppress(Exception):
                self.sites = _Sites(self.sites_steps)

    def after_fork_in_child(self) -> None:
        """The parent's files name the parent's /proc/self; its series are not ours."""
        self.lock = threading.Lock()  # the parent's may have been held by another thread
        self.forget()

    def forget(self) -> None:
        """Back to the state of a process that never sampled (also for tests)."""
        for fd in (self.statm, self.rollup):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.statm = self.rollup = -2
        if self.sites is not None:
            self.sites.stop()
        self.found = []
        self.on = False
        self.warned = False
        self.reset()


def _cuda() -> dict[str, int]:
    """``cuda:N allocated``/``reserved`` of each device, where the program
    initialised CUDA through torch (never initialising it: a forked worker
    must not)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    out: dict[str, int] = {}
    with contextlib.suppress(Exception):
        cuda = torch.cuda
        if not cuda.is_initialized():
            return {}
        for d in range(cuda.device_count()):
            out[f"cuda:{d} allocated"] = int(cuda.memory_allocated(d))
            out[f"cuda:{d} reserved"] = int(cuda.memory_reserved(d))
    return out


SAMPLER = _Sampler()


def leaks() -> list[dict[str, Any]]:
    """The leaks this process's sampler flagged since its profile began,
    oldest first: process, series, rate_per_step, steps, from_bytes,
    to_bytes, scope (the one that grew most) and scope_growth,
    copy_on_read (shared_lost, private_gained) and sites (``[file:line,
    bytes per step]``, once tracemalloc's steps are over).

    Example:
        >>> from mxprof import _memstep
        >>> _memstep.leaks()
        []
    """
    return [dict(d) for d in SAMPLER.found]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SAMPLER.after_fork_in_child)
