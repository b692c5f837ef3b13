"""The stack sampler: Python stacks of every thread, ``sample_rate`` times a second.

Mechanism: one daemon thread ("mxprof-sampler") wakes at a fixed rate, reads
every thread's current frame with ``sys._current_frames()`` and hands each
stack to the core (``mxp_sample_add``), which attributes it to the innermost
range open on that thread (or on the asyncio task's track) and records it in
the same buffers as every other event.  Reading Python frames touches Python
objects, so it lives here, never in the core (the core does not call back).

Why a thread: its cost is per sample, not per call.  A profile hook in C
(``setstatprofile``, pyinstrument's way) pays on every call and return,
which on a recursive workload of ~10 M calls/s costs far more than the
samples; a timer signal runs its handler only on the main thread.  The
thread's cost is the GIL handoff: to take a sample it must get the GIL from
the running thread, which CPython hands over only after
``sys.getswitchinterval()`` (5 ms by default) -- a 1 kHz sampler would get
about 200 samples a second.  While sampling, the switch interval is
therefore lowered to a quarter of the sampling period (never raised), and
put back when sampling stops; the benchmark (benchmarks/sampling.py) shows
what it costs.

Interning: a frame is a function (code object: name, file, first line), a
stack is a chain of (caller's stack id, frame id); both get core ids once,
so a sample costs a few integers.  Threads are told apart from waiting:
a thread whose CPU time did not advance since its previous sample and that
the OS has asleep (not runnable: sleep, I/O, a lock, the GIL) is waiting,
and its sample gets a last frame ``<waiting>`` under the Python function
that waits, so the caller is not shown as running.  A thread that is
runnable but got no CPU (the machine is busy: other processes had the CPUs
since the sampler handed the GIL back) is running its function, not
waiting in it; its state is read from ``/proc/self/task/TID/stat`` (Linux)
only when its CPU time stood still.  Elsewhere CPU time alone decides.
An asyncio task's name rides as the root frame ``<task NAME>``.

Statistics (``dumps()``'s ``Samples`` section) are counted here per
(range, stack) while ``aggregate_stats`` is on; they restart with the
core's statistics.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
import threading
import time
from collections import Counter
from types import CodeType, FrameType

from . import _native, _tasks, _threads
from ._native import FLAG_AGGREGATE, FLAG_RECORD

__all__ = ["MAX_RATE", "WAITING", "apply", "rate", "snapshot", "reset"]

MAX_RATE = 20_000  # Hz: beyond it the GIL handoffs alone would swamp the program
WAITING = "<waiting>"

_flags = _native.flags_update


class _Tables:
    """Frames and stacks interned so far (ids from the core), and names back."""

    def __init__(self) -> None:
        self.codes: dict[CodeType, int] = {}
        self.named: dict[tuple[str, str, int], int] = {}
        self.stacks: dict[tuple[int, int], int] = {}
        self.frames: dict[int, tuple[str, str, int]] = {}  # id -> (function, file, line)
        self.nodes: dict[int, tuple[int, int]] = {}  # id -> (parent, frame)

    def frame_of(self, name: str, file: str, line: int) -> int:
        key = (name, file, line)
        fid = self.named.get(key)
        if fid is None:
            fid = _native.sample_frame(name, file, line)
            self.named[key] = fid
            self.frames[fid] = key
        return fid

    def code_frame(self, code: CodeType) -> int:
        fid = self.codes.get(code)
        if fid is None:
            # co_qualname (3.11+) says which class a method is of.
            name = getattr(code, "co_qualname", code.co_name)
            fid = self.frame_of(name, code.co_filename, code.co_firstlineno)
            self.codes[code] = fid
        return fid

    def node(self, parent: int, frame: int) -> int:
        sid = self.stacks.get((parent, frame))
        if sid is None:
            sid = _native.sample_stack(parent, frame)
            self.stacks[(parent, frame)] = sid
            self.nodes[sid] = (parent, frame)
        return sid


TABLES = _Tables()


class _Stats:
    """Sample counts per (range id, stack id) since the statistics began."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[tuple[int, int]] = Counter()
        self.recorded_ns = 0  # the core's, at the last sample: a drop = a restart
        self.aggregate = True  # statistics were on at the last sample

    def fresh(self, recorded_ns: int, aggregate: bool = True) -> None:
        """Forget counts that belong to statistics the core has restarted: the
        time they cover went back (a reset; the reading jitters by a few ns,
        hence the margin), or statistics were off since the last sample."""
        if recorded_ns + 1_000_000 < self.recorded_ns or not self.aggregate:
            self.counts.clear()
            self.recorded_ns = recorded_ns
        self.recorded_ns = max(recorded_ns, self.recorded_ns)
        self.aggregate = aggregate


STATS = _Stats()


def snapshot(reset: bool = False) -> tuple[Counter[tuple[int, int]], _Tables]:
    """The counts per (range id or NO_RANGE, stack id), and the tables to read them."""
    with STATS.lock:
        STATS.fresh(_native.stats_recorded_ns())
        counts = Counter(STATS.counts)
        if reset:
            STATS.counts.clear()
            STATS.recorded_ns = 0
    return counts, TABLES


def reset() -> None:
    """Start the counts afresh (with the core's statistics)."""
    with STATS.lock:
        STATS.counts.clear()
        STATS.recorded_ns = 0


class _Thread:
    """What the sampler knows about one Python thread."""

    __slots__ = ("native", "clock", "cpu", "named", "name", "own", "stat")

    def __init__(self, thread: threading.Thread) -> None:
        self.native = thread.native_id or 0
        self.name = thread.name
        self.own = thread.name.startswith("mxprof-")  # the profiler's threads are not sampled
        try:
            self.clock: int | None = time.pthread_getcpuclockid(thread.ident or 0)
        except (OSError, AttributeError):
            self.clock = None
        self.cpu = -1
        self.named = 0  # the trace tid its name was given to
        self.stat = -2  # fd of /proc/self/task/TID/stat; -2 not opened yet, -1 none

    def waiting(self) -> bool:
        """Whether the thread used no CPU since its previous sample and is
        not runnable (a runnable thread without CPU was pushed off it by
        other work; it waits for nothing of its own)."""
        if self.clock is None:
            return False
        try:
            cpu = time.clock_gettime_ns(self.clock)
        except OSError:
            return False
        last, self.cpu = self.cpu, cpu
        return last >= 0 and cpu == last and not self.runnable()

    def runnable(self) -> bool:
        """Whether the OS has the thread running or ready to run (state R);
        False where that cannot be read."""
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
        return text[text.rfind(b")") + 2 : text.rfind(b")") + 3] == b"R"

    def close(self) -> None:
        """Let go of the /proc file (the thread ended, or sampling stopped)."""
        fd, self.stat = self.stat, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class Sampler:
    """The sampling thread; one at a time (``apply`` starts and stops it)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.interval = 1.0 / rate
        self.stopping = threading.Event()
        self.threads: dict[int, _Thread] = {}
        self.slots = _native.SampleSlots()
        self.waiting = TABLES.frame_of(WAITING, "", 0)
        self.thread = threading.Thread(target=self._run, name="mxprof-sampler", daemon=True)
        self.saved_switch: float | None = None

    def start(self) -> None:
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
            due += self.interval
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

    def _tasks(self) -> dict[int, tuple[str, int]]:
        """Per thread ident running an asyncio task: the task's name and track."""
        current = getattr(asyncio.tasks, "_current_tasks", None)
        out: dict[int, tuple[str, int]] = {}
        if not current:
            return out
        for loop, task in list(current.items()):
            ident = getattr(loop, "_thread_id", None)
            if ident is not None and task is not None:
                out[ident] = (task.get_name(), _tasks.track_of(loop, False))
        return out

    def tick(self) -> None:
        flags = _flags(0, 0)
        if not flags & FLAG_RECORD:
            return
        frames = sys._current_frames()
        tasks = self._tasks()
        own = threading.get_ident()
        aggregate = flags & FLAG_AGGREGATE
        slots = self.slots
        add = _native.sample_add
        recorded: list[tuple[int, int]] = []
        for ident, frame in frames.items():
            if ident == own:
                continue
            info = self._known(ident)
            if info is None or info.own:
                continue  # unknown to threading (no OS id to file it under), or mxprof's
            task = tasks.get(ident)
            stack = self._stack(frame, task[0] if task else None)
            if info.waiting():
                stack = TABLES.node(stack, self.waiting)
            rc = add(info.native, task[1] if task else 0, stack, slots.range, slots.tid)
            if rc < 0:
                return  # not recording any more
            if rc == _native.NEW_THREAD:
                _threads.register_current()  # the sampler's own trace tid gets its name
            tid = slots.tid[0]
            if tid and info.named != tid:
                info.named = tid
                name = info.name.encode("utf-8", "replace")
                _native.thread_name_set(tid, name, len(name))
            if aggregate:
                recorded.append((slots.range[0], stack))
        if len(self.threads) > 4 * len(frames) + 16:
            live = set(frames)
            for k, v in self.threads.items():
                if k not in live:
                    v.close()
            self.threads = {k: v for k, v in self.threads.items() if k in live}
        with STATS.lock:
            STATS.fresh(_native.stats_recorded_ns(), bool(aggregate))
            STATS.counts.update(recorded)

    def _stack(self, frame: FrameType | None, task: str | None) -> int:
        chain: list[CodeType] = []
        while frame is not None:
            chain.append(frame.f_code)
            frame = frame.f_back
        sid = 0
        if task is not None:
            sid = TABLES.node(0, TABLES.frame_of(f"<task {task}>", "<asyncio>", 0))
        code_frame, node = TABLES.code_frame, TABLES.node
        for code in reversed(chain):
            sid = node(sid, code_frame(code))
        return sid


_current: Sampler | None = None
_lock = threading.Lock()
_exit_hooked = False


def rate() -> float:
    """The rate the sampler runs at now (0: not running)."""
    return _current.rate if _current is not None else 0.0


def apply(hz: float) -> None:
    """Run the sampler at hz (0: stop it).  Called by the session whenever
    the configuration reaches the core."""
    global _current
    with _lock:
        if _current is not None and (_current.rate == hz and _current.thread.is_alive()):
            return
        if _current is not None:
            _current.stop()
            _current = None
        if hz > 0 and not sys.is_finalizing():
            global _exit_hooked
            if not _exit_hooked:
                atexit.register(_stop_at_exit)  # after the session's: runs before it
                _exit_hooked = True
            _current = Sampler(hz)
            _current.start()


def _stop_at_exit() -> None:
    """Before the session's exit dump (atexit runs the later-registered first)."""
    apply(0)


def _after_fork_in_child() -> None:
    """The parent's sampling thread does not exist here; locks may be held."""
    global _current, _lock
    _lock = threading.Lock()
    STATS.lock = threading.Lock()
    STATS.counts.clear()  # the core's statistics restart in a child too
    STATS.recorded_ns = 0
    old, _current = _current, None
    if old is not None:
        for info in old.threads.values():
            info.close()  # the parent's threads' /proc files
        if old.saved_switch is not None:
            sys.setswitchinterval(old.saved_switch)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
