"""ZeroMQ transport (pyzmq): a ROUTER at the rank-0 worker, a DEALER elsewhere.

The same shape as ps-lite's ZeroMQ van.  Every socket is used by one thread
only, the transport's own: other threads hand it frames through a queue and
an inproc wake-up socket, and wait for the send to be done so that an
unreachable peer (ROUTER_MANDATORY's EHOSTUNREACH) is reported to them.

A DEALER's identity is random, so that no other process can guess it and
stand in for it once it leaves; an ipc endpoint's socket file is made
readable and writable by this user only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import secrets
import threading
from typing import Any, Callable

from .._sampler import own_thread
from ._endpoint import PeerGone
from ._wire import MAX_BODY, MAX_HEADER

_ids = itertools.count()


def load_zmq() -> Any:
    """pyzmq, or an ImportError that says how to install it."""
    try:
        import zmq
    except ImportError as e:
        raise ImportError(
            'mxprof.distributed\'s ZeroMQ transport needs pyzmq: pip install "mxprof[dist]" '
            "(or use init(backend='torch') in a torch.distributed job)"
        ) from e
    return zmq


class _Send:
    __slots__ = ("dest", "frames", "done", "error")

    def __init__(self, dest: Any, frames: list[bytes]) -> None:
        self.dest = dest
        self.frames = frames
        self.done = threading.Event()
        self.error: BaseException | None = None


class ZmqTransport:
    """A ROUTER bound at address (hub=True) or a DEALER connected to it."""

    def __init__(self, address: str, hub: bool) -> None:
        zmq = load_zmq()
        self._zmq = zmq
        self._hub = hub
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER if hub else zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # A hard cap far above any valid message; the precise limits are
        # checked (and violations counted) when decoding.
        sock.setsockopt(zmq.MAXMSGSIZE, 4 * (MAX_HEADER + MAX_BODY))
        if hub:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            try:
                sock.bind(address)
            except zmq.ZMQError as e:
                sock.close()
                self._ctx.term()
                raise OSError(e.errno, f"cannot listen on {address}: {e}") from None
            self.address = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
            if self.address.startswith("ipc://"):
                # Connecting to an ipc socket needs write permission on it.
                os.chmod(self.address[len("ipc://") :], 0o600)
        else:
            sock.setsockopt(zmq.IDENTITY, b"mxp-" + secrets.token_hex(12).encode())
            sock.connect(address)
            self.address = address
        self.description = f"ZeroMQ {'ROUTER' if hub else 'DEALER'} {self.address}"
        self._sock = sock
        wake = f"inproc://mxprof-wake-{next(_ids)}"
        self._wake_in = self._ctx.socket(zmq.PAIR)
        self._wake_in.bind(wake)
        self._wake_out = self._ctx.socket(zmq.PAIR)
        self._wake_out.connect(wake)
        self._wake_lock = threading.Lock()
        self._outbox: queue.Queue[_Send] = queue.Queue()
        self._closing = False
        self._thread: threading.Thread | None = None

    def start(self, deliver: Callable[[Any, list[bytes]], None]) -> None:
        self._deliver = deliver
        self._thread = own_thread(
            threading.Thread(target=self._loop, name="mxprof-dist-io", daemon=True)
        )
        self._thread.start()

    def send(self, dest: Any, frames: list[bytes]) -> None:
        item = _Send(dest, frames)
        if threading.current_thread() is self._thread:
            self._send_now(item)
        else:
            if self._closing:
                raise PeerGone("the control channel is closed")
            self._outbox.put(item)
            self._wake()
            if not item.done.wait(10.0):
                raise PeerGone("the control channel's thread did not send (stuck or closed)")
        if item.error is not None:
            raise item.error

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_out.closed:
                return
            with contextlib.suppress(self._zmq.ZMQError):  # a wake-up is pending already
                self._wake_out.send(b"", self._zmq.NOBLOCK)

    def _send_now(self, item: _Send) -> None:
        zmq = self._zmq
        frames = ([item.dest] if self._hub else []) + item.frames
        try:
            self._sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                item.error = PeerGone("not connected (its process has exited or lost the link)")
            else:
                item.error = PeerGone(f"cannot send: {e}")
        item.done.set()

    def _loop(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        while not self._closing:
            ready = dict(poller.poll(200))
            if self._wake_in in ready:
                while True:
                    try:
                        self._wake_in.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
            while True:
                try:
                    item = self._outbox.get_nowait()
                except queue.Empty:
                    break
                self._send_now(item)
            if self._sock in ready:
                self._receive_all()
        self._shutdown()

    def _receive_all(self) -> None:
        zmq = self._zmq
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if self._hub:
                src, frames = frames[0], frames[1:]
            else:
                src = None
            with contextlib.suppress(Exception):  # deliver counts and drops on its own
                self._deliver(src, frames)

    def _shutdown(self) -> None:
        while True:  # anyone still waiting to send learns the channel is gone
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                break
            item.error = PeerGone("the control channel is closed")
            item.done.set()
        self._sock.close(300)  # the last words (bye) get out
        self._wake_in.close(0)
        with self._wake_lock:
            self._wake_out.close(0)
        self._ctx.term()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._thread is None:  # never started: nobody else owns the sockets
            self._shutdown()
            return
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
