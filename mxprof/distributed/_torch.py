"""torch.distributed transport: mailboxes in the process group's store.

A job that already runs torch.distributed has a rendezvous store (a
TCPStore behind the default process group) that every rank reaches.  Each
rank gets a mailbox there, a store queue, and the control channel's
messages go through them.  No collective or point-to-point operation is
issued, so the channel can never interleave with the job's own
communication or stall it (a trace upload is just store traffic).  The
job's secret is left in the store too (``publish_secret``), unless the
user gave a token.

The receiving thread polls its mailbox (a blocking pop would log a c10d
warning at every timeout): every millisecond while messages flow, backing
off to every 50 ms when idle.
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any, Callable

from .._sampler import own_thread
from ..errors import ConfigError, StateError
from ._secret import store_key

_MAGIC = b"MXQ1"
_HEAD = struct.Struct(">4sIB")  # magic, source rank, frame count
_LEN = struct.Struct(">Q")
FAST_POLL = 0.001
SLOW_POLL = 0.05
IDLE_AFTER = 1.0  # seconds without a message before polling slows down


def _box(rank: int) -> str:
    return f"mxprof/box/{rank}"


def pack(src: int, frames: list[bytes]) -> bytes:
    parts = [_HEAD.pack(_MAGIC, src, len(frames))]
    for f in frames:
        parts += [_LEN.pack(len(f)), f]
    return b"".join(parts)


def unpack(data: bytes) -> tuple[int, list[bytes]]:
    """(source rank, frames); ([] frames when malformed: decode drops and counts it)."""
    if len(data) < _HEAD.size:
        return -1, []
    magic, src, n = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        return -1, []
    pos, frames = _HEAD.size, []
    for _ in range(n):
        if pos + _LEN.size > len(data):
            return -1, []
        (size,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        if pos + size > len(data):
            return -1, []
        frames.append(data[pos : pos + size])
        pos += size
    return (src, frames) if pos == len(data) else (-1, [])


class StoreTransport:
    """Mailboxes in the default process group's store; dest is a torch rank."""

    def __init__(self, hub: bool) -> None:
        try:
            import torch.distributed as dist
        except ImportError as e:
            raise ImportError(
                "backend='torch' needs PyTorch (pip install torch), with a process group "
                "initialised by torch.distributed.init_process_group"
            ) from e
        if not dist.is_available() or not dist.is_initialized():
            raise StateError(
                "backend='torch' needs an initialised process group: call "
                "torch.distributed.init_process_group first"
            )
        self.rank = dist.get_rank()
        self._hub = hub
        if hub != (self.rank == 0):
            raise ConfigError(
                "with backend='torch' the rank-0 worker must be torch.distributed rank 0 "
                f"(this process is torch rank {self.rank})"
            )
        store: Any = dist.distributed_c10d._get_default_store()
        # One client per thread: a store client serves one request at a time.
        self._out = store.clone()
        self._in = store.clone()
        self._out_lock = threading.Lock()
        self.description = f"torch.distributed store (rank {self.rank} of {dist.get_world_size()})"
        self._closing = False
        self._thread: threading.Thread | None = None

    def start(self, deliver: Callable[[Any, list[bytes]], None]) -> None:
        self._deliver = deliver
        self._thread = own_thread(
            threading.Thread(target=self._loop, name="mxprof-dist-io", daemon=True)
        )
        self._thread.start()

    def publish_secret(self, secret: bytes) -> None:
        """Leave the job's secret in the store (the rank-0 worker)."""
        with self._out_lock:
            self._out.set(store_key(), secret.hex())

    def read_secret(self) -> bytes | None:
        """The job's secret from the store; None: not there yet."""
        with self._out_lock:
            if not self._out.check([store_key()]):
                return None
            return bytes.fromhex(bytes(self._out.get(store_key())).decode())

    def send(self, dest: Any, frames: list[bytes]) -> None:
        target = 0 if dest is None else int(dest)
        with self._out_lock:
            self._out.queue_push(_box(target), pack(self.rank, frames))

    def _loop(self) -> None:
        box = _box(self.rank)
        last = 0.0
        while not self._closing:
            try:
                waiting = self._in.queue_len(box)
            except Exception:  # the store is gone (the job is ending)
                return
            if not waiting:
                idle = time.monotonic() - last > IDLE_AFTER
                time.sleep(SLOW_POLL if idle else FAST_POLL)
                continue
            last = time.monotonic()
            for _ in range(waiting):
                try:
                    data = self._in.queue_pop(box, False)
                except Exception:
                    return
                rank, frames = unpack(bytes(data))
                # A peer hears the hub only, as with ZeroMQ, where HUB is None.
                src = rank if self._hub else (None if rank == 0 else -1)
                try:
                    self._deliver(src, frames)
                except Exception:  # deliver counts and drops on its own
                    continue

    def close(self) -> None:
        self._closing = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)
