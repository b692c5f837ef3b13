"""The stack sampler: Python stacks of every thread, ``sample_rate`` times a second.

Two ways to take the samples, one at a time, with the same result in the
trace, in ``dumps()`` and in what reads them:

- **native** (the default): a thread of the core (native/src/mxp_sampler.c)
  reads this interpreter's thread states and frames from memory, without the
  GIL, at instants of its own: a thread running C code that holds the GIL is
  seen inside that code's Python caller, a burst shorter than the switch
  interval is seen, and the sampler costs the program no GIL handoffs.  It
  needs the interpreter's layout (``mxprof._pylayout``), checked against
  Python's own view of this thread's stack before the first start.
- **python** (the fallback): a Python thread that reads
  ``sys._current_frames()``.  It needs the GIL, which the running thread
  hands over only when it blocks or at the end of a switch interval, so its
  samples lean towards waits and miss short bursts; it lowers the switch
  interval while it runs to get its samples at all.  It is used where the
  native sampler cannot read the interpreter (a CPython without a layout
  row, a debug or free-threaded build, a sandbox that refuses the copies),
  after a warning that says why, or when ``MXPROF_SAMPLER=python`` asks.

What a sample is, either way:

- at each instant, every thread running Python (mxprof's own threads
  excepted, see :func:`own_thread`) is sampled: its stack, innermost frame
  last, attributed to the innermost range open on it (or on the asyncio
  task's track it runs) at that instant;
- ``sample_mode="wall"``: a thread the OS has blocked at the instant
  (sleeping, waiting for a lock, I/O or the GIL) gets a last frame
  ``<waiting>`` under the function that waits (a thread ready to run but not
  given a CPU is running, as in py-spy); ``"cpu"``: only threads on a CPU
  are sampled, so shares are of CPU time (the native sampler tells one ready
  to run but not given a CPU by its CPU clock standing still since its last
  look; the fallback counts it);
- frames of a launcher (``mxprof run``'s ``runpy``, see :func:`cut`) and
  everything above them are left off, so stacks begin at the program;
- the instants are a random walk: the gap to the next one is uniform in
  [0.5, 1.5) periods, so periodic work does not alias with the sampler.

Frames and stacks are interned in the core (ids by content); the counts per
(range, stack) that ``dumps()`` shows are kept there too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import sys
import threading
import time
import warnings
from collections import Counter
from types import CodeType, FrameType
from typing import Any

from . import _native, _tasks, _threads
from ._native import FLAG_RECORD

__all__ = [
    "MAX_RATE",
    "WAITING",
    "apply",
    "cut",
    "describe",
    "is_own",
    "kind",
    "own_thread",
    "rate",
    "reset",
    "snapshot",
]

MAX_RATE = 20_000  # Hz: beyond it a sample's own cost approaches its period
WAITING = "<waiting>"

_flags = _native.flags_update


class _Table(dict):  # type: ignore[type-arg]
    """Ids to what the core interned under them, read from it on first use."""

    def __init__(self, read: Any) -> None:
        super().__init__()
        self._read = read

    def __missing__(self, key: int) -> Any:
        value = self[key] = self._read(key)
        return value


class _Tables:
    """Frames and stack nodes: ``frames[id]`` = (function, file, line),
    ``nodes[id]`` = (parent, frame); interning for the Python sampler."""

    def __init__(self) -> None:
        self.frames: dict[int, tuple[str, str, int]] = _Table(_native.sample_frame_info)
        self.nodes: dict[int, tuple[int, int]] = _Table(_native.sample_stack_info)
        self.codes: dict[CodeType, int] = {}
        self.stacks: dict[tuple[int, int], int] = {}

    def frame_of(self, name: str, file: str, line: int) -> int:
        return _native.sample_frame(name, file, line)

    def code_frame(self, code: CodeType) -> int:
        fid = self.codes.get(code)
        if fid is None:
            # co_qualname (3.11+) says which class a method is of.
            name = getattr(code, "co_qualname", code.co_name)
            fid = self.codes[code] = self.frame_of(name, code.co_filename, code.co_firstlineno)
        return fid

    def node(self, parent: int, frame: int) -> int:
        sid = self.stacks.get((parent, frame))
        if sid is None:
            sid = self.stacks[(parent, frame)] = _native.sample_stack(parent, frame)
        return sid


TABLES = _Tables()


def snapshot(reset: bool = False) -> tuple[Counter[tuple[int, int]], _Tables]:
    """The counts per (range id or NO_RANGE, stack id) since the statistics
    began, and the tables to read them."""
    counts: Counter[tuple[int, int]] = Counter()
    for rid, sid, n in _native.sample_counts(reset):
        counts[(rid, sid)] += n
    return counts, TABLES


def reset() -> None:
    """Start the counts afresh (with the core's statistics)."""
    _native.sample_counts(reset=True)


# ---- what is not the program's ----

_own: set[int] = set()  # native ids of mxprof's own threads
_cuts: set[CodeType] = set()


def own_thread(thread: threading.Thread) -> threading.Thread:
    """Make thread (not started yet) one of mxprof's own: never sampled.

    It marks itself first thing when it starts (before its target runs:
    only threading's ``_bootstrap`` precedes it), and lets its OS id go when
    it ends, so that a thread given the same id later is sampled as usual.
    Returns thread.

    Example:
        >>> t = own_thread(threading.Thread(target=print, name="mxprof-x"))
    """
    inner = thread._bootstrap_inner  # type: ignore[attr-defined]

    def _bootstrap_inner() -> None:
        me = threading.get_native_id()
        _own.add(me)
        _native.sampler_skip(me, True)
        try:
            inner()
        finally:
            _own.discard(me)
            _native.sampler_skip(me, False)

    thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]
    return thread


def is_own(native_id: int | None) -> bool:
    """Whether the thread of OS id native_id is one of mxprof's own
    (:func:`own_thread`): ``mxprof ctl where`` leaves them out too."""
    return native_id in _own


def cut(code: CodeType) -> None:
    """Frames of code, and every frame that called them, are a launcher's:
    stacks are cut above them (``mxprof run`` cuts at runpy's)."""
    _cuts.add(code)
    _native.sampler_cut(code)


# ---- the Python sampler (the fallback) ----


class _Thread:
    """What the Python sampler knows about one thread: its /proc stat file."""

    __slots__ = ("native", "name", "named", "stat")

    def __init__(self, thread: threading.Thread) -> None:
        self.native = thread.native_id or 0
        self.name = thread.name
        self.named = 0  # the trace tid its name was given to
        self.stat = -2  # fd of /proc/self/task/TID/stat; -2 not opened yet, -1 none

    def blocked(self) -> bool:
        """Whether the OS has the thread blocked now (not running nor ready to
        run); False where that cannot be read."""
        if self.stat == -2:
            try:
                self.stat = os.open(f"/proc/self/task/{self.native}/stat", os.O_RDONLY)
            except OSError:
                self.stat = -1
        if self.stat < 0:
            return False
        try:
            text = os.pread(self.stat, 512, 0)
        except OSError:
            return False
        # "pid (comm) state ...": the name may hold spaces and parentheses.
        end = text.rfind(b")")
        return text[end + 2 : end + 3] not in (b"R", b"")

    def close(self) -> None:
        """Let go of the /proc file (the thread ended, or sampling stopped)."""
        fd, self.stat = self.stat, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class _PythonSampler:
    """The sampling thread of the fallback."""

    kind = "python"

    def __init__(self, rate: float, mode: str) -> None:
        self.rate = rate
        self.mode = mode
        self.interval = 1.0 / rate
        self.stopping = threading.Event()
        self.threads: dict[int, _Thread] = {}
        self.slots = _native.SampleSlots()
        self.waiting = TABLES.frame_of(WAITING, "", 0)
        self.thread = own_thread(
            threading.Thread(target=self._run, name="mxprof-sampler", daemon=True)
        )
        self.saved_switch: float | None = None
        self.random = random.Random()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def start(self) -> None:
        # The running thread hands the GIL over only after a switch interval
        # (5 ms by default): lowered to a quarter period, never raised.
        want = self.interval / 4
        current = sys.getswitchinterval()
        if want < current:
            self.saved_switch = current
            sys.setswitchinterval(want)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=5.0)
        if not self.thread.is_alive():
            for info in self.threads.values():
                info.close()
        if self.saved_switch is not None:
            sys.setswitchinterval(self.saved_switch)
            self.saved_switch = None

    def _run(self) -> None:
        wait = self.stopping.wait
        clock = time.perf_counter
        due = clock()
        while not self.stopping.is_set():
            due += self.interval * (0.5 + self.random.random())
            delay = due - clock()
            if delay > 0:
                wait(delay)
            else:
                due = clock()  # fell behind: skip the samples missed, do not burst
            try:
                self.tick()
            except Exception:  # never let a sampling error end the program's thread
                continue

    def _known(self, ident: int) -> _Thread | None:
        info = self.threads.get(ident)
        if info is None:
            for t in threading.enumerate():
                if t.ident is not None and t.ident not in self.threads:
                    self.threads[t.ident] = _Thread(t)
            info = self.threads.get(ident)
        return info

    def _tasks(self) -> dict[int, int]:
        """Per thread ident running an asyncio task with a track: the track."""
        current = getattr(sys.modules.get("asyncio.tasks"), "_current_tasks", None)
        out: dict[int, int] = {}
        for loop, task in list(current.items()) if current else ():
            ident = getattr(loop, "_thread_id", None)
            if ident is not None and task is not None:
                out[ident] = _tasks.track_of(loop, False)
        return out

    def tick(self) -> None:
        if not _flags(0, 0) & FLAG_RECORD:
            return
        frames = sys._current_frames()
        tasks = self._tasks()
        slots = self.slots
        add = _native.sample_add
        for ident, frame in frames.items():
            info = self._known(ident)
            if info is None or info.native in _own:
                continue  # unknown to threading (no OS id to file it under), or mxprof's
            blocked = info.blocked()
            if blocked and self.mode == "cpu":
                continue
            stack = self._stack(frame)
            if not stack:
                continue
            if blocked:
                stack = TABLES.node(stack, self.waiting)
            rc = add(info.native, tasks.get(ident, 0), stack, slots.range, slots.tid)
            if rc < 0:
                return  # not recording any more
            tid = slots.tid[0]
            if tid and info.named != tid:
                info.named = tid
                name = info.name.encode("utf-8", "replace")
                _native.thread_name_set(tid, name, len(name))
        if len(self.threads) > 4 * len(frames) + 16:
            live = set(frames)
            for k, v in self.threads.items():
                if k not in live:
                    v.close()
            self.threads = {k: v for k, v in self.threads.items() if k in live}

    def _stack(self, frame: FrameType | None) -> int:
        return stack_of(frame)


def stack_of(frame: FrameType | None) -> int:
    """The interned stack node of frame and its callers, cut at a launcher's
    (0: none left).  The Python sampler's and the hang watchdog's
    (``mxprof._triggers``) way to a sample's stack."""
    chain: list[CodeType] = []
    while frame is not None and frame.f_code not in _cuts:
        chain.append(frame.f_code)
        frame = frame.f_back
    sid = 0
    code_frame, node = TABLES.code_frame, TABLES.node
    for code in reversed(chain):
        sid = node(sid, code_frame(code))
    return sid


# ---- the native sampler ----


class _NativeSampler:
    """The core's sampling thread."""

    kind = "native"

    def __init__(self, rate: float, mode: str) -> None:
        self.rate = rate
        self.mode = mode

    def alive(self) -> bool:
        return _native.sampler_stats().running

    def start(self) -> None:
        mode = _native.SAMPLE_CPU if self.mode == "cpu" else _native.SAMPLE_WALL
        _native.sampler_start(self.rate, mode, random.getrandbits(64))

    def stop(self) -> None:
        _native.sampler_stop()


_checked: str | None | bool = False  # False: not yet; None: the native sampler works; str: why not


def _native_refusal() -> str | None:
    """Why the native sampler cannot run here (None: it can); checked once."""
    global _checked
    if _checked is False:
        from . import _pylayout  # ctypes, and the check itself: only where sampling starts

        if os.environ.get("MXPROF_SAMPLER", "") == "python":
            _checked = "MXPROF_SAMPLER=python asks for the Python sampler"
        else:
            try:
                _pylayout.check(_pylayout.layout(), _cuts)
                _checked = None
            except _pylayout.Unsupported as e:
                _checked = str(e)
            except Exception as e:  # noqa: BLE001 - any failure of the check means: fall back
                _checked = f"the layout check failed: {e!r}"
    return _checked if isinstance(_checked, str) else None


_warned = False


def _fallback_warning(reason: str) -> None:
    global _warned
    if _warned or reason.startswith("MXPROF_SAMPLER="):
        return
    _warned = True
    version = ".".join(map(str, sys.version_info[:3]))
    warnings.warn(
        f"mxprof samples from a Python thread on this interpreter (CPython {version}): "
        f"{reason}. Such samples need the GIL, so they lean towards waits and miss "
        "bursts shorter than the switch interval; see the README's sampling section.",
        RuntimeWarning,
        stacklevel=3,
    )


_current: _NativeSampler | _PythonSampler | None = None
_lock = threading.Lock()
_exit_hooked = False


def describe() -> dict[str, str]:
    """Which sampler sampling starts (``{"kind": "native"}``), or why the
    fallback (``{"kind": "python", "why": ...}``): for the trace's otherData."""
    reason = _native_refusal()
    return {"kind": "native"} if reason is None else {"kind": "python", "why": reason}


def rate() -> float:
    """The rate the sampler runs at now (0: not running)."""
    return _current.rate if _current is not None else 0.0


def kind() -> str:
    """Which sampler runs now: 'native', 'python', or '' (none)."""
    return _current.kind if _current is not None else ""


def apply(hz: float, mode: str = "wall") -> None:
    """Run the sampler at hz in mode (0: stop it).  Called by the session
    whenever the configuration reaches the core."""
    global _current, _exit_hooked
    with _lock:
        running = _current
        if running is not None and (running.rate, running.mode) == (hz, mode) and running.alive():
            return
        if _current is not None:
            _current.stop()
            _current = None
        if hz > 0 and not sys.is_finalizing():
            if not _exit_hooked:
                atexit.register(_stop_at_exit)  # after the session's: runs before it
                _exit_hooked = True
            _threads.watch_starts()
            reason = _native_refusal()
            if reason is not None:
                _fallback_warning(reason)
            sampler = _PythonSampler(hz, mode) if reason else _NativeSampler(hz, mode)
            sampler.start()
            _current = sampler


def _stop_at_exit() -> None:
    """Before the session's exit dump (atexit runs the later-registered first)."""
    apply(0)


def _after_fork_in_child() -> None:
    """The parent's sampling thread does not exist here; locks may be held.
    (The core forgot its own sampler thread and the skipped threads.)"""
    global _current, _lock
    _lock = threading.Lock()
    _own.clear()
    old, _current = _current, None
    if isinstance(old, _PythonSampler):
        for info in old.threads.values():
            info.close()  # the parent's threads' /proc files
        if old.saved_switch is not None:
            sys.setswitchinterval(old.saved_switch)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
