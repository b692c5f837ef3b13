"""GPU ranges: events on their streams, anchors to the host clock, pending resolution.

See the ``Timing`` paragraph of :mod:`mxprof.cuda`: a range's events are read
late and without blocking, and reach the host clock through a per-device
anchor.  :class:`Timing` is one backend's share of this; the tasks that use
it are in :mod:`mxprof.cuda._ranges`.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _native, _session
from ..errors import ProfilerError

if TYPE_CHECKING:
    from ._runtime import Backend

ANCHOR_PERIOD_NS = 1_000_000_000
MAX_PENDING = 1024  # GPU ranges awaiting their events; beyond, the host waits for them

_tracks: dict[tuple[int, int], int] = {}  # (device, stream) -> the core's track tid; never freed
_tracks_lock = threading.Lock()
_STREAM_NAMES = {0: "0", 1: "legacy", 2: "per-thread"}


def _track(device: int, stream: int) -> int:
    tid = _tracks.get((device, stream))
    if tid is None:
        with _tracks_lock:
            tid = _tracks.get((device, stream))
            if tid is None:
                label = _STREAM_NAMES.get(stream) or f"{stream:#x}"
                tid = _tracks[(device, stream)] = _native.new_track(f"GPU {device} stream {label}")
    return tid


class _Anchor:
    """A completed event on a device and the host time it completed at."""

    __slots__ = ("event", "host_ns", "users")

    def __init__(self, event: Any, host_ns: int) -> None:
        self.event = event
        self.host_ns = host_ns
        self.users = 0  # GPU ranges timed from it and not yet resolved


class _Device:
    __slots__ = ("stream", "anchor", "spare")

    def __init__(self, stream: int) -> None:
        self.stream = stream  # private, non-blocking: anchors never wait on user work
        self.anchor: _Anchor | None = None
        self.spare: list[Any] = []  # events to reuse


class Span(NamedTuple):
    """One GPU range: its object and track, and the events that time it."""

    gpu_id: int
    tid: int
    stream: int
    device: _Device
    anchor: _Anchor
    start: Any
    end: Any  # taken with start, so that both belong to the start's device


class Timing:
    """The GPU ranges of one backend: devices, anchors, ranges awaiting their events."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.lock = threading.Lock()
        self.devices: dict[int, _Device] = {}
        self.pending: list[Span] = []
        self.alive = True
        self.lost = 0  # GPU ranges not recorded because a CUDA call failed
        self._warned: set[str] = set()

    def _take(self, dev: _Device) -> Any:
        return dev.spare.pop() if dev.spare else self.backend.event_create()

    def _give(self, dev: _Device, event: Any) -> None:
        if len(dev.spare) < 2 * MAX_PENDING:
            dev.spare.append(event)
            return
        with contextlib.suppress(ProfilerError):  # a handle lost is better than a range lost
            self.backend.event_destroy(event)

    def _anchor(self, dev: _Device) -> _Anchor:
        event = self._take(dev)
        self.backend.event_record(event, dev.stream)
        self.backend.event_wait(event)
        anchor = _Anchor(event, _native.clock_ns())
        old, dev.anchor = dev.anchor, anchor
        if old is not None and old.users == 0:
            self._give(dev, old.event)
        return anchor

    def _release(self, span: Span) -> None:
        # Caller holds the lock.
        dev, anchor = span.device, span.anchor
        anchor.users -= 1
        if anchor.users == 0 and anchor is not dev.anchor:
            self._give(dev, anchor.event)
        self._give(dev, span.start)
        self._give(dev, span.end)

    def _fail(self, e: ProfilerError) -> None:
        self.lost += 1
        key = getattr(e, "error", type(e).__name__)
        if key not in self._warned:
            self._warned.add(key)
            _session.warn(f"mxprof.cuda: a GPU range was not recorded: {e}")

    def begin(self, gpu_id: int, stream: int) -> Span | None:
        """Record a range's start event on stream (which is the current device's)."""
        if not self.alive:
            return None
        backend = self.backend
        try:
            ordinal = backend.current_device()
            tid = _track(ordinal, stream)
            with self.lock:
                dev = self.devices.get(ordinal)
                if dev is None:
                    dev = self.devices[ordinal] = _Device(backend.stream_create())
                anchor = dev.anchor
                if anchor is None or _native.clock_ns() - anchor.host_ns > ANCHOR_PERIOD_NS:
                    anchor = self._anchor(dev)
                span = Span(gpu_id, tid, stream, dev, anchor, self._take(dev), self._take(dev))
                anchor.users += 1
        except ProfilerError as e:
            self._fail(e)
            return None
        try:
            backend.event_record(span.start, stream)
        except ProfilerError as e:
            self._drop(span, e)
            return None
        return span

    def end(self, span: Span) -> None:
        """Record the end event; the range waits in pending until it completes."""
        try:
            self.backend.event_record(span.end, span.stream)
        except ProfilerError as e:
            self._drop(span, e)
            return
        with self.lock:
            self.pending.append(span)
            full = len(self.pending) >= MAX_PENDING
        if full:
            self.resolve(wait=False)
            if len(self.pending) >= MAX_PENDING:
                self.resolve(wait=True)

    def _drop(self, span: Span, e: ProfilerError) -> None:
        with self.lock:
            self._release(span)
        self._fail(e)

    def resolve(self, wait: bool) -> None:
        """Put completed ranges into the core; wait for them all when wait is set."""
        with self.lock:
            batch, self.pending = self.pending, []
        backend = self.backend
        waiting: list[Span] = []
        for p in batch:
            try:
                if wait:
                    backend.event_wait(p.end)
                elif not backend.event_done(p.end):
                    waiting.append(p)
                    continue
                offset_ms = backend.elapsed_ms(p.anchor.event, p.start)
                dur_ms = backend.elapsed_ms(p.start, p.end)
            except ProfilerError as e:
                self._fail(e)
            else:
                start_ns = p.anchor.host_ns + round(offset_ms * 1e6)
                _native.range_add(p.gpu_id, p.tid, start_ns, max(0, round(dur_ms * 1e6)))
            with self.lock:
                self._release(p)
        if waiting:
            with self.lock:
                self.pending[:0] = waiting
