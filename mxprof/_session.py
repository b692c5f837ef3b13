"""The profiler's state machine: configuration, run/stop, pause, dumps to file.

A *profile* begins at the first ``set_state('run')`` (ts 0 of its trace) and
lasts through any number of stop/run and pause/resume cycles until
``dump(finished=True)`` or interpreter exit completes its file.  The file is
created at the profile's first write and is a complete JSON document after
every write (see native/src/mxp_trace.c).

All control calls serialise on one lock.  The hot path never takes it: it
reads the core's flags, which this module keeps in step with the state.

``Session`` is the only writer of its state: other modules call its methods
(``configure``, ``run``/``stop``/``pause``/``resume``, ``dump``, the write
hooks, the remote mode) and read its attributes; tests/test_session.py checks
that no other module assigns them.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import socket
import sys
import tempfile
import threading
import warnings
from types import FrameType
from typing import Any, Callable

from . import _children, _native, _sampler, _signals, _threads, _triggers, config, flight
from ._native import (
    FLAG_AGGREGATE,
    FLAG_MEMORY,
    FLAG_MEMORY_EVENTS,
    FLAG_NVTX,
    FLAG_RECORD,
    FLAG_TRACE,
    strerror,
    utf8,
)
from ._tracejson import dumps as trace_json
from ._version import __version__
from .domain import Domain
from .errors import ConfigError, OutputError, ProfilerError, StateError

STATES = ("run", "stop")

# A pre-write hook, called as hook(final): see Session.add_write_hook.
WriteHook = Callable[[bool], None]
# The remote controller: command(call, args) applies a control call to every server.
RemoteCommand = Callable[[str, dict[str, Any]], None]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def warn(message: str) -> None:
    """A RuntimeWarning attributed to the first caller outside mxprof."""
    frame: FrameType | None = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def check_process(value: Any) -> str:
    if value not in config.PROCESSES:
        raise ConfigError(f"profile_process must be 'worker' or 'server', got {value!r}")
    return str(value)


class _Flusher:
    """The background writer of continuous_dump: one daemon thread.

    It writes every ``period`` seconds, and sooner when the core wakes it
    because ``dump_events`` events wait in memory.  The wait is in C, with
    the GIL released.
    """

    def __init__(self, session: Session, period: float) -> None:
        self.period = period
        self._stop = threading.Event()
        self._session = session
        # The writer is not the program: never sampled.
        self.thread = _sampler.own_thread(
            threading.Thread(target=self._run, name="mxprof-flush", daemon=True)
        )
        self.thread.start()

    def _run(self) -> None:
        # The core waits in int64 ns (config keeps the period within it).
        timeout_ns = min(max(round(self.period * 1e9), 1), 2**63 - 1)
        while not self._stop.is_set():
            _native.flush_wait(timeout_ns)
            if self._stop.is_set():
                return
            try:
                self._session.background_flush(self._stop)
            except Exception as e:  # the writer must outlive any one write
                self._keep(e)

    def _keep(self, error: Exception) -> None:
        """Keep what a write raised as the session's pending error, as a failed
        write is kept: the next explicit dump() reports it.

        Without the session lock: a control call holding it may be joining
        this thread (see stop), and one assignment needs no lock."""
        if not isinstance(error, OutputError):
            path = self._session.config.filename
            kept = OutputError(
                f"a background write of trace file {path!r} failed: {error!r}; the events "
                "not written are kept in memory for the next successful write",
                path,
                getattr(error, "errno", None) or 0,
            )
            kept.__cause__ = error
            error = kept
        self._session.pending = error

    def stop(self) -> None:
        """Stop and wait; safe with the session lock held (see background_flush)."""
        self._stop.set()
        _native.flush_wake()
        if threading.current_thread() is not self.thread:
            self.thread.join()


class Session:
    """The process-wide profiler state (one instance, ``SESSION``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.top_json = ""  # set by mxprof.distributed; outlives reset()
        self.mp_hooked = False  # registered once per process
        # Registered at import by the modules that own them; they outlive reset().
        self._write_hooks: tuple[WriteHook, ...] = ()
        # The remote mode (mxprof.distributed); outlives reset().
        self._remote: RemoteCommand | None = None
        self._refusal: str | None = None
        self._rename: Callable[[str], str] | None = None
        self.reset()

    def reset(self) -> None:
        """Back to the state of a fresh import (the core is reset separately)."""
        self.config = config.Config()
        self.state = "stop"
        self.paused = False
        self.ever_ran = False
        self.profile_open = False  # a profile has begun and is not finished
        self.traced = False  # the open profile writes a trace file
        # The open profile's flight recorder window in seconds (0: none): its
        # records stay in memory for snapshots (mxprof.flight), no trace file.
        self.ring = 0.0
        self.epoch_ns = 0  # mxp_clock_ns when the open profile began
        # A child's parent's filename, which its own and its children's derive from.
        self.inherited_base: str | None = None
        self.flusher: _Flusher | None = None
        self.pending: OutputError | None = None  # a failed background write
        # dump(finished=True) while recording: the finished file's name, until
        # the events recorded since get a file of their own (<stem>-<n><ext>).
        self.continuation: str | None = None
        self.segments = 0
        # Every trace file the core has been pointed at since import (or
        # reset), continuations included, in order of first use: the files
        # this process's profiles wrote (`mxprof run` lists those that exist).
        self.trace_paths: list[str] = []
        self.applied_max_events = -1
        self.meta = (b"python", b"")
        self._flush_task: Any = None

    @property
    def writing(self) -> bool:
        """Whether recorded events are buffered for a trace file: the open
        profile's, or a continuation's after dump(finished=True) while running."""
        return (self.profile_open or self.continuation is not None) and self.traced

    # ---- control (mxprof.control's functions call these) ----

    def configure(self, values: dict[str, Any]) -> None:
        """Apply values that config.validate returned, all or none.

        A filename goes through the remote mode's rename rule.  Changing it
        while a profile is open completes the old file; later events go to the
        new one.
        """
        if "filename" in values and self._rename is not None:
            values = {**values, "filename": self._rename(values["filename"])}
        with self.lock:
            old = self.config
            self.config = old.with_(**values)
            try:
                self.sync()
            except BaseException:
                # Atomic: what failed to apply is taken back, and the core with it.
                self.config = old
                self.sync()
                raise
            # Last, as it cannot be taken back (the old file is completed); with
            # a validated path it does not fail.
            if self.profile_open and not self.ring and self.config.filename != old.filename:
                self.set_path(self.config.filename)

    def run(self) -> None:
        """State 'run', not paused; begins a profile when none is open."""
        with self.lock:
            if not self.profile_open:
                self.begin_profile()
            self.paused = False
            self.state = "run"
            self.sync()

    def stop(self) -> None:
        """State 'stop'; the ranges open on any thread end here, cut short."""
        with self.lock:
            was = self.state
            self.state = "stop"
            self.sync()
            if was == "run":
                self.cut_open_ranges()

    def pause(self) -> None:
        """Stop recording without leaving the state 'run'."""
        with self.lock:
            self.paused = True
            self.sync()

    def resume(self) -> None:
        """Undo pause()."""
        with self.lock:
            self.paused = False
            self.sync()

    def dump(self, finished: bool) -> bool:
        """Write what is buffered (mxprof.dump); False when no profile has
        anything to write (nothing was done).

        Raises:
            StateError: the profiler has never run.
            OutputError: the trace file cannot be written.
        """
        with self.lock:
            if not self.ever_ran:
                raise StateError(
                    "dump() needs a profile, and the profiler has never run: "
                    "call mxprof.set_state('run') first"
                )
            if not self.profile_open and self.continuation is None:
                return False
            if self.ring:
                # A flight recorder writes snapshots only: dump() takes one.
                self.write_ring_snapshot("dump()")
                if finished:
                    self.end_profile()
                return True
            if finished and self.state == "run" and self.profile_open:
                self.cut_open_ranges()  # the profile ends here, and so do its ranges
            if self.traced:
                self.flush(finish=finished, explicit=True)
            if finished and self.state == "run" and self.traced:
                self.end_profile_running()  # recording goes on: never into nowhere
            elif finished:
                self.end_profile()
            return True

    # ---- pre-write hooks ----

    def add_write_hook(self, hook: WriteHook) -> None:
        """Call hook(final) under the session lock before every trace write and
        every dumps(); final: the profile's last write.  Producers of late
        records (GPU ranges resolved from CUDA events) put what they have into
        the core there.  Adding a hook twice keeps one.

        Without the session lock: modules add their hooks while they are
        imported, and a control call holding the lock may be importing one.
        Readers take the tuple as it is, so a change never disturbs a write."""
        if hook not in self._write_hooks:
            self._write_hooks = (*self._write_hooks, hook)

    def remove_write_hook(self, hook: WriteHook) -> None:
        """Undo add_write_hook (nothing when hook is not there)."""
        self._write_hooks = tuple(h for h in self._write_hooks if h != hook)

    @property
    def write_hooks(self) -> tuple[WriteHook, ...]:
        """The pre-write hooks, in the order they were added."""
        return self._write_hooks

    def run_write_hooks(self, final: bool) -> None:
        """Call every pre-write hook; one that raises is reported, never raised."""
        for hook in self._write_hooks:
            try:
                hook(final)
            except Exception as e:  # a hook must never cost the trace
                warn(f"mxprof: a pre-write hook ({hook!r}) failed: {e!r}")

    # ---- remote mode (mxprof.distributed) ----

    def set_remote(self, command: RemoteCommand | None, refusal: str | None = None) -> None:
        """Set (or with None, clear) the remote controller.

        command(call, args) applies a control call to every server (the
        rank-0 worker of a distributed job); refusal: why there is none, which
        a profile_process='server' call then raises (e.g. on other ranks).
        """
        self._remote = command
        self._refusal = refusal

    def set_rename(self, rule: Callable[[str], str] | None) -> None:
        """Map every filename set_config is given to the one this process
        writes (servers: rank<r>_<name>); None: keep names as given."""
        self._rename = rule

    def clear_remote(self) -> None:
        """Leave the remote mode: no controller, refusal or rename rule."""
        self.set_remote(None)
        self.set_rename(None)

    def remote(self, call: str, args: dict[str, Any]) -> None:
        """Apply a profile_process='server' call to every server, or say why not.

        Raises:
            StateError: this process has no remote controller.
        """
        command = self._remote
        if command is None:
            raise StateError(
                self._refusal
                or f"{call}(profile_process='server') needs a distributed job: no kvstore "
                "server is connected to this process (call mxprof.distributed.init first)"
            )
        command(call, args)

    # ---- keeping the core in step ----

    def sync(self) -> None:
        """Make the core's flags and the background writer match the state."""
        # Stack sampling runs while the state is 'run' (paused: it idles).  It
        # stops before anything else changes and starts after everything
        # else, so that no sample catches the calling thread in this work.
        sampling = self.config.sample_rate if self.state == "run" else 0.0
        if not sampling:
            _sampler.apply(0.0)
        recording = self.state == "run" and not self.paused
        want = (
            (FLAG_RECORD if recording else 0)
            | (FLAG_TRACE if self.writing else 0)
            | (FLAG_AGGREGATE if self.config.aggregate_stats else 0)
            | (FLAG_NVTX if self.config.nvtx else 0)
        )
        # Memory is kept from run to stop, paused or not, so that a free seen
        # during a pause still finds its allocation.
        if self.state == "run" and self.config.enabled("profile_memory"):
            want |= FLAG_MEMORY | (FLAG_MEMORY_EVENTS if self.config.memory_events else 0)
        every = FLAG_RECORD | FLAG_TRACE | FLAG_AGGREGATE | FLAG_MEMORY | FLAG_MEMORY_EVENTS
        every |= FLAG_NVTX
        _native.flags_update(want, every & ~want)
        ring = self.ring if self.profile_open else 0.0
        cap = flight.cap_records(self.config.flight_recorder_bytes) if ring else 0
        max_events = cap if ring else self.config.max_events
        if max_events != self.applied_max_events:
            _native.max_events_set(max_events)
            self.applied_max_events = max_events
        # A flight recorder's background writer trims its ring (and writes
        # its snapshots), whatever continuous_dump says.
        period = flight.period(ring) if ring else self.config.dump_period
        wanted = self.writing and (self.config.continuous_dump or bool(ring))
        if self.flusher is not None and (not wanted or self.flusher.period != period):
            self.flusher.stop()
            self.flusher = None
        if wanted and self.flusher is None:
            self.flusher = _Flusher(self, period)
        threshold = cap * 3 // 4 if ring else self.config.dump_events
        _native.flush_threshold_set(threshold if wanted else 0)
        if self.profile_open and self.state == "run" and self.config.follow_children:
            base = self.inherited_base or self.config.filename
            _children.export(self.config.as_dict(), base, self.paused)
            if not self.mp_hooked:
                _children.write_at_multiprocessing_exit(self)
                self.mp_hooked = True
        else:
            _children.withdraw()
        _triggers.apply(self)  # a flight recorder's triggers, in place while it records
        if sampling:
            _sampler.apply(sampling, self.config.sample_mode)

    def begin_profile(self) -> None:
        self.close_continuation()
        _native.profile_begin()
        argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        process = utf8(argv0 if argv0 not in ("", "-c", "-m") else "python", "process name")
        other = (
            f'"mxprof_version":{trace_json(__version__)},"host":{trace_json(socket.gethostname())}'
            f',"config":{trace_json(self.config.as_dict())}'
        )
        if self.config.sample_rate:  # which sampler takes the samples, and why not the native one
            other += f',"sampler":{trace_json(_sampler.describe())}'
        self.meta = (process, other.encode())
        self.push_meta()
        self.epoch_ns = _native.profile_epoch_ns()
        self.ring = self.config.flight_recorder if self.config.write_trace else 0.0
        flight.RECORDER.begin()
        if not self.ring:
            self.set_path(self.config.filename)
        self.traced = self.config.write_trace
        self.profile_open = True
        self.ever_ran = True
        self.pending = None
        if self.config.flush_on_signal:
            _signals.install(self.signal_flush)

    def push_meta(self) -> None:
        """Hand the core the profile's metadata (written with every trailer)."""
        process, other = self.meta
        top = self.top_json.encode()
        _native.trace_meta_set(process, top, other)

    def set_top_json(self, text: str) -> None:
        """Extra top-level members of the trace (e.g. '"distributedInfo":{...}')."""
        with self.lock:
            self.top_json = text
            if self.profile_open:
                self.push_meta()

    def set_path(self, path: str) -> None:
        """Point the core at path; this profile's events so far go to the old one."""
        data = utf8(path, "filename")
        rc = _native.trace_path_set(data)
        if rc != _native.E_INVALID and path not in self.trace_paths:
            self.trace_paths.append(path)
        if rc == _native.E_IO:
            warn(
                "mxprof: could not write the trace file before switching to "
                f"{path!r}: {strerror(_native.trace_errno())}; its events go to {path!r}"
            )
        elif self.pending is not None:
            warn(f"mxprof: {self.pending}; the events it kept go to {path!r}")
        self.pending = None

    # ---- writing ----

    def end_profile_running(self) -> None:
        """dump(finished=True) while recording: the profile's file is complete;
        what is recorded from now on stays buffered for a continuation file,
        which the first write that has something for it creates."""
        if self.continuation is None:
            self.continuation = self.config.filename
        self.end_profile()

    def close_continuation(self) -> None:
        """Before a new profile: write what waits for a continuation file."""
        if self.continuation is None:
            return
        try:
            if self.traced:
                self.flush(finish=True, explicit=False)
        finally:
            self.continuation = None
            self.profile_open = False

    def _open_continuation(self) -> bool:
        """Before a write while continuing: open the next file, named after
        the finished one; False when nothing waits to be written."""
        assert self.continuation is not None
        if _native.trace_pending() == 0:
            return False
        self.segments += 1
        path = _children.with_infix(self.continuation, f"-{self.segments}")
        data = utf8(path, "filename")
        _native.trace_continue(data)
        self.trace_paths.append(path)
        warn(
            f"mxprof: events were recorded after dump(finished=True) completed "
            f"{self.continuation!r} while still running; they go to {path!r}"
        )
        self.continuation = None
        self.profile_open = True  # the same profile, in its next file
        return True

    def flush(self, finish: bool, explicit: bool) -> None:
        """Write the buffered events; on failure raise (explicit) or keep the error."""
        _threads.sync_names()
        self.run_write_hooks(finish)
        if self.continuation is not None and not self._open_continuation():
            return
        task = None
        recording = self.state == "run" and not self.paused
        # A finishing write times nothing: its range would end after the file.
        if recording and not finish and self.config.enabled("profile_api"):
            if self._flush_task is None:
                self._flush_task = Domain("mxprof").new_task("flush")
            task = self._flush_task
        if task is not None:
            task.start()
        try:
            rc = _native.trace_flush(finish)
        finally:
            if task is not None:
                task.stop()
        if rc == 0:
            if explicit and self.pending is not None:
                warn(
                    f"mxprof: an earlier background write failed ({self.pending}); "
                    "this dump() wrote everything it had kept"
                )
            self.pending = None
            return
        if rc == _native.E_STATE:
            raise StateError("no trace file to write: the profile has no path")
        path = self.config.filename
        code = _native.trace_errno()
        why = {
            errno.ESPIPE: "; a pipe or socket cannot hold a trace, whose end is rewritten at "
            "every write: use a regular file (or a device such as /dev/null)",
            errno.ESTALE: "; the file was removed or replaced (or its directory removed) "
            "while it was written, so what it held is gone; the next write creates it anew",
        }.get(code, "")
        error = OutputError(
            f"cannot write trace file {path!r}: {strerror(code)}{why}; the events not yet "
            "written are kept in memory for the next successful write",
            path,
            code,
        )
        if explicit:
            self.pending = None
            raise error
        self.pending = error

    def trace_now(self) -> str | None:
        """This process's trace file, written up to now (what was buffered is
        flushed first); None where there is none: it never ran, or a flight
        recorder writes snapshots instead of a trace.

        Raises:
            OutputError: the buffered events cannot be written.
        """
        with self.lock:
            if self.ring:
                return None
            if self.profile_open and self.traced:
                self.flush(finish=False, explicit=True)
            path = self.config.filename
            return os.path.abspath(path) if self.ever_ran and os.path.exists(path) else None

    def copy_trace(self, prefix: str) -> str | None:
        """A consistent copy of the trace as complete now, in a new temporary
        file (the caller removes it); None where ``trace_now`` has none.

        No background write runs while the file is copied, so the copy is a
        whole trace even while events are still recorded.

        Raises:
            OutputError: the buffered events cannot be written.
        """
        with self.lock:
            path = self.trace_now()
            if path is None:
                return None
            fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=os.path.basename(path))
            os.close(fd)
            shutil.copyfile(path, tmp)
            return tmp

    def background_flush(self, stop: threading.Event) -> None:
        # Poll for the lock so that a control call holding it can stop and
        # join this thread without deadlocking.
        while not self.lock.acquire(timeout=0.05):
            if stop.is_set():
                return
        try:
            if not stop.is_set() and self.writing and self.ring and self.profile_open:
                flight.RECORDER.service(self)
            elif not stop.is_set() and self.writing and not self.ring:
                self.flush(finish=False, explicit=False)
        finally:
            self.lock.release()

    def write_ring_snapshot(self, reason: str) -> None:
        """dump() of a flight recorder: a snapshot now, besides any waiting
        (the interval and the most per profile do not apply).

        Raises:
            OutputError: the snapshot cannot be written.
        """
        snap = flight.RECORDER.take(self, reason, None, forced=True)
        if snap is None:
            return
        flight.RECORDER.write(self, snap, snap.trigger_ns)
        if snap.error is not None:
            raise snap.error

    def signal_flush(self) -> None:
        """Write everything buffered (from a signal handler: never raises),
        unless flush_on_signal has been turned off since the handler went in.
        A flight recorder queues a snapshot instead."""
        if self.ring and self.config.flush_on_signal:
            flight.trigger("signal", wait=False)
            return
        with self.lock:
            if self.writing and self.config.flush_on_signal:
                self.flush(finish=False, explicit=False)

    def cut_open_ranges(self) -> None:
        """Close every range open on any thread or task as ending now, cut short."""
        _native.ranges_cut()
        _threads.register_current()  # the cut may be this thread's first call

    def end_profile(self) -> None:
        self.profile_open = False
        self.ring = 0.0
        self.sync()

    def restart_profile(self) -> None:
        """Drop what the open profile recorded and begin it again (same file)."""
        with self.lock:
            self.begin_profile()
            self.sync()

    def discard_profile(self) -> str:
        """End the profile without writing what it still buffers; its path."""
        with self.lock:
            _native.trace_discard()
            self.end_profile()
            return self.config.filename

    def at_exit(self) -> None:
        with self.lock:
            if self.flusher is not None:
                self.flusher.stop()
                self.flusher = None
            if not self.profile_open and self.continuation is None:
                return
            if self.ring:
                # A flight recorder writes no trace: only the snapshots that
                # wait for their window after the trigger, cut here.
                flight.RECORDER.service(self, at_exit=True)
                self.end_profile()
                return
            if self.state == "run" and self.profile_open:
                self.cut_open_ranges()
            try:
                if self.traced:
                    self.flush(finish=True, explicit=True)
            except ProfilerError as e:
                warn(f"mxprof: trace not written at exit: {e}")
            self.end_profile()

    def after_fork_in_child(self) -> None:
        # The core forgot the parent's buffers and file; the parent's writer
        # thread and any lock holder do not exist here.
        self.lock = threading.RLock()
        self.flusher = None
        follow = self.profile_open and self.state == "run" and self.config.follow_children
        self.profile_open = False
        if not follow:
            self.state = "stop"
            self.paused = False
            self.sync()
            return
        self.continuation = None  # the parent's to write
        self.inherited_base = self.inherited_base or self.config.filename
        self.start_child(self.paused)

    def start_child(self, paused: bool) -> None:
        """Profile this child process into <stem>.<pid><ext> of the parent's file."""
        assert self.inherited_base is not None
        filename = _children.child_filename(self.inherited_base, os.getpid())
        self.config = self.config.with_(filename=filename)
        self.begin_profile()
        self.state = "run"
        self.paused = paused
        self.sync()

    def adopt_inherited(self) -> None:
        """At import in a child: profile as the parent offered (follow_children)."""
        offer = _children.inherited()
        if offer is None:
            return
        try:
            values = config.validate({k: v for k, v in offer["config"].items() if k in config.KEYS})
        except ProfilerError:
            return  # an offer from another mxprof version: not ours to follow
        values.pop("profile_process", None)
        with self.lock:
            self.config = self.config.with_(**values)
            self.inherited_base = offer["base"]
            self.start_child(bool(offer.get("paused")))


SESSION = Session()
SESSION.sync()
atexit.register(SESSION.at_exit)
SESSION.adopt_inherited()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SESSION.after_fork_in_child)
