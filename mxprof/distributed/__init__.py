"""Distributed profiling: one profile for a job of workers and servers.

Every process calls :func:`init` with its role and rank (or sets the
``MXPROF_*`` environment variables, or runs under torchrun or MXNet's
launcher, and calls ``init()``).  The rank-0
worker then drives MXNet's server calls (``set_config``, ``set_state``,
``pause``, ``resume``, ``dump`` with ``profile_process='server'``), which
return once every server has applied them, and :func:`collect` gathers
every process's trace into one timeline, each process's clock corrected to
the rank-0 worker's.  A process that never calls ``init`` is untouched.

Transport: ZeroMQ (pyzmq, ``pip install "mxprof[dist]"``), a ROUTER on the
rank-0 worker and a DEALER on every other process, as ps-lite; or, in a
job that already runs torch.distributed, ``backend='torch'``, which goes
through the process group's store and never issues collectives.  The
control channel has threads of its own; messages are JSON with an
HMAC-SHA256 under a key only the job's processes hold: the token (required
off loopback), or else a secret the rank-0 worker makes and hands over
privately (``_secret``); see docs/distributed.md, "Threat model".
"""

from __future__ import annotations

import atexit
import functools
import ipaddress
import os
import threading
from typing import Any, Callable
from urllib.parse import urlsplit

from .. import _ctlserver, _signals
from .._session import SESSION
from ..control import set_config
from ..errors import ConfigError, StateError
from . import _collect, _launcher, _node, _secret
from ._node import DistributedError, DistributedTimeout, Member

__all__ = [
    "DistributedError",
    "DistributedTimeout",
    "Member",
    "collect",
    "dumps",
    "info",
    "init",
    "is_initialized",
    "members",
    "shutdown",
    "tally",
]

DEFAULT_ADDRESS = "tcp://127.0.0.1:9190"
DEFAULT_TIMEOUT = 30.0
BACKENDS = ("zmq", "torch")

_lock = threading.Lock()
_node_ref: dict[str, _node.Node] = {}


def _env(name: str, value: Any) -> Any:
    return os.environ.get(name) if value is None else value


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f"{name} must be an int, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def is_loopback(address: str) -> bool:
    """Whether address only reaches this machine (tcp to a loopback host, or ipc)."""
    parts = urlsplit(address)
    if parts.scheme == "ipc":
        return True
    if parts.scheme != "tcp" or parts.hostname is None:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


def init(
    role: str | None = None,
    rank: int | None = None,
    num_workers: int | None = None,
    num_servers: int | None = None,
    address: str | None = None,
    token: str | bytes | None = None,
    *,
    backend: str | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Join this process to the job's control channel.

    Arguments left out come from ``MXPROF_ROLE``, ``MXPROF_RANK``,
    ``MXPROF_NUM_WORKERS``, ``MXPROF_NUM_SERVERS``, ``MXPROF_ADDRESS``,
    ``MXPROF_TOKEN``, ``MXPROF_BACKEND`` and ``MXPROF_TIMEOUT``, then from
    the launcher's variables: under torchrun (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) every process is a
    worker and an initialised process group's store carries the channel;
    under MXNet's launcher (``DMLC_ROLE``, ``DMLC_NUM_WORKER``,
    ``DMLC_NUM_SERVER``, ``DMLC_PS_ROOT_URI``/``PORT``, the rank from
    ``DMLC_WORKER_ID``/``DMLC_SERVER_ID`` or ``DMLC_TASK_ID``).  Without a
    process group the rank-0 worker listens on the launcher's port + 1.
    Explicit arguments always win.  See docs/distributed.md.

    The rank-0 worker listens at ``address``; every other process connects
    there, says who it is and measures its clock offset to the rank-0
    worker (16 round trips, the fastest kept).  Servers then write their
    trace to ``rank<r>_<filename>`` (MXNet's rule) and workers other than
    rank 0 to ``worker<r>_<filename>``, so processes sharing a directory
    never write one file.

    Args:
        role: 'worker' or 'server'.
        rank: this process's rank among its role (0-based).
        num_workers: workers in the job (>= 1).
        num_servers: servers in the job (>= 0).
        address: the rank-0 worker's ZeroMQ address (default
            ``tcp://127.0.0.1:9190``).  Only loopback is bound unless an
            address says otherwise.
        token: the shared secret every message is signed with; required
            when the address is not loopback.
        backend: 'zmq' (default) or 'torch' (an initialised
            torch.distributed process group carries the messages; the
            rank-0 worker must be its rank 0).
        timeout: seconds to wait for any answer (default 30): a dead or
            silent process becomes a DistributedTimeout, never a hang.

    Without a token, the rank-0 worker makes the job's secret and hands it
    to the others privately (a 0600 file of this user's for a ZeroMQ job
    on this host; the process group's store for ``backend='torch'``).  On
    the rank-0 worker ``MXPROF_MAX_TRACE_BYTES`` bounds what one process's
    trace may bring (default 4 GiB).

    Returns:
        This process's ``distributedInfo`` (role, rank, host, pid, clock).

    Raises:
        ConfigError: a bad or missing argument, or no token off loopback.
        StateError: already initialised.
        DistributedTimeout: a non-hub process got no answer from the rank-0
            worker (not running, another address, or another token).
        ImportError: pyzmq (or torch, for backend='torch') is missing.

    Example:
        >>> from mxprof import distributed
        >>> distributed.init("server", 0, num_workers=2, num_servers=1)  # doctest: +SKIP
    """
    given = {
        "role": _env("MXPROF_ROLE", role),
        "rank": _env("MXPROF_RANK", rank),
        "num_workers": _env("MXPROF_NUM_WORKERS", num_workers),
        "num_servers": _env("MXPROF_NUM_SERVERS", num_servers),
        "address": _env("MXPROF_ADDRESS", address),
        "backend": _env("MXPROF_BACKEND", backend),
    }
    # What is still open comes from the launcher's variables (torchrun, dmlc);
    # an address given is for ZeroMQ, whatever process group there is.
    if given["address"] is not None and given["backend"] is None:
        given["backend"] = "zmq"
    launch = _launcher.detect() if None in given.values() else {}
    role, raw_rank, raw_workers, num_servers, address, backend = (
        launch.get(k) if v is None else v for k, v in given.items()
    )
    if role not in ("worker", "server"):
        raise ConfigError(f"role must be 'worker' or 'server' (or set MXPROF_ROLE), got {role!r}")
    backend = backend or "zmq"
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be 'zmq' or 'torch', got {backend!r}")
    num_servers = _int("num_servers", num_servers or 0, 0)
    if raw_workers is None:
        raise ConfigError("num_workers is required (or set MXPROF_NUM_WORKERS)")
    num_workers = _int("num_workers", raw_workers, 1)
    if raw_rank is None:
        raise ConfigError(
            "rank is required (or set MXPROF_RANK; under MXNet's launcher DMLC_WORKER_ID, "
            "DMLC_SERVER_ID or DMLC_TASK_ID)"
        )
    rank = _int("rank", raw_rank, 0)
    count = num_workers if role == "worker" else num_servers
    if rank >= count:
        raise ConfigError(f"{role} rank {rank} is out of range: the job has {count} {role}s")
    raw_timeout = _env("MXPROF_TIMEOUT", timeout)
    try:
        wait = DEFAULT_TIMEOUT if raw_timeout is None else float(raw_timeout)
    except (TypeError, ValueError):
        raise ConfigError(f"timeout must be a number of seconds, got {raw_timeout!r}") from None
    if not wait > 0:
        raise ConfigError(f"timeout must be > 0 seconds, got {raw_timeout!r}")
    raw_max = os.environ.get("MXPROF_MAX_TRACE_BYTES", _node.MAX_TRACE)
    max_trace = _int("MXPROF_MAX_TRACE_BYTES", raw_max, 0)
    token = _env("MXPROF_TOKEN", token)
    key = token.encode() if isinstance(token, str) else (token or b"")
    address = address or DEFAULT_ADDRESS
    if not isinstance(address, str):
        raise ConfigError(f"address must be a str, got {address!r}")
    if backend == "zmq" and not is_loopback(address) and not key:
        raise ConfigError(
            f"address {address!r} is not loopback: a token is required (token= or MXPROF_TOKEN) "
            "so that only the job's processes are obeyed"
        )
    job = _node.Job(
        role,
        rank,
        num_workers,
        num_servers,
        backend,
        wait,
        launch.get("launcher"),
        launch.get("local_rank"),
        max_trace,
    )
    with _lock:
        if _node_ref:
            raise StateError("mxprof.distributed is already initialised in this process")
        node = _start(job, address, key)
        _node_ref["node"] = node
    return node.info()


def _start(job: _node.Job, address: str, key: bytes) -> _node.Node:
    # File names first: once hello is answered, commands may arrive at once.
    prefix = _node.file_prefix(job.role, job.rank)

    def rename(path: str) -> str:
        named = _node.prefixed(path, prefix)
        node = _node_ref.get("node")
        if isinstance(node, _node.Peer):  # the hub learns where to find it, should it die
            node.report_file(named)
        return named

    SESSION.set_rename(rename)
    current = SESSION.config.filename
    if _node.prefixed(current, prefix) != current:
        set_config(filename=current)  # renamed on the way in
    # Profiles begun by remote calls begin on the channel's thread, which
    # cannot install signal handlers; init (on the main thread) can.  The
    # handler looks at flush_on_signal when a signal comes, so a remote
    # set_config may still turn it on or off.
    _signals.install(SESSION.signal_flush)
    try:
        node = _connect(job, address, key)
    except BaseException:
        SESSION.set_rename(None)
        raise
    node.publish()
    node.start_relay()  # a flight recorder's triggers are job-wide from now on
    return node


def _connect(job: _node.Job, address: str, key: bytes) -> _node.Node:
    """The transport, the job's secret (key, or one made here), and this
    process's role on the channel."""
    if job.backend == "torch":
        from ._torch import StoreTransport

        transport: Any = StoreTransport(job.is_hub)
    else:
        from ._zmq import ZmqTransport

        transport = ZmqTransport(address, hub=job.is_hub)
    if job.is_hub:
        secret = key or _secret.generate()
        withdraw: Callable[[], None] | None = None
        try:
            if not key and job.backend == "torch":
                transport.publish_secret(secret)
            elif not key:  # named after the address bound (port 0 has a number now)
                path = _secret.publish(transport.address, secret)
                withdraw = functools.partial(_secret.withdraw, path, secret)
        except BaseException:
            transport.close()
            raise
        hub = _node.Hub(job, transport, secret, withdraw)
        _node.install_remote(hub, None)
        _ctlserver.set_job(hub.me.label, hub.ctl_all, collect)  # mxprof ctl --job
        return hub
    if key:
        source: Callable[[], bytes | None] = lambda: key  # noqa: E731
    elif job.backend == "torch":
        source = transport.read_secret
    else:
        source = lambda: _secret.read(address)  # noqa: E731
    peer = _node.Peer(job, transport, source)
    _node.install_remote(
        None,
        f"only the rank-0 worker sends profile_process='server' calls; this is {peer.me.label}",
    )
    try:
        peer.join()
    except BaseException:
        _node.install_remote(None, None)
        peer.abandon()  # never a member: nothing to leave with the hub
        raise
    return peer


def _current() -> _node.Node:
    node = _node_ref.get("node")
    if node is None:
        raise StateError("mxprof.distributed is not initialised: call mxprof.distributed.init()")
    return node


def is_initialized() -> bool:
    """Whether init() has run (and shutdown() has not)."""
    return "node" in _node_ref


def info() -> dict[str, Any]:
    """This process's ``distributedInfo``, as written into its trace."""
    return _current().info()


def members() -> list[Member]:
    """On the rank-0 worker: the processes connected so far."""
    node = _current()
    if not isinstance(node, _node.Hub):
        raise StateError("members() is for the rank-0 worker")
    return sorted(node.members(), key=lambda m: (m.role, m.rank))


def tally() -> dict[str, int]:
    """Messages received and sent, and those dropped by reason: ``bad_mac``
    (another token or secret), ``malformed``, ``oversized``,
    ``unknown_peer`` (no channel of this connection, or not allowed on it),
    ``replayed`` (a message seen before on its channel)."""
    return _current().tally()


def collect(path: str, *, strict: bool = False, shared: bool = False) -> dict[str, Any]:
    """On the rank-0 worker: one timeline of every process's trace, in path.

    Each process first measures its clock again (its offset at init and
    now give a drift), then sends its trace as complete at this moment
    (written first if its profile is open).  The merged file has a process
    track per process, named by role, rank, host and pid, every event moved
    onto the rank-0 worker's clock, and ``distributedInfo`` with every
    process's clock offset, error bound and drift.

    A dead, frozen or unreachable process does not cost the others: the
    file holds everything that came, plus that process's last flushed trace
    file where this process can read it (same host or shared storage), and
    names what is missing and why in ``distributedInfo["missing"]`` (JSON
    outputs), in the result and in a RuntimeWarning.  Waiting for processes
    ends ``timeout`` (init's) after the call, or ``min(timeout, 2 s)``
    later when none was connected by then; one that stops in the middle of
    its upload adds one more ``timeout``; then the merge.

    With ``shared=True`` nothing is merged and no trace crosses the
    network where it need not: path is a small manifest (``.json``; see
    :mod:`mxprof.trace.manifest`) naming every process's own trace file,
    written up to this moment with its fresh clock estimates.  A process
    whose file this process cannot read as its own (another host's disk,
    a ``.pftrace``, a name another process's file holds) uploads it, into
    ``PATH.uploads/`` beside the manifest.  ``mxprof merge PATH -o
    job.pftrace`` merges it later, on any machine that sees the files.

    Args:
        path: the merged file; its suffix picks the format (with shared:
            the manifest).
        strict: raise instead of warning when a process failed (the file
            is written first; the error's ``summary`` is the result).
        shared: write a manifest of where the traces lie instead of
            merging them (for traces on shared storage).

    Returns:
        The merge summary, plus ``missing``: one entry per process whose
        trace is absent or partial (``process``, ``role``, ``rank``,
        ``why``, ``failed``: false when its profiler simply never ran,
        ``last_file``: its own file, merged instead, or None).

    Raises:
        StateError: not initialised, or not the rank-0 worker.
        DistributedTimeout: with strict, a process was dead or silent; or
            no process had a trace at all.
        DistributedError: with strict, a process failed to answer properly.

    Example:
        >>> from mxprof import distributed
        >>> distributed.collect("job.json")  # doctest: +SKIP
    """
    node = _current()
    if not isinstance(node, _node.Hub):
        raise StateError(f"collect() runs on the rank-0 worker; this is {node.me.label}")
    if not isinstance(shared, bool):
        raise ConfigError(f"shared must be a bool, got {shared!r}")
    return _collect.collect(node, os.fspath(path), strict, shared)


def dumps(*, ranks: bool = False, **kwargs: Any) -> dict[str, str]:
    """On the rank-0 worker: every process's ``mxprof.dumps(**kwargs)``.

    Each process renders its own statistics (``''`` where
    ``aggregate_stats`` is off there); the result maps process labels
    (``'server 1 (host, pid 4242)'``) to the text, this process first.

    With ``ranks=True`` it also collects every process's trace (as
    :func:`collect`, into a temporary file) and adds, under the key
    ``'ranks'``, the cross-rank analysis (:mod:`mxprof.report.ranks`): per
    step and rank compute, communication, waiting and idle, the spread per
    range and the straggler with its evidence; as JSON when
    ``format='json'``.

    Raises:
        ConfigError: a bad argument (checked here before anything is sent).
        StateError: not initialised, or not the rank-0 worker.
        DistributedTimeout: a process is dead or silent.

    Example:
        >>> from mxprof import distributed
        >>> for who, table in distributed.dumps().items():  # doctest: +SKIP
        ...     print(who, table)
        >>> print(distributed.dumps(ranks=True)["ranks"])  # doctest: +SKIP
    """
    if not isinstance(ranks, bool):
        raise ConfigError(f"ranks must be a bool, got {ranks!r}")
    node = _current()
    if not isinstance(node, _node.Hub):
        raise StateError(
            f"dumps() for the whole job runs on the rank-0 worker; this is {node.me.label}"
        )
    out = node.statistics(dict(kwargs))
    if ranks:
        out["ranks"] = _analyze_ranks(node, kwargs.get("format") == "json")
    return out


def _analyze_ranks(node: _node.Hub, as_json: bool) -> str:
    import tempfile

    from ..report.ranks import analyze
    from ..trace import load

    with tempfile.TemporaryDirectory(prefix="mxprof-ranks-") as where:
        path = os.path.join(where, "job.json")
        _collect.collect(node, path, strict=False)
        result = analyze(load(path))
    return result.to_json() if as_json else result.table()


def shutdown() -> None:
    """Leave the control channel (also at interpreter exit)."""
    with _lock:
        node = _node_ref.pop("node", None)
    if node is None:
        return
    SESSION.clear_remote()
    _ctlserver.set_job(None)
    node.close()


def _forget_in_child() -> None:
    """A forked child is not a member of the job: drop the parent's channel
    without touching its sockets (ZeroMQ contexts do not survive a fork)."""
    _node_ref.clear()
    SESSION.clear_remote()
    _ctlserver.set_job(None)


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
