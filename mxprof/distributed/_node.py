"""What each process of a distributed job does on the control channel.

The rank-0 worker is the hub: every other process (servers, other workers)
opens a channel to it (proving the job's secret, see ``_wire``), says
``hello`` on it, measures its clock against it, and then serves its
requests: MXNet's profiler commands (servers only), a second clock
measurement and the upload of its trace (everyone, at ``collect``).  A
role and rank belong to the channel that said hello for it: another
connection claiming it is refused while its holder may be alive, whatever
host and pid it claims.

What a peer sends that lands on the hub's disk (a deposit) is bounded:
``Job.max_trace`` bytes a process, its size declared and checked before a
byte is written, its name a plain file name, into the hub's temporary
directory only.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import _ctlserver, _native, _session, control
from .._session import SESSION
from .._tracejson import dumps as trace_json
from .._version import __version__
from ..errors import ConfigError, ProfilerError
from ..stats import dumps
from ..trace import clock as _clock
from ..trace.clock import ClockModel
from . import _flight, _wire
from ._endpoint import Endpoint, PeerGone, RemoteFailure, Transport
from ._wire import Channel

PING_SAMPLES = 16
HUB = None  # a peer's only destination
LEAVE_TIMEOUT = 2.0  # seconds a leaving process waits for the hub at most
OPEN_RETRY = 1.0  # seconds a peer waits for its open before asking again
MAX_OPENING = 256  # channels opened but not yet joined, the oldest dropped beyond
MAX_TRACE = 4 << 30  # bytes of one process's trace the hub takes (MXPROF_MAX_TRACE_BYTES)
MAX_FILES = 8  # file names kept per process (the ones it reported last)


class DistributedError(ProfilerError):
    """A distributed control call failed; the message names the process."""


class DistributedTimeout(DistributedError, TimeoutError):
    """A process did not answer in time (dead, hung, or on another token)."""


def wall_ns() -> int:
    return int(_native.clock_wall_ns())


@dataclass(frozen=True)
class Member:
    """One process of the job."""

    role: str
    rank: int
    host: str
    pid: int

    @property
    def label(self) -> str:
        return f"{self.role} {self.rank} ({self.host}, pid {self.pid})"

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "rank": self.rank, "host": self.host, "pid": self.pid}


@dataclass(frozen=True)
class Job:
    """The job's shape and this process's place in it."""

    role: str
    rank: int
    num_workers: int
    num_servers: int
    backend: str
    timeout: float
    launcher: str | None = None  # 'torchrun' or 'dmlc' where init read its variables
    local_rank: int | None = None
    max_trace: int = MAX_TRACE  # bytes of a process's trace the hub takes at most

    @property
    def world_size(self) -> int:
        return self.num_workers + self.num_servers

    @property
    def is_hub(self) -> bool:
        return self.role == "worker" and self.rank == 0

    def expected(self) -> list[tuple[str, int]]:
        """Every process but the hub, servers first."""
        servers = [("server", r) for r in range(self.num_servers)]
        return servers + [("worker", r) for r in range(1, self.num_workers)]


def trace_path() -> str:
    """Where this process's trace file is, for the hub to read if this
    process dies (it may share the disk)."""
    return os.path.abspath(SESSION.config.filename)


def file_prefix(role: str, rank: int) -> str:
    """What a process prepends to its trace file's name (MXNet's rule for servers)."""
    if role == "server":
        return f"rank{rank}_"
    return "" if rank == 0 else f"worker{rank}_"


def trace_name(name: Any) -> str:
    """name, when it is a plain file name for a trace a peer sends; else
    DistributedError (it would land outside the folder meant for it)."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or any(c in name for c in "/\\\0")
        or len(name.encode("utf-8", "replace")) > 255
    ):
        raise DistributedError(f"a trace's name must be a plain file name, got {name!r}")
    return name


def prefixed(path: str, prefix: str) -> str:
    if not prefix:
        return path
    head, tail = os.path.split(path)
    return path if tail.startswith(prefix) else os.path.join(head, prefix + tail)


class Node:
    """What hub and peers share: identity, clock model, metadata."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.me = Member(job.role, job.rank, socket.gethostname(), os.getpid())
        self.clock = _clock.IDENTITY
        self.endpoint: Endpoint
        self.relay: _flight.Relay | None = None  # job-wide flight recorder snapshots

    def start_relay(self) -> None:
        """Make this process's triggers job-wide (once its channel is up)."""
        self.relay = _flight.Relay(self)

    def info(self) -> dict[str, Any]:
        """This process's ``distributedInfo``."""
        return {
            **self.me.to_json(),
            "world_size": self.job.world_size,
            "num_workers": self.job.num_workers,
            "num_servers": self.job.num_servers,
            "backend": self.job.backend,
            "clock": self.clock.to_json(),
        } | {
            k: v
            for k, v in (("launcher", self.job.launcher), ("local_rank", self.job.local_rank))
            if v is not None
        }

    def publish(self) -> None:
        """Put distributedInfo into this process's trace metadata."""
        SESSION.set_top_json('"distributedInfo":' + trace_json(self.info()))

    def tally(self) -> dict[str, int]:
        return self.endpoint.tally.snapshot()

    def close_relay(self) -> None:
        """Stop making triggers job-wide, once the queued ones are told."""
        relay, self.relay = self.relay, None
        if relay is not None:
            relay.close()

    def close(self) -> None:
        self.close_relay()
        self.endpoint.close()


def file_piece(path: str, offset: int) -> tuple[int, bytes]:
    """The size of the file at path and its piece at offset (an upload's)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(offset)
        return size, f.read(_wire.CHUNK)


# ---- peers ----


class Peer(Node):
    """A server or a worker other than rank 0."""

    def __init__(self, job: Job, transport: Transport, secret: Callable[[], bytes | None]) -> None:
        super().__init__(job)
        self._secret = secret  # the job's secret, or None while it is not there yet
        self._reported: str | None = None  # the trace file the hub was told of last
        self._snapshot: str | None = None
        self._clock_lock = threading.Lock()
        self.hub_gone = False
        self.joined = False  # the hub accepted this process's hello
        # The trace file's size right after its last complete upload: a
        # leaving process whose file is still that size has nothing new to
        # leave with the hub.
        self._uploaded: tuple[str, int] | None = None
        # Until the secret is read, a key nobody has: nothing checks under it.
        self.endpoint = Endpoint(
            transport,
            secrets.token_bytes(32),
            self._handle,
            quick={"bye": self._hub_left},
            accept=lambda src, channel, header: channel is not None,  # the hub's only
        )

    def _hub_left(
        self, src: Any, channel: Channel | None, header: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]:
        self.hub_gone = True
        self.endpoint.fail_pending(PeerGone("the rank-0 worker has left the job"))
        return {}, b""

    def join(self) -> None:
        """open a channel, hello on it, then the first clock estimate (all
        within job.timeout)."""
        deadline = time.monotonic() + self.job.timeout
        self._open(deadline)
        try:
            self.endpoint.request(
                HUB,
                "hello",
                {**self.me.to_json(), "version": __version__, "file": trace_path()},
                max(0.0, deadline - time.monotonic()),
            )
        except TimeoutError:
            raise self._no_answer() from None
        except RemoteFailure as e:
            raise DistributedError(f"the rank-0 worker refused {self.me.label}: {e}") from None
        self.joined = True
        self._reported = trace_path()
        try:
            self.remeasure(max(0.0, deadline - time.monotonic()))
        except (TimeoutError, PeerGone) as e:
            raise DistributedTimeout(
                f"measuring the clock against the rank-0 worker: {e}"
            ) from None

    def _open(self, deadline: float) -> None:
        """The channel to the hub: the secret proved with a fresh nonce.

        Asked again after OPEN_RETRY seconds, then twice as long each time
        (a loaded hub still gets to answer), the secret read again each
        time: a hub that starts later writes a new one.
        """
        retry = OPEN_RETRY
        while True:
            secret = self._secret()
            left = deadline - time.monotonic()
            if secret is None:
                if left <= 0:
                    raise DistributedTimeout(
                        f"no secret for the job at {self.endpoint.transport.description} within "
                        f"{self.job.timeout:g} s: is its rank-0 worker running, as this user? "
                        "(across users or hosts, give every process the same token)"
                    )
                time.sleep(min(0.05, left))
                continue
            self.endpoint.key = secret
            nonce = secrets.token_bytes(_wire.NONCE)
            try:
                args, _ = self.endpoint.request(
                    HUB, _wire.HANDSHAKE, {"nonce": nonce.hex()}, max(0.0, min(left, retry))
                )
            except TimeoutError:
                if deadline - time.monotonic() <= 0:
                    raise self._no_answer() from None
                retry *= 2
                continue
            except RemoteFailure as e:
                raise DistributedError(f"the rank-0 worker refused {self.me.label}: {e}") from None
            try:
                sid = bytes.fromhex(str(args.get("channel")))
            except ValueError:
                sid = b""
            if len(sid) != _wire.CHANNEL_ID:
                raise DistributedError(f"malformed answer to open: {args!r}")
            channel = Channel(sid, _wire.channel_key(secret, sid, nonce), HUB)
            self.endpoint.add_channel(channel)
            self.endpoint.route(HUB, channel)
            return

    def _no_answer(self) -> DistributedTimeout:
        return DistributedTimeout(
            f"no answer from the rank-0 worker at {self.endpoint.transport.description} within "
            f"{self.job.timeout:g} s: is it running, and does it use the same token? "
            "(messages under another token are dropped there and counted)"
        )

    def report_file(self, path: str) -> None:
        """Tell the hub where this process's trace goes now (a set_config
        changed it), so that it finds the file should this process die."""
        path = os.path.abspath(path)
        if self.joined and not self.hub_gone and path != self._reported:
            self._reported = path
            self.endpoint.notify(HUB, "file", {"path": path})

    def abandon(self) -> None:
        """Leave after a failed join: this process never became a member,
        so it leaves no trace with the hub; a bye lets the hub forget it."""
        if self.joined and not self.hub_gone:
            self.endpoint.notify(HUB, "bye", {})
        Node.close(self)

    def remeasure(self, timeout: float) -> None:
        """A new estimate, kept after the first one.  The hub knows a peer
        from its hello on, so a collect's sync can arrive while join() is
        still measuring: one lock orders them, and neither drops the other's."""
        with self._clock_lock:
            latest = self.measure(timeout)
            self.clock = ClockModel((*self.clock.estimates[:1], latest))
            self.publish()

    def measure(self, timeout: float) -> _clock.Estimate:
        """PING_SAMPLES round trips, all of them within timeout seconds."""
        deadline = time.monotonic() + timeout
        samples = []
        for _ in range(PING_SAMPLES):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{PING_SAMPLES} clock round trips took over {timeout:g} s")
            t0 = wall_ns()
            args, _ = self.endpoint.request(HUB, "ping", {}, left)
            t3 = wall_ns()
            t1, t2 = args.get("t1"), args.get("t2")
            if not isinstance(t1, int) or not isinstance(t2, int):
                raise DistributedError(f"malformed clock answer {args!r}")
            samples.append((t0, t1, t2, t3))
        return _clock.best(samples)

    def close(self) -> None:
        # Its last triggers' notices go before its bye: the hub forgets it then.
        self.close_relay()
        # A process the hub never accepted has nothing to leave with it.
        if self.joined and not self.hub_gone:
            try:
                self._deposit()
            except Exception as e:  # leaving never raises; the hub will say it is missing
                _session.warn(f"mxprof: could not leave this process's trace with the hub: {e}")
            self.endpoint.notify(HUB, "bye", {})  # the hub stops waiting for this process
        super().close()

    def _deposit(self) -> None:
        """Before leaving: a last clock estimate, then the trace, to the hub,
        which keeps them for its collect()."""
        if SESSION.ring:
            return  # a flight recorder writes no trace: nothing to leave
        if self._uploaded is not None and self._uploaded == self._trace_size():
            return  # the hub's collect has all of it already
        timeout = min(self.job.timeout, LEAVE_TIMEOUT)
        self.remeasure(timeout)
        self._take_snapshot()
        path, self._snapshot = self._snapshot, None
        if path is None:
            return
        try:
            size, offset = os.path.getsize(path), 0
            name = os.path.basename(SESSION.config.filename)
            with open(path, "rb") as f:
                while True:
                    chunk = f.read(_wire.CHUNK)
                    eof = offset + len(chunk) >= size
                    args = {"offset": offset, "size": size, "name": name, "eof": eof}
                    self.endpoint.request(HUB, "deposit", args, timeout, chunk)
                    offset += len(chunk)
                    if eof:
                        break
        finally:
            os.unlink(path)

    def _handle(
        self, src: Any, channel: Channel | None, header: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]:
        kind, args = header["type"], header.get("args", {})
        if kind in ("set_config", "set_state", "pause", "resume", "dump"):
            if self.job.role != "server":
                raise DistributedError(f"{kind} commands go to servers; this is {self.me.label}")
            return {**self._command(kind, args), "file": trace_path()}, b""
        if kind == "sync":
            self.remeasure(self.job.timeout)
            answer: dict[str, Any] = {"clock": self.clock.to_json(), "file": trace_path()}
            if args.get("flush"):  # collect(shared=True): the file itself, written up to now
                written = self._trace_size()
                if written is not None:
                    answer["file"], answer["size"] = written
            return answer, b""
        if kind == "upload":
            return self._upload(args)
        if kind == "dumps":
            return {}, dumps(**args).encode()
        if kind == _flight.WINDOW and self.relay is not None:
            return self.relay.window(args), b""
        if kind == _flight.FETCH and self.relay is not None:
            return self.relay.piece(args)
        if kind == "ctl":  # mxprof ctl --job: run here; the reply (it may be big) in the body
            reply = _ctlserver.answer(str(args.get("cmd")), args.get("args") or {})
            return {}, json.dumps(reply, default=str).encode()
        raise DistributedError(f"unexpected request {kind!r}")

    def _command(self, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        if kind == "set_config":
            if "profile_process" in args:
                raise ConfigError("profile_process cannot be sent to a server")
            control.set_config(**args)  # validated here as well; renamed to rank<r>_...
        elif kind == "set_state":
            control.set_state(str(args.get("state")))
        elif kind == "pause":
            control.pause()
        elif kind == "resume":
            control.resume()
        else:
            control.dump(finished=bool(args.get("finished", True)))
        return {}

    def _upload(self, args: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        offset = args.get("offset")
        if not isinstance(offset, int) or offset < 0:
            raise DistributedError(f"bad upload offset {offset!r}")
        if offset == 0:
            self._take_snapshot()
        if self._snapshot is None:
            return {"size": 0, "name": "", "info": self.info(), "missing": "never ran"}, b""
        size, chunk = file_piece(self._snapshot, offset)
        name = os.path.basename(SESSION.config.filename)
        if offset + len(chunk) >= size:
            os.unlink(self._snapshot)
            self._snapshot = None
            self._uploaded = self._trace_size()
        return {"size": size, "name": name, "info": self.info()}, chunk

    def _trace_size(self) -> tuple[str, int] | None:
        """The trace file and its size, written up to now (None: no trace)."""
        path = SESSION.trace_now()
        try:
            return None if path is None else (path, os.path.getsize(path))
        except OSError:
            return None

    def _take_snapshot(self) -> None:
        """A copy of the trace as complete now, so the upload reads a fixed file."""
        if self._snapshot is not None:
            os.unlink(self._snapshot)
            self._snapshot = None
        self._snapshot = SESSION.copy_trace("mxprof-upload-")


# ---- the hub ----


@dataclass
class Known:
    member: Member
    src: Any
    channel: Channel  # the channel that said hello for it: its only voice
    # Its trace files' absolute paths, as it said them (hello, a file
    # report, an answer), the last said last; at most MAX_FILES.
    files: list[str] = field(default_factory=list)

    def note_file(self, path: Any) -> None:
        if isinstance(path, str) and 0 < len(path) <= 4096:
            self.files = [*(f for f in self.files if f != path), path][-MAX_FILES:]


@dataclass
class _Registry:
    lock: threading.Condition = field(default_factory=threading.Condition)
    by_slot: dict[tuple[str, int], Known] = field(default_factory=dict)
    # Traces left by processes that have gone: slot -> (member, file).
    deposits: dict[tuple[str, int], tuple[Member, str]] = field(default_factory=dict)
    # Processes that said goodbye, for collect to name them (and find their file).
    departed: dict[tuple[str, int], Known] = field(default_factory=dict)


@dataclass
class _Incoming:
    member: Member
    path: str
    size: int  # as declared at offset 0, within Job.max_trace
    written: int


def may_be_alive(member: Member) -> bool:
    """False only for a process of this host that no longer exists (one on
    another host cannot be checked from here: it counts as alive)."""
    if member.host != socket.gethostname():
        return True
    try:
        os.kill(member.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # not ours to signal, but there
        return True
    return True


class Hub(Node):
    """The rank-0 worker."""

    def __init__(
        self,
        job: Job,
        transport: Transport,
        secret: bytes,
        withdraw: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(job)
        self._withdraw = withdraw  # takes the secret back where it was left, at close
        self.reg = _Registry()
        self._deposit_dir: str | None = None
        self._incoming: dict[Channel, _Incoming] = {}
        self._opening: collections.deque[Channel] = collections.deque()
        self.endpoint = Endpoint(
            transport,
            secret,
            self._handle,
            quick={
                _wire.HANDSHAKE: self._open,
                "hello": self._hello,
                "ping": self._ping,
                "file": self._file,
                "bye": self._bye,
                # On the transport's thread, as bye: a process leaving right
                # after its trigger says bye next, and is still known here.
                _flight.NOTICE: self._flight_notice,
            },
            accept=self._accept,
        )

    # -- requests from peers (the transport's thread) --

    def _accept(self, src: Any, channel: Channel | None, header: dict[str, Any]) -> bool:
        """The handshake without a channel; on a new channel only hello; on
        a joined one anything but those."""
        kind: str = header["type"]
        if channel is None:
            return kind == _wire.HANDSHAKE
        if not channel.joined:
            return kind == "hello"
        return kind not in (_wire.HANDSHAKE, "hello")

    def _open(
        self, src: Any, channel: Channel | None, header: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]:
        try:
            nonce = bytes.fromhex(str(header.get("args", {}).get("nonce")))
        except ValueError:
            nonce = b""
        if len(nonce) != _wire.NONCE:
            raise DistributedError(f"open needs a nonce of {_wire.NONCE} bytes")
        sid = secrets.token_bytes(_wire.CHANNEL_ID)
        opened = Channel(sid, _wire.channel_key(self.endpoint.key, sid, nonce), src)
        with self.reg.lock:
            self._opening.append(opened)
            while len(self._opening) > MAX_OPENING:
                old = self._opening.popleft()
                if not old.joined:
                    self.endpoint.drop_channel(old)
        self.endpoint.add_channel(opened)
        return {"channel": sid.hex()}, b""

    def _ping(
        self, src: Any, channel: Channel | None, header: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]:
        t1 = wall_ns()
        return {"t1": t1, "t2": wall_ns()}, b""

    def _hello(
        self, src: Any, channel: Channel | None, header: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]:
        assert channel is not None  # _accept: hello comes on a channel
        a = header.get("args", {})
        role, rank, host, pid = a.get("role"), a.get("rank"), a.get("host"), a.get("pid")
        if (role, rank) not in self.job.expected():
            raise DistributedError(
                f"no place for {role} {rank!r} in a job of {self.job.num_workers} workers and "
                f"{self.job.num_servers} servers"
            )
        if not isinstance(host, str) or len(host) > 255 or not isinstance(pid, int):
            raise DistributedError("hello needs a host name and a pid")
        member = Member(role, rank, host, pid)
        with self.reg.lock:
            old = self.reg.by_slot.get((role, rank))
            if old is not None and old.channel is not channel:
                # The slot is the channel's that joined it: another connection
                # gets it only once the holder's process is gone (a restart).
                if old.src != src and may_be_alive(old.member):
                    raise DistributedError(
                        f"{role} {rank} is taken: {old.member.label} joined the job as "
                        f"{role} {rank} already; give each process its own rank"
                    )
                old.channel.joined = False
                self.endpoint.drop_channel(old.channel)
            known = Known(member, src, channel)
            known.note_file(a.get("file"))
            self.reg.by_slot[(role, rank)] = known
            self.reg.departed.pop((role, rank), None)
            channel.joined = True
            self.endpoint.route(src, channel)
            self.reg.lock.notify_all()
        return {"hub": self.me.to_json()}, b""

    def _known(self, channel: Channel | None) -> Known | None:
        """The member that channel speaks for (None: none)."""
        with self.reg.lock:
            return next((k for k in self.reg.by_slot.values() if k.channel is channel), None)

    def _file(
        self, src: Any, channel: Channel | None, header: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]:
        known = self._known(channel)
        if known is not None:
            with self.reg.lock:
                known.note_file(header.get("args", {}).get("path"))
        return {}, b""

    def _flight_notice(
        self, src: Any, channel: Channel | None, header: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]:
        known = self._known(channel)
        if known is not None and self.relay is not None:
            self.relay.requested(known.member, header.get("args", {}))  # only queued
        return {}, b""

    def _bye(
        self, src: Any, channel: Channel | None, header: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]:
        with self.reg.lock:
            for slot, known in list(self.reg.by_slot.items()):
                if known.channel is channel:
                    self.reg.departed[slot] = self.reg.by_slot.pop(slot)
        if channel is not None:
            channel.joined = False
            self.endpoint.drop_channel(channel)
        return {}, b""

    def _handle(
        self, src: Any, channel: Channel | None, header: dict[str, Any], body: bytes
    ) -> tuple[dict[str, Any], bytes]:
        if header["type"] == "deposit":
            self._take_deposit(channel, header.get("args", {}), body)
            return {}, b""
        raise DistributedError(f"the rank-0 worker takes no {header['type']!r} requests")

    def _take_deposit(self, channel: Channel | None, args: dict[str, Any], body: bytes) -> None:
        """One piece of a leaving process's trace (the executor thread).

        A process's deposit replaces its earlier one, its declared size is
        within Job.max_trace and is checked before anything is written, and
        it lands in this process's temporary directory under a plain name.
        """
        offset, size, name, eof = (args.get(k) for k in ("offset", "size", "name", "eof"))
        if not (
            isinstance(offset, int)
            and isinstance(size, int)
            and not isinstance(offset, bool)
            and not isinstance(size, bool)
            and isinstance(eof, bool)
        ):
            raise DistributedError("malformed deposit")
        known = self._known(channel)
        if known is None or channel is None:
            raise DistributedError("a deposit from a process that is not in the job")
        member = known.member
        limit = self.job.max_trace
        if not 0 <= size <= limit:
            raise DistributedError(
                f"a deposit of {size} bytes from {member.label}: a process's trace may have "
                f"{limit} bytes at most (MXPROF_MAX_TRACE_BYTES)"
            )
        slot = (member.role, member.rank)
        if offset + len(body) > size or (eof and offset + len(body) != size):
            self._incoming.pop(channel, None)
            raise DistributedError(
                f"a deposit piece from {member.label} at {offset} does not fit its size {size}"
            )
        incoming = self._incoming.get(channel)
        if offset == 0:
            name = trace_name(name)
            if self._deposit_dir is None:
                self._deposit_dir = tempfile.mkdtemp(prefix="mxprof-deposits-")
            folder = os.path.join(self._deposit_dir, f"{member.role}{member.rank}")
            with self.reg.lock:  # its earlier deposit goes: one a process, on disk
                self.reg.deposits.pop(slot, None)
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            path = os.path.join(folder, name)
            incoming = self._incoming[channel] = _Incoming(member, path, size, 0)
            open(path, "xb").close()
        if incoming is None or incoming.written != offset or incoming.size != size:
            self._incoming.pop(channel, None)
            raise DistributedError(f"deposit from {member.label} out of order at {offset}")
        with open(incoming.path, "ab") as f:
            f.write(body)
        incoming.written += len(body)
        if eof:
            del self._incoming[channel]
            with self.reg.lock:
                self.reg.deposits[slot] = (member, incoming.path)
                self.reg.lock.notify_all()

    def arriving(self, slot: tuple[str, int]) -> bool:
        """Whether slot's process is in the middle of leaving its trace."""
        return any((i.member.role, i.member.rank) == slot for i in list(self._incoming.values()))

    def close(self) -> None:
        with self.reg.lock:
            srcs = [k.src for k in self.reg.by_slot.values()]
        for src in srcs:  # whoever still waits on the hub stops waiting
            self.endpoint.notify(src, "bye", {})
        super().close()
        if self._withdraw is not None:
            self._withdraw()
        if self._deposit_dir is not None:
            shutil.rmtree(self._deposit_dir, ignore_errors=True)

    # -- the API side --

    def members(self) -> list[Member]:
        with self.reg.lock:
            return [k.member for k in self.reg.by_slot.values()]

    def present(
        self, slots: list[tuple[str, int]], timeout: float, gone_ok: bool = False
    ) -> tuple[dict[tuple[str, int], Known], list[tuple[str, int]]]:
        """The connected processes of slots, waiting for them up to timeout,
        and the slots still missing then; with gone_ok, one that has left its
        trace and gone is not waited for."""
        deadline = time.monotonic() + timeout
        with self.reg.lock:
            while True:
                missing = [
                    s
                    for s in slots
                    if s not in self.reg.by_slot and not (gone_ok and s in self.reg.deposits)
                ]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    break
                self.reg.lock.wait(left)
            found = {s: self.reg.by_slot[s] for s in slots if s in self.reg.by_slot}
        return found, missing

    def wait_for(
        self, slots: list[tuple[str, int]], timeout: float
    ) -> dict[tuple[str, int], Known]:
        """The connected processes of slots, or DistributedTimeout naming who did not come."""
        found, missing = self.present(slots, timeout)
        if missing:
            names = ", ".join(f"{r} {n}" for r, n in missing)
            raise DistributedTimeout(
                f"not connected within {timeout:g} s: {names} (not started, dead, or on "
                "another token or address)"
            )
        return found

    def ask(self, slots: list[tuple[str, int]], kind: str, args: dict[str, Any]) -> dict[Any, Any]:
        """kind to every slot; their answers, or DistributedError naming who failed."""
        found = self.wait_for(slots, self.job.timeout)
        by_src = {k.src: k.member for k in found.values()}
        results = self.endpoint.request_many(list(by_src), kind, args, self.job.timeout)
        self.note_files(found.values(), results)
        failures = []
        for src, result in results.items():
            m = by_src[src]
            if isinstance(result, TimeoutError):
                failures.append(f"{m.label}: no answer within {self.job.timeout:g} s")
            elif isinstance(result, PeerGone):
                failures.append(f"{m.label}: gone ({result})")
            elif isinstance(result, RemoteFailure):
                failures.append(f"{m.label}: {result.error}: {result.message}")
        if failures:
            # A process that answered with an error is an error; one that is
            # dead or silent is a timeout.
            refused = any(isinstance(r, RemoteFailure) for r in results.values())
            cls = DistributedError if refused else DistributedTimeout
            raise cls(f"{kind} failed on " + "; ".join(failures))
        return {by_src[src]: result for src, result in results.items()}

    def note_files(self, known: Any, results: dict[Any, Any]) -> None:
        """Keep where each answering process says its trace file is."""
        with self.reg.lock:
            for k in known:
                result = results.get(k.src)
                if isinstance(result, tuple):
                    k.note_file(result[0].get("file"))

    def statistics(self, args: dict[str, Any]) -> dict[str, str]:
        """Every process's dumps(**args), by process label, this one first."""
        texts = {self.me.label: dumps(**args)}  # checks the arguments before sending them
        slots = self.job.expected()
        for member, (_, body) in self.ask(slots, "dumps", args).items():
            texts[member.label] = body.decode("utf-8", "replace")
        return texts

    def ctl_all(self, cmd: str, args: dict[str, Any], timeout: float) -> dict[str, Any]:
        """``mxprof ctl --job``: cmd run by every process connected now (no
        wait for others), each one's ctl reply by its label; one that fails,
        is gone or stays silent for timeout seconds gets an error reply, and
        so does every expected process that is not connected."""
        found, missing = self.present(self.job.expected(), 0.0)
        by_src = {k.src: k.member for k in found.values()}
        request = {"cmd": cmd, "args": args}
        results = self.endpoint.request_many(list(by_src), "ctl", request, timeout)
        out: dict[str, Any] = {}
        for src, result in results.items():
            reply: Any = {"ok": False, "error": str(result) or type(result).__name__}
            if isinstance(result, RemoteFailure):
                reply = {"ok": False, "error": f"{result.error}: {result.message}"}
            elif isinstance(result, tuple):
                try:
                    reply = json.loads(result[1])
                except ValueError:
                    reply = None
                if not isinstance(reply, dict):
                    reply = {"ok": False, "error": "its reply is not a JSON object"}
            out[by_src[src].label] = reply
        for role, rank in missing:
            out[f"{role} {rank}"] = {"ok": False, "error": "not connected to the rank-0 worker"}
        return out

    def command(self, call: str, args: dict[str, Any]) -> None:
        """A profile_process='server' call, applied by every server."""
        servers = [("server", r) for r in range(self.job.num_servers)]
        if not servers:
            raise DistributedError(f"{call}(profile_process='server'): this job has no servers")
        self.ask(servers, call, args)


def install_remote(hub: Hub | None, refusal: str | None) -> None:
    SESSION.set_remote(hub.command if hub is not None else None, refusal)
