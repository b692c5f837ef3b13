"""The flight recorder: the last seconds of everything, written when asked.

With ``set_config(flight_recorder=SECONDS)`` a profile writes no trace file.
Its records (ranges, instants, counters, memory events, samples) stay in the
core's per-thread buffers, and the background writer, instead of writing
them, drops those that ended more than SECONDS ago (``mxp_ring_trim``), and
the oldest when they would take more than ``flight_recorder_bytes``.
:func:`trigger` writes a *snapshot*: a new trace file holding the window
before the trigger (and ``flight_recorder_after`` seconds after it), with
the ranges still open cut at its end, each counter's value at its start,
and an ``otherData.flight_recorder`` object naming the reason, the trigger's
time and the window (``mxp_snapshot_write``).  Statistics (``dumps()``) keep
counting everything, as in any profile.

Snapshots are named after the trace file, ``<stem>.flight<N>-<reason><ext>``
(the format follows the extension, as for the trace), and never replace a
file.  A storm of triggers is limited: one snapshot per
``flight_recorder_interval`` seconds and ``flight_recorder_max`` per
profile; the triggers in between are counted (:func:`counts`) and the
next snapshot says how many there were.

A trigger never writes on a thread that may not wait: with ``wait=False``
(signal handlers, dying threads) it only queues the snapshot for the
background writer, which writes it as soon as its window has passed.

Every snapshot a trigger takes is handed to the callbacks in
:data:`ON_TRIGGER` (``mxprof.distributed`` registers one that makes the
trigger job-wide); :func:`snapshot_at` takes the snapshot of a window given
in wall-clock time, as every rank of a job does for a trigger elsewhere.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from . import _children, _native, _threads
from ._native import utf8
from ._tracejson import dumps as trace_json
from .errors import ConfigError, OutputError

if TYPE_CHECKING:
    from ._session import Session

# How long trigger(wait=True) waits beyond the window after the trigger: a
# snapshot of a 30 s window of 1 M events/s is written in about 2 s.
WAIT_SLACK = 30.0

# Each record takes 24 bytes in the core's buffers (mxpi_rec).
RECORD_BYTES = 24

COUNTS = ("triggers", "written", "not_recording", "suppressed", "over_max", "failed")


def period(window: float) -> float:
    """How often the background writer trims the ring of a window: often
    enough that it holds little more than the window (an eighth of it), and
    at least every quarter second, so that a snapshot due after its
    ``flight_recorder_after`` is written soon after."""
    return min(max(window / 8, 0.01), 0.25)


def cap_records(nbytes: int) -> int:
    """The records a ring of nbytes holds."""
    return max(nbytes // RECORD_BYTES, 1)


def _slug(reason: str) -> str:
    """The reason as a file-name part: letters, digits and _ only, short."""
    return re.sub(r"[^A-Za-z0-9_]+", "_", reason).strip("_")[:40] or "trigger"


@dataclass
class Snapshot:
    path: str
    reason: str
    details: dict[str, Any] | None
    trigger_ns: int  # mxp_clock_ns
    trigger_wall_ns: int
    window: float
    after: float
    suppressed: int
    done: threading.Event = field(default_factory=threading.Event)
    error: OutputError | None = None


# Called with every snapshot a trigger takes (not dump()'s, not snapshot_at's),
# on the triggering thread, which may be a signal handler or a dying thread:
# a callback only hands the snapshot on (a queue.SimpleQueue.put), never
# blocks; what it raises is dropped.  mxprof.distributed registers one.
ON_TRIGGER: list[Callable[[Snapshot], None]] = []


class _Recorder:
    """The process's snapshots: the queue, the names taken, the counts."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """As at import: counts from zero, and no profile."""
        self.counts = dict.fromkeys(COUNTS, 0)  # the process's, over its profiles
        self.begin()

    def begin(self) -> None:
        """A new profile: no snapshot yet."""
        # deque: append and popleft are atomic, so a signal handler may queue
        # while the background writer takes.
        self.queue: collections.deque[Snapshot] = collections.deque()
        self.taken = 0  # snapshots toward flight_recorder_max (written or queued)
        self.named = 0  # the last snapshot's number in its file name
        self.last_ns: int | None = None  # the last snapshot's trigger
        self.suppressed = 0  # since the last snapshot

    def take(
        self,
        session: Session,
        reason: str,
        details: dict[str, Any] | None,
        forced: bool = False,
        at: tuple[int, int, float, float] | None = None,
    ) -> Snapshot | None:
        """Name and queue a snapshot of now, or count why not.

        forced: dump()'s own snapshot, which neither the interval nor the
        most per profile hold back, which counts toward neither, and which
        a stop or a pause of the open profile does not prevent.
        at: (trigger_ns, trigger_wall_ns, window, after) of a window asked
        for from elsewhere (:func:`snapshot_at`): queued whatever the
        interval and the most, counted toward neither, and handed to no
        ON_TRIGGER callback."""
        counts = self.counts
        counts["triggers"] += 1
        cfg = session.config
        recording = session.state == "run" and not session.paused
        if not (session.ring and session.profile_open) or not (recording or forced):
            counts["not_recording"] += 1
            return None
        now = _native.clock_ns()
        if not forced and at is None:
            interval_ns = round(cfg.flight_recorder_interval * 1e9)
            if self.last_ns is not None and now - self.last_ns < interval_ns:
                counts["suppressed"] += 1
                self.suppressed += 1
                return None
            if self.taken >= cfg.flight_recorder_max:
                counts["over_max"] += 1
                return None
            self.taken += 1
            self.last_ns = now
        snap = Snapshot(
            path=self._name(cfg.filename, reason),
            reason=reason,
            details=details,
            trigger_ns=now,
            trigger_wall_ns=_native.clock_wall_ns(),
            window=session.ring,
            after=cfg.flight_recorder_after,
            suppressed=self.suppressed,
        )
        if at is not None:
            snap.trigger_ns, snap.trigger_wall_ns, snap.window, snap.after = at
            snap.suppressed = 0
            self.queue.append(snap)
            return snap
        self.suppressed = 0
        if forced:
            snap.after = 0.0  # the caller writes it at once
            return snap
        self.queue.append(snap)
        for callback in list(ON_TRIGGER):
            with contextlib.suppress(Exception):  # a trigger never fails for a callback
                callback(snap)
        return snap

    def _name(self, base: str, reason: str) -> str:
        """A file name no snapshot or other file has."""
        self.named += 1
        n = self.named
        while True:
            path = _children.with_infix(base, f".flight{n}-{_slug(reason)}")
            if not os.path.lexists(path) and all(s.path != path for s in self.queue):
                return path
            n += 1

    def service(self, session: Session, at_exit: bool = False) -> None:
        """Trim the ring and write the snapshots whose window has passed (all
        of them at exit, cut at now).  Called with the session lock held."""
        now = _native.clock_ns()
        while self.queue:
            snap = self.queue[0]
            due = snap.trigger_ns + round(snap.after * 1e9)
            if due > now and not at_exit:
                break
            self.queue.popleft()
            self.write(session, snap, min(due, now))
        if not at_exit:
            keep = round(session.ring * 1e9)
            cap = cap_records(session.config.flight_recorder_bytes)
            _native.ring_trim(keep, cap * 3 // 4)

    def write(self, session: Session, snap: Snapshot, end_ns: int) -> None:
        """Write snap's window up to end_ns; a failure is kept in snap.error.
        Called with the session lock held."""
        start_ns = snap.trigger_ns - round(snap.window * 1e9)
        floor = _native.ring_floor_ns()
        kept_from = max(start_ns, floor) if floor is not None else start_ns
        epoch = session.epoch_ns

        def us(ns: int) -> float:
            return round((ns - epoch) / 1e3, 3)

        info: dict[str, Any] = {
            "reason": snap.reason,
            "pid": os.getpid(),
            "trigger_us": us(snap.trigger_ns),
            "trigger_wall_ns": snap.trigger_wall_ns,
            "window_seconds": snap.window,
            "after_seconds": snap.after,
            "start_us": us(max(kept_from, epoch)),
            "end_us": us(end_ns),
            "requested_start_us": us(max(start_ns, epoch)),
            "shortened_by_cap": kept_from > start_ns,
            "suppressed_triggers": snap.suppressed,
        }
        if snap.details:
            info["details"] = snap.details
        other = f'"flight_recorder":{trace_json(info)}'.encode()
        _threads.sync_names()  # the threads' names, as every trace write has them
        rc = _native.snapshot_write(utf8(snap.path, "snapshot path"), start_ns, end_ns, other)
        if rc == 0:
            self.counts["written"] += 1
        else:
            code = _native.trace_errno() if rc == _native.E_IO else 0
            why = os.strerror(code) if code else "the flight recorder's profile has ended"
            snap.error = OutputError(
                f"cannot write flight recorder snapshot {snap.path!r}: {why}; the recorded "
                "window is kept for the next trigger",
                snap.path,
                code,
            )
            self.counts["failed"] += 1
            self.taken = max(self.taken - 1, 0)  # a failed snapshot takes neither a
            self.last_ns = None  # place nor the interval
        snap.done.set()


RECORDER = _Recorder()


def trigger(
    reason: str = "trigger", details: dict[str, Any] | None = None, wait: bool = True
) -> str | None:
    """Write a flight recorder snapshot of the last ``flight_recorder`` seconds.

    A no-op returning None (and counted, see :func:`counts`) when no flight
    recorder is recording, when the last snapshot was less than
    ``flight_recorder_interval`` seconds ago, or when the profile has
    written ``flight_recorder_max`` of them already.

    Args:
        reason: why, in the snapshot's ``otherData.flight_recorder.reason``
            and its file name.
        details: JSON-able facts the snapshot carries beside the reason.
        wait: return once the file is written (after the
            ``flight_recorder_after`` window).  False only queues it for the
            background writer: for signal handlers and dying threads, which
            must never wait.

    Returns:
        The snapshot's path (with ``wait=False``, where it will be written),
        or None.

    Raises:
        ConfigError: reason is not a str.
        OutputError: (``wait=True``) the file could not be written; the
            window stays recorded for the next trigger.

    Example:
        >>> import mxprof
        >>> mxprof.set_config(flight_recorder=30, filename="train.json")
        >>> mxprof.set_state("run")
        >>> path = mxprof.trigger("loss is NaN")  # train.flight1-loss_is_NaN.json
    """
    from ._session import SESSION

    if not isinstance(reason, str):
        raise ConfigError(f"trigger reason must be a str, got {type(reason).__name__} {reason!r}")
    snap = RECORDER.take(SESSION, reason, details)
    if snap is None:
        return None
    return _finish(snap, wait)


def _finish(snap: Snapshot, wait: bool) -> str:
    """snap's path, once written when wait (raising its OutputError)."""
    from ._session import SESSION

    writer = SESSION.flusher
    if not wait or writer is None or threading.current_thread() is writer.thread:
        _native.flush_wake()
        return snap.path
    if snap.after == 0 and SESSION.lock.acquire(timeout=1.0):
        try:  # write it here and now; the writer would only add a wait
            if RECORDER.queue and RECORDER.queue[0] is snap:
                RECORDER.service(SESSION)
        finally:
            SESSION.lock.release()
    else:
        _native.flush_wake()
    snap.done.wait(snap.after + WAIT_SLACK)
    if snap.error is not None:
        raise snap.error
    return snap.path


def snapshot_at(
    reason: str,
    wall_ns: int,
    window: float,
    after: float,
    details: dict[str, Any] | None = None,
    wait: bool = True,
) -> str | None:
    """A snapshot of ``[wall_ns - window, wall_ns + after]``, wall_ns on this
    process's wall clock (``_native.clock_wall_ns``): the window a trigger
    elsewhere asks of this process (``mxprof.distributed`` converts the
    trigger's time through its clock alignment first).

    Neither ``flight_recorder_interval`` nor ``flight_recorder_max`` holds
    it back (the trigger it answers was held to them where it happened), no
    :data:`ON_TRIGGER` callback sees it, and its window is at most this
    process's ``flight_recorder`` seconds (the ring keeps no more).

    Args:
        reason: as for :func:`trigger`.
        wall_ns: the trigger's time, ns on this process's wall clock.
        window: seconds before it.
        after: seconds after it.
        details: as for :func:`trigger`.
        wait: as for :func:`trigger`.

    Returns:
        The snapshot's path, or None (counted as ``not_recording``) when no
        flight recorder is recording.

    Raises:
        OutputError: (``wait=True``) the file could not be written.

    Example:
        >>> from mxprof import _native, flight
        >>> flight.snapshot_at("hang on rank 3", _native.clock_wall_ns(), 10, 0)  # doctest: +SKIP
    """
    from ._session import SESSION

    # The two clocks read together: their difference moves the wall time
    # onto the core's monotonic clock, which the ring's records are on.
    mono, wall = _native.clock_ns(), _native.clock_wall_ns()
    trigger_ns = int(wall_ns) - (wall - mono)
    kept = min(max(float(window), 0.0), SESSION.ring or 0.0)
    at = (trigger_ns, int(wall_ns), kept, max(float(after), 0.0))
    snap = RECORDER.take(SESSION, reason, details, at=at)
    if snap is None:
        return None
    return _finish(snap, wait)


def path_for(reason: str) -> str:
    """A snapshot file name, after the trace file and the reason, that no
    file and no queued snapshot has (``mxprof.distributed`` names its
    merged job-wide snapshot so)."""
    from ._session import SESSION

    return RECORDER._name(SESSION.config.filename, reason)


def counts() -> dict[str, int]:
    """How the process's triggers went: ``triggers`` (all calls), ``written``
    snapshots, ``not_recording`` (no flight recorder recording),
    ``suppressed`` (within ``flight_recorder_interval`` of the last one),
    ``over_max`` (``flight_recorder_max`` reached) and ``failed`` writes."""
    return dict(RECORDER.counts)
