"""Job-wide flight recorder snapshots: a trigger on any rank, the same window everywhere.

A trigger on any process of the job (``mxprof.trigger`` or any trigger key:
every snapshot a trigger takes goes through ``flight.ON_TRIGGER``) is
handed to this module's thread, which tells the rank-0 worker (a ``flight``
notice, the trigger's time moved onto the rank-0 worker's wall clock with
this process's measured offset).  The rank-0 worker asks every process for
its snapshot of that same wall-clock window (``flight_window``: each moves
the time back onto its own clock; the triggering process answers with the
snapshot its trigger wrote), takes its own, downloads theirs piece by piece
(collect's download, under ``flight_upload``) and merges them with
``trace.merge`` (clock-aligned, as ``collect``) into one snapshot beside
its trace, ``<stem>.flight<N>-job_<reason><ext>``.

The merged file's ``otherData.flight_recorder`` names the reason, the
process that triggered and its details, the trigger's time and window on
the merged timeline, each process's window and the innermost ranges it had
open at the trigger (and for how long: in a hang, the process whose range
differs from the others' stands out, ``stuck``), and the processes missing
with why (as ``collect``: a dead, frozen or unreachable process costs the
others nothing beyond the timeout).

Triggers are served one at a time; one within ``flight_recorder_interval``
(the rank-0 worker's) of the last job-wide trigger is dropped, counted, and
named by the next merged snapshot (``suppressed_triggers``): when a job
hangs, every rank's watchdog fires and the first one wins.
"""

from __future__ import annotations

import collections
import os
import queue
import secrets
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import flight
from .._sampler import own_thread
from .._session import SESSION
from ..errors import ProfilerError, TraceFormatError
from ..trace.snapshot import headline, read_window, standing_out
from ._endpoint import RemoteFailure

if TYPE_CHECKING:
    from ._collect import Gap
    from ._node import Hub, Member, Node

NOTICE = "flight"  # a process -> the rank-0 worker: a trigger here
WINDOW = "flight_window"  # the rank-0 worker -> a process: snapshot this window
FETCH = "flight_upload"  # the rank-0 worker -> a process: a piece of that snapshot
KEEP = 16  # snapshots a process keeps ready for download (the oldest forgotten)
CLOSE_WAIT = 1.0  # seconds shutdown waits for this module's thread


@dataclass(frozen=True)
class Trigger:
    """A job-wide trigger, as the rank-0 worker serves it."""

    id: str
    reason: str
    ref_ns: int  # the trigger's time, ns on the rank-0 worker's wall clock
    window: float
    after: float
    by: Member
    # The triggering process's own snapshot, where it said it writes it: read
    # by the rank-0 worker should that process not answer (it may be dying of
    # the exception that triggered), when that file names that very process.
    file: str | None = None

    def args(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "reason": self.reason,
            "ref_ns": self.ref_ns,
            "window": self.window,
            "after": self.after,
            "by": self.by.label,
            "file": self.file,
        }


class Relay:
    """A process's part: its triggers to the rank-0 worker, its windows on request."""

    def __init__(self, node: Node) -> None:
        self.node = node
        # SimpleQueue: put is safe from a signal handler on the thread that get()s.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._own: dict[str, flight.Snapshot] = {}  # this process's triggers by id
        self._files: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._last_ref: int | None = None  # the rank-0 worker: the last job-wide trigger
        self._suppressed = 0
        self._closed = False
        self._thread = own_thread(
            threading.Thread(target=self._run, name="mxprof-dist-flight", daemon=True)
        )
        self._thread.start()
        flight.ON_TRIGGER.append(self._on_trigger)

    def close(self) -> None:
        """Stop relaying once the triggers queued are told (a process dying
        of what triggered leaves through here); a job-wide snapshot under way
        ends on its own (bounded)."""
        self._closed = True
        if self._on_trigger in flight.ON_TRIGGER:
            flight.ON_TRIGGER.remove(self._on_trigger)
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT)

    def _on_trigger(self, snap: flight.Snapshot) -> None:
        # May run in a signal handler or a dying thread: hand on, nothing more.
        self._queue.put(snap)

    def requested(self, by: Member, args: dict[str, Any]) -> None:
        """The rank-0 worker: a process's notice of a trigger (checked here)."""
        ident, reason, ref = args.get("id"), args.get("reason"), args.get("ref_ns")
        window, after = args.get("window"), args.get("after")
        if not (
            isinstance(ident, str)
            and len(ident) <= 64
            and isinstance(reason, str)
            and isinstance(ref, int)
            and not isinstance(ref, bool)
            and all(isinstance(x, (int, float)) and 0 <= x < 1e6 for x in (window, after))
        ):
            raise ProfilerError(f"malformed flight notice from {by.label}")
        assert isinstance(window, (int, float)) and isinstance(after, (int, float))
        file = args.get("file")
        file = file if isinstance(file, str) and 0 < len(file) <= 4096 else None
        self._queue.put(Trigger(ident, reason[:200], ref, float(window), float(after), by, file))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:  # after every item queued before it: a process
                return  # leaving tells the rank-0 worker of its last triggers
            try:
                if isinstance(item, Trigger):
                    self._serve(item)
                else:
                    self._relay(item)
            except Exception as e:  # a failed job-wide snapshot never stops the next one
                _warn(f"mxprof: job-wide flight recorder snapshot failed: {e}")

    def _relay(self, snap: flight.Snapshot) -> None:
        """A trigger here: to the rank-0 worker, its time on that one's clock."""
        from ._node import HUB, Hub, Peer

        node = self.node
        ident = secrets.token_hex(8)
        with self._lock:
            self._own[ident] = snap
            while len(self._own) > KEEP:
                self._own.pop(next(iter(self._own)))
        wall = snap.trigger_wall_ns
        trigger = Trigger(
            ident,
            snap.reason,
            wall + node.clock.offset_at(wall),
            snap.window,
            snap.after,
            node.me,
            os.path.abspath(snap.path),
        )
        if isinstance(node, Hub):
            self._serve(trigger)
        elif isinstance(node, Peer) and node.joined and not node.hub_gone:
            node.endpoint.notify(HUB, NOTICE, trigger.args())

    # -- every process: its window, then its pieces --

    def window(self, args: dict[str, Any]) -> dict[str, Any]:
        """This process's snapshot of the window args name (``flight_window``)."""
        ident, ref = args.get("id"), args.get("ref_ns")
        if not isinstance(ident, str) or not isinstance(ref, int) or isinstance(ref, bool):
            raise ProfilerError(f"malformed flight window request {args!r}")
        with self._lock:
            snap = self._own.pop(ident, None)
        if snap is not None:  # this process's own trigger: its snapshot is the window
            snap.done.wait(snap.after + flight.WAIT_SLACK)
            if snap.error is not None:
                raise snap.error
            if not snap.done.is_set():
                raise ProfilerError(f"its snapshot {snap.path} was not written in time")
            path: str | None = snap.path
        else:
            path = flight.snapshot_at(
                str(args.get("reason")),
                self._local_wall(ref),
                float(args.get("window") or 0.0),
                float(args.get("after") or 0.0),
                {"job_trigger": {"id": ident, "by": str(args.get("by"))}},
            )
        if path is None:
            return {"missing": "its flight recorder is not recording"}
        with self._lock:
            self._files[ident] = path
            while len(self._files) > KEEP:
                self._files.popitem(last=False)
        return {"file": os.path.abspath(path)}

    def _local_wall(self, ref_ns: int) -> int:
        """ref_ns (the rank-0 worker's wall clock) on this process's wall
        clock: the offset is a function of the local time, so it is looked
        up once more at the first guess."""
        clock = self.node.clock
        return ref_ns - clock.offset_at(ref_ns - clock.offset_at(ref_ns))

    def piece(self, args: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """A piece of a window's snapshot (``flight_upload``), as collect's upload."""
        from ._node import file_piece

        ident, offset = args.get("id"), args.get("offset")
        with self._lock:
            path = self._files.get(ident) if isinstance(ident, str) else None
        if path is None or not isinstance(offset, int) or offset < 0:
            raise ProfilerError(f"no flight snapshot {ident!r} at {offset!r} to upload")
        size, chunk = file_piece(path, offset)
        if offset + len(chunk) >= size:
            with self._lock:
                self._files.pop(str(ident), None)
        return {"size": size, "name": os.path.basename(path)}, chunk

    # -- the rank-0 worker --

    def _serve(self, trigger: Trigger) -> None:
        """One job-wide snapshot, or none within the interval of the last
        (nor any once this process is leaving the job)."""
        if self._closed:
            return
        interval_ns = round(SESSION.config.flight_recorder_interval * 1e9)
        if self._last_ref is not None and abs(trigger.ref_ns - self._last_ref) < interval_ns:
            self._suppressed += 1
            return
        self._last_ref = trigger.ref_ns
        suppressed, self._suppressed = self._suppressed, 0
        from ._node import Hub

        assert isinstance(self.node, Hub)
        job_snapshot(self.node, self, trigger, suppressed)


def _warn(message: str) -> None:
    from .. import _session

    _session.warn(message)


def job_snapshot(hub: Hub, relay: Relay, trigger: Trigger, suppressed: int) -> dict[str, Any]:
    """Every process's snapshot of trigger's window, merged into one file.

    Waits ``after`` + the job's timeout for the windows, then (as collect)
    one more timeout per piece a process stops in the middle of.

    Returns:
        The merged snapshot's ``otherData.flight_recorder`` plus ``path``.
    """
    from . import _collect

    timeout = hub.job.timeout
    args = trigger.args()
    slots = hub.job.expected()
    with hub.reg.lock:
        found = {s: hub.reg.by_slot[s] for s in slots if s in hub.reg.by_slot}
    # This process's own window is taken on a thread of its own meanwhile.
    own: list[Any] = []
    taker = threading.Thread(target=_capture, args=(own, relay.window, args), daemon=True)
    taker.start()
    waited = trigger.after + timeout
    answers = hub.endpoint.request_many([k.src for k in found.values()], WINDOW, args, waited)
    taker.join(trigger.after + flight.WAIT_SLACK)
    path = flight.path_for(f"job {trigger.reason}")
    tmp = tempfile.mkdtemp(
        prefix="mxprof-flight-", dir=os.path.dirname(os.path.abspath(path)) or "."
    )
    inputs: list[str] = []
    who: list[Member] = []
    gaps: list[Gap] = []
    try:
        mine = own[0] if own else TimeoutError("its snapshot was not written in time")
        if isinstance(mine, BaseException):
            gaps.append(_gap(hub.me, f"its snapshot failed: {mine}", True))
        elif "missing" in mine:
            gaps.append(_gap(hub.me, str(mine["missing"]), False))
        else:
            inputs.append(mine["file"])
            who.append(hub.me)
        for slot in slots:
            known = found.get(slot)
            if known is None:
                why = "not connected (never joined, or left the job)"
                gaps.append(_collect.Gap(f"{slot[0]} {slot[1]}", slot[0], slot[1], why, True))
                continue
            answer = answers.get(known.src)
            if isinstance(answer, tuple) and "missing" in answer[0]:
                gaps.append(_gap(known.member, str(answer[0]["missing"]), False))
                continue
            if isinstance(answer, tuple):
                try:
                    got = _collect.download(hub, known, tmp, FETCH, {"id": trigger.id})
                except ProfilerError as e:
                    gaps.append(_gap(known.member, str(e), True))
                    continue
                if got is not None:
                    inputs.append(got)
                    who.append(known.member)
                continue
            if isinstance(answer, RemoteFailure):
                why = f"its snapshot failed: {answer.error}: {answer.message}"
            else:  # dead, frozen or unreachable: in collect's words
                why = _collect.silence(hub, slot, known, answer, waited)
            gaps.append(_gap(known.member, why, True))
        # The triggering process gone (dying of what triggered, say): its
        # trigger's own snapshot, where this process can read it.
        for gap in gaps:
            if (gap.role, gap.rank) == (trigger.by.role, trigger.by.rank) and _own_file(trigger):
                assert trigger.file is not None
                gap.last_file = trigger.file
                inputs.append(trigger.file)
                who.append(trigger.by)
        if not inputs:
            raise TraceFormatError(
                f"job-wide flight recorder snapshot of {trigger.reason!r}: no process had one; "
                + "; ".join(g.sentence() for g in gaps)
            )
        per_rank = [_rank_view(p, m) for p, m in zip(inputs, who)]
        info: dict[str, Any] = {}

        def other(base_ns: int) -> dict[str, Any]:
            info.update(_merged_info(trigger, base_ns, per_rank, gaps, suppressed))
            return {"flight_recorder": info}

        sources = [f"{m.label}: {os.path.basename(p)}" for m, p in zip(who, inputs)]
        _merge(inputs, path, sources, _collect.missing_info(gaps), other)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = [g for g in gaps if g.failed]
    if failed:
        _warn(
            f"job-wide flight recorder snapshot {path} holds {len(inputs)} of "
            f"{hub.job.world_size} processes; missing " + "; ".join(g.sentence() for g in failed)
        )
    return {**info, "path": path}


def _merge(inputs: list[str], path: str, sources: list[str], info: Any, other: Any) -> None:
    from ..trace.merge import merge

    merge(inputs, path, sources=sources, info=info, other=other)


def _own_file(trigger: Trigger) -> bool:
    """Whether the triggering process's snapshot is readable here and names
    that process (role, rank, host and pid in its ``distributedInfo``), as
    collect finds a dead process's last file."""
    from ._collect import identity

    if trigger.file is None or not os.path.isfile(trigger.file):
        return False
    info = identity(trigger.file)
    m = trigger.by
    return info is not None and (
        info.get("role"),
        info.get("rank"),
        info.get("host"),
        info.get("pid"),
    ) == (m.role, m.rank, m.host, m.pid)


def _capture(out: list[Any], call: Any, args: dict[str, Any]) -> None:
    try:
        out.append(call(args))
    except BaseException as e:  # handed to job_snapshot
        out.append(e)


def _gap(member: Member, why: str, failed: bool) -> Gap:
    from ._collect import Gap

    return Gap(member.label, member.role, member.rank, why, failed)


def _rank_view(path: str, member: Member) -> dict[str, Any]:
    """A process's window (its snapshot's own ``flight_recorder``) and the
    innermost ranges it had open at the trigger."""
    own, opened = read_window(path)
    view: dict[str, Any] = {**member.to_json(), "process": member.label}
    for key in ("trigger_us", "start_us", "end_us", "shortened_by_cap", "details"):
        if key in own:
            view[key] = own[key]
    view["open"] = opened
    return view


def _merged_info(
    trigger: Trigger,
    base_ns: int,
    views: list[dict[str, Any]],
    gaps: list[Gap],
    suppressed: int,
) -> dict[str, Any]:
    """The merged snapshot's ``otherData.flight_recorder``."""
    trigger_us = round((trigger.ref_ns - base_ns) / 1e3, 3)
    details = next((v.get("details") for v in views if v["process"] == trigger.by.label), None)
    ranks: list[dict[str, Any]] = []
    for v in views:
        entry = {k: v[k] for k in ("process", "role", "rank", "host", "pid")}
        own = v.get("trigger_us")
        if isinstance(own, (int, float)):  # its axis onto the merged one, by the trigger
            shift = trigger_us - float(own)
            for key in ("start_us", "end_us"):
                if isinstance(v.get(key), (int, float)):
                    entry[key] = round(float(v[key]) + shift, 3)
        entry["shortened_by_cap"] = bool(v.get("shortened_by_cap"))
        head = headline(v.get("open") or [], v.get("pid"))
        entry["range"] = head["range"] if head else None
        entry["open_for_seconds"] = head["open_for_seconds"] if head else None
        entry["open"] = v.get("open") or []
        ranks.append(entry)
    info: dict[str, Any] = {
        "reason": trigger.reason,
        "job": True,
        "triggered_by": {
            "process": trigger.by.label,
            "role": trigger.by.role,
            "rank": trigger.by.rank,
        },
        "trigger_us": trigger_us,
        "trigger_wall_ns": trigger.ref_ns,
        "window_seconds": trigger.window,
        "after_seconds": trigger.after,
        "start_us": round(trigger_us - trigger.window * 1e6, 3),
        "end_us": round(trigger_us + trigger.after * 1e6, 3),
        "requested_start_us": round(trigger_us - trigger.window * 1e6, 3),
        "shortened_by_cap": any(r["shortened_by_cap"] for r in ranks),
        "suppressed_triggers": suppressed,
        "ranks": ranks,
        "missing": [g.to_json() for g in gaps],
    }
    if details is not None:
        info["details"] = details
    stuck = standing_out(ranks)
    if stuck:
        info["stuck"] = stuck
    return info
