"""One end of the control channel, over any transport.

A transport moves frames between processes and calls ``deliver(src,
frames)`` on its own thread for every message that arrives; ``src`` is
whatever it needs to send an answer back.  The endpoint checks each
message (on its channel, or under the job's secret for the handshake: see
``_wire``), matches answers to waiting requests, answers the quick
requests (``open``, ``hello``, ``ping``) at once on the transport's
thread, and runs the others (commands, uploads) one at a time on an
executor thread, so a long command never delays a clock ping.

Channels: ``add_channel`` makes one known (a message naming it is checked
with its key, and only when it comes from the connection it is bound to);
``route`` says which channel requests to a destination go on.  An answer
goes back on the channel its request came on.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from typing import Any, Callable, Protocol

from .._sampler import own_thread
from . import _wire
from ._wire import Channel, Header

# handler(src, channel, header, body) -> (answer args, answer body); the
# channel is None for the handshake.
Handler = Callable[[Any, "Channel | None", Header, bytes], "tuple[dict[str, Any], bytes]"]


class PeerGone(Exception):
    """The transport knows the destination is not connected."""


class RemoteFailure(Exception):
    """The other end answered with an error."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message


class Transport(Protocol):
    description: str

    def start(self, deliver: Callable[[Any, list[bytes]], None]) -> None: ...

    def send(self, dest: Any, frames: list[bytes]) -> None: ...

    def close(self) -> None: ...


class _Wait:
    __slots__ = ("sid", "event", "header", "body", "error")

    def __init__(self, sid: bytes) -> None:
        self.sid = sid  # the channel the request went on: its answer must come there
        self.event = threading.Event()
        self.header: Header = {}
        self.body = b""
        self.error: BaseException | None = None


class Endpoint:
    """Requests with answers, and dispatch of what arrives."""

    def __init__(
        self,
        transport: Transport,
        key: bytes,
        handle: Handler,
        quick: dict[str, Handler] | None = None,
        accept: Callable[[Any, Channel | None, Header], bool] | None = None,
    ) -> None:
        self.transport = transport
        self.key = key  # the job's secret: the handshake's key
        self.tally = _wire.Tally()
        self._handle = handle
        self._quick = quick or {}
        self._accept = accept
        self._ids = itertools.count(1)
        self._pending: dict[int, _Wait] = {}
        self._lock = threading.Lock()
        self._channels: dict[bytes, Channel] = {}
        self._routes: dict[Any, Channel] = {}
        self._jobs: queue.Queue[tuple[Any, Channel | None, Header, bytes] | None] = queue.Queue()
        self._executor = own_thread(  # not the program's: never sampled
            threading.Thread(target=self._run, name="mxprof-dist-exec", daemon=True)
        )
        self._executor.start()
        transport.start(self.deliver)

    # ---- receiving (the transport's thread) ----

    def deliver(self, src: Any, frames: list[bytes]) -> None:
        try:
            sid = _wire.channel_of(frames)
            if sid:
                with self._lock:
                    channel = self._channels.get(sid)
                if channel is None or channel.src != src:
                    raise _wire.Rejected("unknown_peer", "no such channel on this connection")
                header, body = channel.unseal(frames)
            else:
                channel = None
                header, body = _wire.decode(self.key, frames)
                if header["type"] not in _wire.ANSWERS and header["type"] != _wire.HANDSHAKE:
                    raise _wire.Rejected("unknown_peer", f"{header['type']!r} without a channel")
        except _wire.Rejected as e:
            self.tally.add(e.reason)
            return
        self.tally.add("received")
        if header["type"] in _wire.ANSWERS:
            with self._lock:
                wait = self._pending.get(header["re"])
                if wait is not None and wait.sid == sid:
                    del self._pending[header["re"]]
                else:
                    wait = None
            if wait is not None:
                wait.header, wait.body = header, body
                wait.event.set()
            return
        if self._accept is not None and not self._accept(src, channel, header):
            self.tally.add("unknown_peer")
            return
        quick = self._quick.get(header["type"])
        if quick is not None:
            self._answer(src, channel, header, quick)
        else:
            self._jobs.put((src, channel, header, body))

    def _answer(
        self, src: Any, channel: Channel | None, header: Header, fn: Handler, body: bytes = b""
    ) -> None:
        try:
            args, out = fn(src, channel, header, body)
            reply: Header = {"type": "ok", "re": header["id"], "args": args}
        except Exception as e:  # the error goes back to the requester, named
            reply, out = (
                {
                    "type": "error",
                    "re": header["id"],
                    "args": {"error": type(e).__name__, "message": str(e)},
                },
                b"",
            )
        with contextlib.suppress(PeerGone):  # it asked and left
            self._send(src, channel, reply, out)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            src, channel, header, body = job
            self._answer(src, channel, header, self._handle, body)

    # ---- channels ----

    def add_channel(self, channel: Channel) -> None:
        """Take messages on channel (from channel.src only)."""
        with self._lock:
            self._channels[channel.sid] = channel

    def drop_channel(self, channel: Channel) -> None:
        """Take nothing more on channel, nor send on it."""
        with self._lock:
            self._channels.pop(channel.sid, None)
            if self._routes.get(channel.src) is channel:
                del self._routes[channel.src]

    def route(self, dest: Any, channel: Channel) -> None:
        """Send requests to dest on channel."""
        with self._lock:
            self._routes[dest] = channel

    def channels(self) -> list[Channel]:
        with self._lock:
            return list(self._channels.values())

    # ---- sending ----

    def _send(self, dest: Any, channel: Channel | None, header: Header, body: bytes) -> None:
        if channel is None:
            if header["type"] not in _wire.ANSWERS and header["type"] != _wire.HANDSHAKE:
                raise PeerGone("no channel to it (it never joined, or has left)")
            frames = _wire.encode(self.key, b"", header, body)
        else:
            frames = channel.seal(header, body)
        self.transport.send(dest, frames)
        self.tally.add("sent")

    def send(self, dest: Any, header: Header, body: bytes = b"") -> None:
        """header and body to dest, on its route (without one: the handshake)."""
        with self._lock:
            channel = self._routes.get(dest)
        self._send(dest, channel, header, body)

    def request(
        self, dest: Any, kind: str, args: dict[str, Any], timeout: float, body: bytes = b""
    ) -> tuple[dict[str, Any], bytes]:
        """Send a request and wait for its answer.

        Raises:
            TimeoutError: no answer within timeout seconds.
            PeerGone: the transport knows dest is gone.
            RemoteFailure: the other end raised; its error and message.
        """
        (result,) = self.request_many([dest], kind, args, timeout, body).values()
        if isinstance(result, BaseException):
            raise result
        answer: tuple[dict[str, Any], bytes] = result
        return answer

    def request_many(
        self, dests: list[Any], kind: str, args: dict[str, Any], timeout: float, body: bytes = b""
    ) -> dict[Any, Any]:
        """The same request to every dest at once; per dest its (args, body)
        or the exception that stands for its failure."""
        waits: dict[Any, tuple[int, _Wait]] = {}
        out: dict[Any, Any] = {}
        for dest in dests:
            rid = next(self._ids)
            with self._lock:
                channel = self._routes.get(dest)
                wait = self._pending[rid] = _Wait(b"" if channel is None else channel.sid)
            try:
                self._send(dest, channel, {"type": kind, "id": rid, "args": args}, body)
            except PeerGone as e:
                with self._lock:
                    self._pending.pop(rid, None)
                out[dest] = e
                continue
            waits[dest] = (rid, wait)
        deadline = time.monotonic() + timeout
        for dest, (rid, wait) in waits.items():
            if not wait.event.wait(max(0.0, deadline - time.monotonic())):
                with self._lock:
                    self._pending.pop(rid, None)
                out[dest] = TimeoutError(f"no answer within {timeout:g} s")
            elif wait.error is not None:
                out[dest] = wait.error
            elif wait.header["type"] == "error":
                a = wait.header.get("args", {})
                out[dest] = RemoteFailure(str(a.get("error", "Error")), str(a.get("message", "")))
            else:
                out[dest] = (wait.header.get("args", {}), wait.body)
        return out

    def fail_pending(self, error: BaseException) -> None:
        """Wake every waiting request with error (the other end has left)."""
        with self._lock:
            waits = list(self._pending.values())
            self._pending.clear()
        for wait in waits:
            wait.error = error
            wait.event.set()

    def notify(self, dest: Any, kind: str, args: dict[str, Any]) -> None:
        """A request whose answer nobody waits for."""
        with contextlib.suppress(PeerGone):
            self.send(dest, {"type": kind, "id": next(self._ids), "args": args})

    def close(self) -> None:
        self._jobs.put(None)
        self.transport.close()
