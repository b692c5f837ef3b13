"""Triggers: what makes a flight recorder take a snapshot by itself.

Each is a config key, and acts only while a flight recorder's profile is
open (``flight_recorder`` > 0); the session installs and removes them as
its state changes (:func:`apply`, from ``Session.sync``).  Each takes its
snapshot with ``flight.trigger(reason, details, wait=False)``: it only
queues it for the background writer, so that no trigger ever waits on the
thread it fires on (a signal handler, a dying thread, a training step).

- ``trigger_exception``: an uncaught exception in any thread.
  ``sys.excepthook`` and ``threading.excepthook`` are chained: the hook in
  place before still runs (the traceback and the exit status are as
  without mxprof).  A process dying of it writes the snapshot at exit.
- ``trigger_signal``: a signal (SIGUSR2 by default).  Left alone where the
  program has a handler of its own for it (one warning says so); installed
  from the main thread only, as Python allows.
- ``trigger_slow_step``: a step (a Frame) longer than k times the median
  of the last ``trigger_slow_step_steps`` steps of the same frame.  Frames
  tell this module of their begin and end (``ranges.set_steps``); no other
  range pays anything.
- ``trigger_memory`` / ``trigger_rss``: a scope's bytes in use
  (``mxprof.memory``), or the process's resident memory, above a
  threshold; once per crossing, armed again when it falls back below.
- ``watchdog``: no step ended for that many seconds while recording.  The
  snapshot's details hold every thread's Python stack and innermost open
  range, the same stacks are recorded as samples on each thread's track at
  the trigger (so Perfetto and the report show them where the thread is
  stuck), and one line on stderr names the stuck thread: the one whose
  innermost open range began first (the main thread when none has one).
  Once per hang: armed again when a step ends.

The memory triggers and the watchdog run on one thread of mxprof's own,
``mxprof-triggers``, which looks every :data:`POLL` seconds (the watchdog
sooner when its time is shorter).  It reads stacks with
``sys._current_frames()``, which works while the thread it reads waits in
C code that released the GIL (a lock, a sleep, a collective).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import os
import signal
import sys
import threading
import warnings
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from . import _memstep, _native, _sampler, _threads, flight, ranges
from ._render import is_own

if TYPE_CHECKING:
    from ._session import Session

# Bound once: a step's observer runs these on every Frame's begin and end.
_clock = _native.clock_ns
get_ident = threading.get_ident

POLL = 0.1  # s between two looks of the memory triggers and the watchdog
STACK_DEPTH = 100  # frames per thread in a hang's details, innermost first


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def _where(frame: FrameType | None) -> str:
    """``file:line function`` of frame."""
    if frame is None:
        return "?"
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} {getattr(code, 'co_qualname', code.co_name)}"


def _title(rid: int) -> str:
    """A range's name as the trace shows it, with its domain."""
    info = _native.object_info(rid)
    return f"{info.domain}:{info.name}" if info.domain else info.name


# ---- exceptions ----


class _Exceptions:
    """The chained excepthooks.  Once put in place, a hook stays in the
    chain while another was put in front of it (taking it out would cut that
    one's chain); while off it only hands over to the hook it replaced.
    The hooks are bound methods: compared with ==, never ``is``."""

    def __init__(self) -> None:
        self.on = False
        self.sys_previous: Any = None
        self.thread_previous: Any = None

    def set(self, on: bool) -> None:
        self.on = on
        if on:
            if sys.excepthook != self.sys_hook and self.sys_previous is None:
                self.sys_previous = sys.excepthook
                sys.excepthook = self.sys_hook
            if threading.excepthook != self.thread_hook and self.thread_previous is None:
                self.thread_previous = threading.excepthook
                threading.excepthook = self.thread_hook
            return
        if sys.excepthook == self.sys_hook:
            sys.excepthook = self.sys_previous
            self.sys_previous = None
        if threading.excepthook == self.thread_hook:
            threading.excepthook = self.thread_previous
            self.thread_previous = None

    def fire(self, kind: type[BaseException], value: BaseException | None, thread: str) -> None:
        if not self.on or issubclass(kind, SystemExit):
            return
        try:
            tb = value.__traceback__ if value is not None else None
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            details = {
                "type": f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins."),
                "message": str(value)[:2000] if value is not None else "",
                "thread": thread,
                "where": _where(tb.tb_frame) if tb is not None else "?",
            }
            flight.trigger("exception", details, wait=False)
        except Exception:  # noqa: BLE001 - the program's own hook must run, whatever happens here
            pass

    def sys_hook(
        self, kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        try:
            self.fire(kind, value, threading.current_thread().name)
        finally:
            (self.sys_previous or sys.__excepthook__)(kind, value, tb)

    def thread_hook(self, args: Any) -> None:
        try:
            thread = args.thread.name if args.thread is not None else "?"
            self.fire(args.exc_type, args.exc_value, thread)
        finally:
            (self.thread_previous or threading.__excepthook__)(args)


EXCEPTIONS = _Exceptions()


# ---- a signal ----


class _Signal:
    """The trigger signal's handler, put in place of the default action (or
    of an ignored signal) and given back when off."""

    def __init__(self) -> None:
        self.signum = 0  # installed on (0: none)
        self.previous: Any = signal.SIG_DFL
        self.warned: set[int] = set()  # signals found owned by the program
        self.warned_thread = False
        self.active = False

    def set(self, name: str) -> None:
        if not name:
            self.warned_thread = False  # once per profile
        sig = getattr(signal.Signals, name, None) if name else None
        want = int(sig) if sig is not None else 0  # (a name this platform lacks: none)
        self.active = bool(want) and want == self.signum
        if want == self.signum:
            return
        if threading.current_thread() is not threading.main_thread():
            # Python sets handlers from the main thread only; one left in
            # place acts as the disposition it replaced (self.active False).
            if want and not self.warned_thread:
                self.warned_thread = True
                _warn(
                    f"mxprof: trigger_signal {name} is not installed: the flight recorder "
                    "was configured outside the main thread (Python sets signal handlers "
                    "from the main thread only)"
                )
            return
        self.remove()
        if not want:
            return
        from . import _signals

        current = signal.getsignal(want)
        if current is _signals._handler:
            return  # flush_on_signal's: it takes a snapshot on this signal already
        if current not in (signal.SIG_DFL, signal.SIG_IGN):
            if want not in self.warned:
                self.warned.add(want)
                _warn(
                    f"mxprof: trigger_signal {name} is not installed: the program handles "
                    f"{name} already ({current!r}); call mxprof.trigger() from that handler "
                    "to take a snapshot"
                )
            return
        self.previous = current
        signal.signal(want, self.handler)
        self.signum = want
        self.active = True

    def remove(self) -> None:
        """Give the signal back its disposition (from the main thread)."""
        if self.signum and signal.getsignal(self.signum) == self.handler:
            signal.signal(self.signum, self.previous)
        self.signum = 0
        self.active = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes: it only queues.
        if self.active:
            with contextlib.suppress(Exception):
                flight.trigger("signal", {"signal": signal.Signals(signum).name}, wait=False)
        elif self.previous is signal.SIG_DFL:  # off, but not given back yet
            signal.signal(signum, signal.SIG_DFL)
            self.signum = 0
            os.kill(os.getpid(), signum)


SIGNAL = _Signal()


# ---- steps ----


class _Steps:
    """What the Frames tell (``ranges.set_steps``): each step's length, for
    the slow step trigger, and when the last one ended, for the watchdog."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.begun: dict[tuple[int, int], list[int]] = {}  # (thread, frame id) -> begins
        # Per frame id: its last lengths in order, and the same sorted.
        self.lengths: dict[int, tuple[collections.deque[int], list[int]]] = {}
        self.last_end_ns = _native.clock_ns()
        self.factor = 0.0
        self.steps = 20

    def begin(self, rid: int) -> None:
        if not self.factor:
            return  # the watchdog needs only the ends
        key = (get_ident(), rid)
        begun = self.begun.get(key)
        if begun is None:
            begun = self.begun[key] = []
        begun.append(_clock())

    def end(self, rid: int) -> None:
        now = self.last_end_ns = _clock()
        if _memstep.SAMPLER.on:  # memory_steps: a sample per step end
            with contextlib.suppress(Exception):
                _memstep.SAMPLER.step_end()
        if not self.factor:
            return
        begun = self.begun.get((get_ident(), rid))
        if not begun:
            return  # begun before the trigger was on, or on another thread
        length = now - begun.pop()
        kept = self.lengths.get(rid)
        if kept is None or len(kept[1]) > self.steps:
            kept = self.lengths[rid] = (collections.deque(), [])
        order, ordered = kept
        n = len(ordered)
        if n == self.steps:
            half = n // 2
            median = ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2
            if length > self.factor * median:
                self.slow(rid, length, median)
            del ordered[bisect.bisect_left(ordered, order.popleft())]
        order.append(length)
        bisect.insort(ordered, length)

    def slow(self, rid: int, length: int, median: float) -> None:
        with contextlib.suppress(Exception):
            details = {
                "step": _title(rid),
                "thread": threading.current_thread().name,
                "seconds": round(length / 1e9, 6),
                "median_seconds": round(median / 1e9, 6),
                "factor": self.factor,
                "steps": self.steps,
            }
            flight.trigger("slow step", details, wait=False)


STEPS = _Steps()


# ---- the memory triggers and the watchdog: one thread ----


class _Monitor:
    """The thread ``mxprof-triggers``: memory thresholds and the watchdog."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.stopping = threading.Event()
        self.above: set[int] = set()  # scopes over trigger_memory
        self.looks = 0  # how many times it looked (tests wait on it)
        self.rss_above = False
        self.statm = -2  # fd of /proc/self/statm; -2 not opened yet, -1 none
        self.armed_ns = _native.clock_ns()  # the watchdog counts from the later of this
        self.fired_at: int | None = None  # and the last step's end; fired for that end
        self.thread = _sampler.own_thread(
            threading.Thread(target=self.run, name="mxprof-triggers", daemon=True)
        )
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=10.0)

    def run(self) -> None:
        try:
            while True:
                cfg = self.session.config
                wait = min(POLL, max(cfg.watchdog / 4, 0.01)) if cfg.watchdog else POLL
                if self.stopping.wait(wait):
                    return
                with contextlib.suppress(Exception):  # a failed look must not end the looking
                    self.look()
                self.looks += 1
        finally:
            if self.statm >= 0:
                os.close(self.statm)

    def look(self) -> None:
        session = self.session
        cfg = session.config
        _memstep.SAMPLER.tick()  # memory_steps' period (it checks its own state)
        # The rest acts for a flight recorder only (memory_steps alone runs this thread too).
        recording = (
            session.state == "run" and not session.paused and session.profile_open and session.ring
        )
        if cfg.trigger_memory and recording:
            self.memory(cfg.trigger_memory)
        if cfg.trigger_rss and recording:
            self.resident(cfg.trigger_rss)
        now = _native.clock_ns()
        if not (cfg.watchdog and recording):
            self.armed_ns = now  # a hang is counted while recording only
            return
        last = max(STEPS.last_end_ns, self.armed_ns)
        if self.fired_at == last or now - last < cfg.watchdog * 1e9:
            return
        self.fired_at = last
        hang(session, (now - last) / 1e9)

    def memory(self, limit: int) -> None:
        for s in _native.memory_usage():
            if not s.is_scope:
                continue  # a device's use is its scopes' sum: one crossing, one snapshot
            key = s.key
            if s.current <= limit:
                self.above.discard(key)
            elif key not in self.above:
                self.above.add(key)
                from . import memory  # not at the top: it imports the session, which imports us

                name = next((u.name for u in memory.usage() if u.counter == s.counter), str(s.key))
                details = {
                    "kind": "scope",
                    "name": name,
                    "bytes": s.current,
                    "threshold": limit,
                }
                flight.trigger("memory", details, wait=False)

    def resident(self, limit: int) -> None:
        if self.statm == -2:
            try:
                self.statm = os.open("/proc/self/statm", os.O_RDONLY)
            except OSError:
                self.statm = -1
                _warn("mxprof: trigger_rss needs /proc/self/statm, which this system lacks")
        if self.statm < 0:
            return
        rss = int(os.pread(self.statm, 128, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
        if rss <= limit:
            self.rss_above = False
        elif not self.rss_above:
            self.rss_above = True
            details = {"kind": "rss", "name": "rss", "bytes": rss, "threshold": limit}
            flight.trigger("memory", details, wait=False)


def _open_ranges(session: Session, natives: list[int]) -> dict[int, tuple[float, str]]:
    """Per OS thread id, its innermost open range that is not mxprof's own:
    (begin in trace µs, ``domain:name``), as the core lists a thread's open
    ranges (``mxp_ranges_open``, the way ``mxprof ctl where`` reads them).
    A thread whose stack cannot be read now is left out."""
    innermost: dict[int, tuple[float, str]] = {}
    for native in natives:
        found = _native.ranges_open(native) or []
        now = _native.clock_ns()  # right after: the ages are as of the call
        for oid, age_ns in reversed(found):
            info = _native.object_info(oid)
            if is_own(info.domain, info.name):
                continue
            name = f"{info.domain}:{info.name}" if info.domain else info.name
            innermost[native] = (round((now - age_ns - session.epoch_ns) / 1e3, 3), name)
            break
    return innermost


def hang(session: Session, seconds: float) -> str | None:
    """The watchdog fired: sample every thread's stack onto its track, take
    the snapshot with the stacks and innermost ranges in its details, and
    say on stderr which thread is stuck where.  Returns the snapshot's path."""
    frames = sys._current_frames()
    slots = _native.SampleSlots()
    threads: list[dict[str, Any]] = []
    by_ident = {t.ident: t for t in threading.enumerate()}
    for ident, frame in frames.items():
        thread = by_ident.get(ident)
        native = getattr(thread, "native_id", None) if thread is not None else None
        if native in _sampler._own:
            continue  # mxprof's own threads (this one among them)
        name = thread.name if thread is not None else f"thread {ident}"
        stack: list[str] = []
        f: FrameType | None = frame
        while f is not None and len(stack) < STACK_DEPTH:
            stack.append(_where(f))
            f = f.f_back
        waiting = False
        if thread is not None and native is not None:
            probe = _sampler._Thread(thread)  # the OS's view: blocked or not
            waiting = probe.blocked()
            probe.close()
        threads.append(
            {"name": name, "id": native, "ident": ident, "waiting": waiting, "stack": stack}
        )
        sid = _sampler.stack_of(frame)
        if sid and waiting:  # as the sampler shows a blocked thread (wall mode)
            sid = _sampler.TABLES.node(sid, _sampler.TABLES.frame_of(_sampler.WAITING, "", 0))
        # The stack, as a sample on the thread's own track at this instant.
        if (
            native is not None
            and sid
            and _native.sample_add(native, 0, sid, slots.range, slots.tid) >= 0  # 1: NEW_THREAD
            and slots.tid[0]
        ):
            title = name.encode("utf-8", "replace")
            _native.thread_name_set(slots.tid[0], title, len(title))
    _threads.sync_names()
    innermost = _open_ranges(session, [t["id"] for t in threads if t["id"] is not None])
    stuck: dict[str, Any] | None = None
    for t in threads:
        opened = innermost.get(t["id"]) if t["id"] is not None else None
        t["innermost_range"] = opened[1] if opened else None
        t["range_began_us"] = opened[0] if opened else None
        if opened and (stuck is None or opened[0] < stuck["range_began_us"]):
            stuck = t
    if stuck is None:
        main = threading.main_thread().ident
        stuck = next((t for t in threads if t["ident"] == main), threads[0] if threads else None)
    for t in threads:
        del t["ident"]
    details = {
        "seconds_without_step": round(seconds, 3),
        "watchdog_seconds": session.config.watchdog,
        "stuck_thread": stuck["name"] if stuck else None,
        "threads": threads,
    }
    path = flight.trigger("hang", details, wait=False)
    if stuck is not None:
        where = stuck["stack"][0] if stuck["stack"] else "?"
        in_range = stuck["innermost_range"]
        line = (
            f"mxprof watchdog: no step ended for {seconds:.1f} s; thread {stuck['name']!r} "
            f"is stuck in {'range ' + repr(in_range) if in_range else 'no range'} at {where}; "
            f"snapshot: {path or 'none (see mxprof.flight.counts())'}\n"
        )
        with contextlib.suppress(Exception):
            sys.stderr.write(line)
            sys.stderr.flush()
    return path


# ---- installing ----


class _State:
    monitor: _Monitor | None = None


STATE = _State()


def apply(session: Session) -> None:
    """Install the triggers the configuration asks for while a flight
    recorder's profile is open, and remove the others.  Called by
    ``Session.sync`` with the session lock held, after every change."""
    cfg = session.config
    on = bool(session.ring) and session.profile_open
    EXCEPTIONS.set(on and cfg.trigger_exception)
    SIGNAL.set(cfg.trigger_signal if on else "")
    # memory_steps samples at step ends and on a period, flight recorder or not.
    memory = cfg.memory_steps and session.profile_open and session.state == "run"
    _memstep.SAMPLER.configure(session, memory)
    watch_steps = (on and bool(cfg.trigger_slow_step or cfg.watchdog)) or memory
    if watch_steps and ranges._steps is None:
        STEPS.reset()
    STEPS.factor = cfg.trigger_slow_step if on else 0.0
    STEPS.steps = cfg.trigger_slow_step_steps
    ranges.set_steps(STEPS if watch_steps else None)
    monitor = STATE.monitor
    want = on and bool(cfg.watchdog or cfg.trigger_memory or cfg.trigger_rss)
    want = want or (memory and cfg.memory_period > 0)
    if monitor is not None and (not want or not monitor.thread.is_alive()):
        monitor.stop()
        STATE.monitor = monitor = None
    if want and monitor is None:
        STATE.monitor = _Monitor(session)


def _after_fork_in_child() -> None:
    """The parent's thread does not exist here (the session's own
    after-fork call then applies the configuration afresh)."""
    STATE.monitor = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
