"""One end of the control channel, over any transport.

A transport moves frames between processes and calls ``deliver(src,
frames)`` on its own thread for every message that arrives; ``src`` is
whatever it needs to send an answer back.  The endpoint checks each
message (``_wire.decode``), matches answers to waiting requests, answers
the quick requests (``ping``, ``hello``) at once on the transport's thread,
and runs the others (commands, uploads) one at a time on an executor
thread, so a long command never delays a clock ping.
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
from ._wire import Header

Handler = Callable[[Any, Header, bytes], "tuple[dict[str, Any], bytes]"]


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
    __slots__ = ("event", "header", "body", "error")

    def __init__(self) -> None:
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
        accept: Callable[[Any, Header], bool] | None = None,
    ) -> None:
        self.transport = transport
        self.key = key
        self.tally = _wire.Tally()
        self._handle = handle
        self._quick = quick or {}
        self._accept = accept
        self._ids = itertools.count(1)
        self._pending: dict[int, _Wait] = {}
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[Any, Header, bytes] | None] = queue.Queue()
        self._executor = own_thread(  # not the program's: never sampled
            threading.Thread(target=self._run, name="mxprof-dist-exec", daemon=True)
        )
        self._executor.start()
        transport.start(self.deliver)

    # ---- receiving (the transport's thread) ----

    def deliver(self, src: Any, frames: list[bytes]) -> None:
        try:
            header, body = _wire.decode(self.key, frames)
        except _wire.Rejected as e:
            self.tally.add(e.reason)
            return
        self.tally.add("received")
        if header["type"] in _wire.ANSWERS:
            with self._lock:
                wait = self._pending.pop(header["re"], None)
            if wait is not None:
                wait.header, wait.body = header, body
                wait.event.set()
            return
        if self._accept is not None and not self._accept(src, header):
            self.tally.add("unknown_peer")
            return
        quick = self._quick.get(header["type"])
        if quick is not None:
            self._answer(src, header, quick)
        else:
            self._jobs.put((src, header, body))

    def _answer(self, src: Any, header: Header, fn: Handler, body: bytes = b"") -> None:
        try:
            args, out = fn(src, header, body)
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
            self.send(src, reply, out)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            src, header, body = job
            self._answer(src, header, self._handle, body)

    # ---- sending ----

    def send(self, dest: Any, header: Header, body: bytes = b"") -> None:
        self.transport.send(dest, _wire.encode(self.key, header, body))
        self.tally.add("sent")

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
            wait = _Wait()
            with self._lock:
                self._pending[rid] = wait
            try:
                self.send(dest, {"type": kind, "id": rid, "args": args}, body)
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
