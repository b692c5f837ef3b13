"""The local control endpoint that ``mxprof ctl`` talks to.

Every process that uses the live profiler (from the first use of a live
name of the package, not at a bare ``import mxprof``) listens on a Unix
socket ``<dir>/<pid>.sock`` (``mxprof._ctlwire``: the directory is the
user's, mode 0700; the socket is 0600).  One thread of mxprof's own serves
it, one connection after another; it blocks in ``accept`` and so costs the
program nothing until a request comes: the hot path never looks at it.

Who may ask: a peer whose uid (``SO_PEERCRED``) is this process's; any other
gets an error and nothing else.  What a bad request gets: an error reply and
the connection closed; the request is read under a size limit and a time
limit, and no handler raises into the program (they all run on this thread,
and everything they raise becomes the reply).

``MXPROF_CONTROL=0`` in the environment keeps the endpoint closed;
``set_config(control=False)`` closes it and ``control=True`` opens it again.
A forked child opens its own (the parent's socket is not the child's); the
socket is removed at exit.  A process killed outright leaves its socket
behind: ``mxprof ctl list`` removes those.

Commands (``ctl`` names them the same): ``status``, ``where``, ``start``,
``stop``, ``dump``, ``snapshot``, ``top``.  ``start`` and ``top`` on a
process whose state is ``'stop'`` begin a recording of ctl's own and
``stop`` (or the end of its duration, or of ``top``) ends it: the state and
configuration are then as they were before.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import struct
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable

from . import _ctlwire, _native, _sampler, config, control, flight
from ._native import KIND_EVENT, KIND_FRAME, KIND_TASK
from ._render import is_own
from ._session import SESSION
from ._version import __version__
from .errors import ProfilerError

__all__ = ["answer", "apply", "close", "enabled", "path", "set_job", "start"]

REQUEST_TIMEOUT = 2.0  # s for a whole request to arrive once connected
REPLY_TIMEOUT = 10.0  # s for a reply to be taken
TOP_LEASE = 10.0  # s without a `top` request before ctl's statistics recording ends
MAX_FRAMES = 512  # frames per thread in `where`, innermost kept

_lock = threading.Lock()  # opening and closing
_endpoint: _Endpoint | None = None


def enabled() -> bool:
    """Whether the environment allows the endpoint (``MXPROF_CONTROL`` not 0)."""
    return os.environ.get("MXPROF_CONTROL", "1").strip().lower() not in ("0", "false", "no", "off")


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of conn (``SO_PEERCRED``)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class _Endpoint:
    """One listening socket and the thread that serves it."""

    def __init__(self) -> None:
        directory = _ctlwire.control_dir(create=True)
        self.path = _ctlwire.socket_path(os.getpid(), directory)
        self.pid = os.getpid()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # a socket left by a dead process of the same pid
            sock.bind(self.path)
            os.chmod(self.path, 0o600)
            sock.listen(8)
        except BaseException:
            sock.close()
            raise
        self.inode = os.stat(self.path).st_ino
        self.sock = sock
        self.thread = _sampler.own_thread(
            threading.Thread(target=self._serve, name="mxprof-control", daemon=True)
        )
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            try:
                _answer(conn)
                _drain(conn)
            except Exception:  # a peer gone mid-reply: nothing to tell anyone
                pass
            finally:
                conn.close()

    def close(self, unlink: bool = True) -> None:
        """Stop serving; unlink: remove the socket file if it is still ours."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.sock.close()
        if unlink:
            try:
                if os.stat(self.path).st_ino == self.inode:
                    os.unlink(self.path)
            except OSError:
                pass
        if threading.current_thread() is not self.thread and self.thread.is_alive():
            self.thread.join(timeout=1.0)


def start() -> str | None:
    """Open the endpoint unless it is open, the environment forbids it or the
    configuration has it off; its socket's path (None: closed).  A failure
    to open it (no socket directory) warns and leaves it closed.

    Example:
        >>> start() is None or start().endswith(".sock")
        True
    """
    global _endpoint
    if not enabled() or not SESSION.config.control:
        return None
    with _lock:
        if _endpoint is None or _endpoint.pid != os.getpid():
            try:
                _endpoint = _Endpoint()
            except OSError as e:
                _endpoint = None
                _warn(f"mxprof: no control endpoint for `mxprof ctl`: {e}")
                return None
        return _endpoint.path


def close() -> None:
    """Close the endpoint and remove its socket (nothing when closed)."""
    global _endpoint
    with _lock:
        endpoint, _endpoint = _endpoint, None
    if endpoint is not None and endpoint.pid == os.getpid():
        endpoint.close()


def apply(on: bool) -> None:
    """Follow ``set_config(control=...)``."""
    if on:
        start()
    else:
        close()


def path() -> str | None:
    """The open endpoint's socket path, or None."""
    endpoint = _endpoint
    return endpoint.path if endpoint is not None and endpoint.pid == os.getpid() else None


def _warn(message: str) -> None:
    import warnings  # rare: only when the endpoint cannot open

    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _after_fork_in_child() -> None:
    """The parent's endpoint is the parent's: let its socket go without
    removing the file, and open one of this process's own."""
    global _endpoint, _lock
    _lock = threading.Lock()
    old, _endpoint = _endpoint, None
    if old is not None:
        old.sock.close()
        start()


# ---- one request ----


def _answer(conn: socket.socket) -> None:
    try:
        uid = peer_uid(conn)
    except OSError as e:
        _reply(conn, {"ok": False, "error": f"refused: the peer's credentials unreadable: {e}"})
        return
    if uid != os.getuid():
        _reply(conn, {"ok": False, "error": f"refused: uid {uid} is not this process's user"})
        return
    try:
        request = _ctlwire.read_message(conn, _ctlwire.MAX_REQUEST, REQUEST_TIMEOUT)
    except _ctlwire.ProtocolError as e:
        _reply(conn, {"ok": False, "error": f"bad request: {e}"})
        return
    cmd, args, job = request.get("cmd"), request.get("args", {}), request.get("job", False)
    if job is True:
        _reply(conn, _answer_job(cmd, args))
    elif job is not False:
        _reply(conn, {"ok": False, "error": f"bad request: job must be true or false, got {job!r}"})
    else:
        _reply(conn, answer(cmd, args))


def answer(cmd: Any, args: Any) -> dict[str, Any]:
    """Run one ctl command here; its reply, ``{"ok": true, "result": ...}``
    or ``{"ok": false, "error": TEXT}``.  Never raises: what a command
    raises is the reply (mxprof.distributed's peers answer ``--job`` with it).
    """
    handler = _COMMANDS.get(cmd) if isinstance(cmd, str) else None
    if handler is None:
        return {"ok": False, "error": f"bad request: unknown command {cmd!r}"}
    if not isinstance(args, dict):
        return {"ok": False, "error": f"bad request: args must be an object, got {args!r}"}
    try:
        return {"ok": True, "result": handler(args)}
    except (ProfilerError, _Refused) as e:
        return {"ok": False, "error": str(e)}
    except Exception as e:  # never into the program: the asker gets it
        return {"ok": False, "error": f"{cmd} failed: {e!r}"}


def _drain(conn: socket.socket) -> None:
    """Before closing: what the peer sent and was not read (a refused or
    bad request) is read and dropped, up to a bound, so that the close does
    not reset the connection and lose the reply on its way."""
    conn.shutdown(socket.SHUT_WR)
    left, deadline = _ctlwire.MAX_REQUEST + 4, time.monotonic() + 0.5
    with contextlib.suppress(OSError):
        while left > 0 and time.monotonic() < deadline:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = conn.recv(min(left, 65536))
            if not chunk:
                return
            left -= len(chunk)


def _reply(conn: socket.socket, reply: dict[str, Any]) -> None:
    conn.settimeout(REPLY_TIMEOUT)
    _ctlwire.write_message(conn, reply)


class _Refused(Exception):
    """A command that cannot be done in the process's present state."""


def _arg(args: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = args.get(key, default)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # JSON's true is a Python bool, which is an int: a number must not be one.
    wrong = not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds)
    if value is not default and wrong:
        raise _Refused(f"bad request: {key} must be {kind}, got {value!r}")
    return value


# ---- what the process is doing ----


def _thread_state(native_id: int | None) -> str:
    """The OS's one-letter state of a thread of this process ('?' unknown)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            text = f.read(512)
    except OSError:
        return "?"
    end = text.rfind(b")")
    return text[end + 2 : end + 3].decode("ascii", "replace") or "?"


def _open_ranges(native_id: int | None) -> list[dict[str, Any]] | None:
    """The ranges open on a thread, outermost first; None: its stack kept
    changing while read."""
    if native_id is None:
        return []
    found = _native.ranges_open(native_id)
    if found is None:
        return None
    out = []
    for oid, age_ns in found:
        info = _native.object_info(oid)
        if not is_own(info.domain, info.name):
            out.append({"domain": info.domain, "name": info.name, "open_s": age_ns / 1e9})
    return out


def _frames(frame: FrameType | None) -> list[list[Any]]:
    """[function, file, line] from the outermost frame to frame, cut to
    the innermost MAX_FRAMES."""
    out: list[list[Any]] = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        out.append([getattr(code, "co_qualname", code.co_name), code.co_filename, frame.f_lineno])
        frame = frame.f_back
    out.reverse()
    return out


def _threads() -> list[dict[str, Any]]:
    """The program's threads (not mxprof's own), main first."""
    frames = sys._current_frames()
    by_ident = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in frames.items():
        thread = by_ident.get(ident)
        native = thread.native_id if thread is not None else None
        if _sampler.is_own(native):
            continue
        out.append(
            {
                "name": thread.name if thread is not None else f"<thread {ident}>",
                "ident": ident,
                "native_id": native,
                "main": ident == main,
                "daemon": bool(thread is not None and thread.daemon),
                "os_state": _thread_state(native),
                "frames": _frames(frame),
                "ranges": _open_ranges(native),
            }
        )
    out.sort(key=lambda t: (not t["main"], t["name"], t["ident"]))
    return out


def _distributed() -> dict[str, Any] | None:
    """This process's role and rank when it is part of a distributed job."""
    dist = sys.modules.get("mxprof.distributed")  # only if the program loaded it
    try:
        if dist is not None and dist.is_initialized():
            info: dict[str, Any] = dist.info()
            return {k: info.get(k) for k in ("role", "rank", "world_size", "host")}
    except Exception:
        return None
    return None


def cmd_status(args: dict[str, Any]) -> dict[str, Any]:
    """State, configuration, tallies, open ranges per thread.

    Read without the session lock (the configuration is one frozen object,
    swapped whole), so that a program busy in a long write still answers."""
    cfg = SESSION.config
    state = {
        "state": SESSION.state,
        "paused": SESSION.paused,
        "profile_open": SESSION.profile_open,
        "trace": cfg.filename if SESSION.profile_open else None,
        "trace_files": list(SESSION.trace_paths),
    }
    ranges = {}
    for t in _threads():
        if t["ranges"]:
            ranges[t["name"]] = t["ranges"]
    return {
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "python": sys.version.split()[0],
        "mxprof_version": __version__,
        **state,
        "config": cfg.as_dict(),
        "pending_events": int(_native.trace_pending()),
        "tallies": _native.counts(),
        "sampler": _sampler.kind() if _sampler.rate() else None,
        "open_ranges": ranges,
        "ctl_recording": _own.describe(),
        "distributed": _distributed(),
    }


def cmd_where(args: dict[str, Any]) -> dict[str, Any]:
    """Every program thread's Python stack and open ranges."""
    return {"pid": os.getpid(), "threads": _threads(), "recording": SESSION.state == "run"}


# ---- recording on request ----


class _Own:
    """A recording ctl began (``start``, or ``top`` on an idle process):
    what to put back when it ends."""

    def __init__(self) -> None:
        self.kind: str | None = None  # 'start' | 'top'
        self.saved: dict[str, Any] = {}
        self.path: str | None = None
        self.until: float | None = None
        self.timer: threading.Timer | None = None
        self.last_top = 0.0
        self.generation = 0  # which recording a timer belongs to (a late one ends nothing)
        self.lock = threading.RLock()

    def describe(self) -> dict[str, Any] | None:
        if self.kind is None:
            return None
        left = None if self.until is None else max(0.0, self.until - time.monotonic())
        return {"kind": self.kind, "trace": self.path, "seconds_left": left}

    def begin(self, kind: str, values: dict[str, Any], seconds: float | None) -> None:
        """Record with values from the state 'stop'; back to it after seconds."""
        checked = config.validate(values)
        with SESSION.lock:
            if SESSION.state == "run":
                raise _Refused(
                    "the program is recording already (its own profile); `ctl dump` writes "
                    "what it has, and `ctl stop` stops only what `ctl start` began"
                )
            self.saved = {k: getattr(SESSION.config, k) for k in checked}
            control.set_config(**checked)
            try:
                control.set_state("run")
            except BaseException:
                SESSION.configure(self.saved)
                raise
        self.kind = kind
        self.generation += 1
        self.path = SESSION.config.filename if kind == "start" else None
        self.until = None if seconds is None else time.monotonic() + seconds
        self.last_top = time.monotonic()
        self._arm(seconds if kind == "start" else TOP_LEASE)

    def _arm(self, seconds: float | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None
        if seconds is not None:
            timer = threading.Timer(seconds, self._expire, (self.generation,))
            timer.daemon = True
            timer.name = "mxprof-control-timer"
            self.timer = _sampler.own_thread(timer)  # type: ignore[assignment]
            timer.start()

    def _expire(self, generation: int) -> None:
        with self.lock:
            if generation != self.generation or self.kind is None:
                return  # that recording has ended already
            if self.kind == "top" and time.monotonic() - self.last_top < TOP_LEASE:
                self._arm(TOP_LEASE)  # still watched
                return
            try:
                self.end()
            except Exception as e:  # on a timer thread: nobody to raise to
                _warn(f"mxprof: ending the recording `mxprof ctl` began failed: {e!r}")

    def end(self) -> str | None:
        """Stop, write (start) or drop (top) what was recorded, put the
        configuration back; the trace written, if any."""
        if self.kind is None:
            return None
        kind, path, saved = self.kind, self.path, self.saved
        if self.timer is not None and self.timer is not threading.current_thread():
            self.timer.cancel()
        self.timer = None
        try:
            with SESSION.lock:
                try:
                    if SESSION.state == "run":
                        control.set_state("stop")
                    if SESSION.profile_open:
                        control.dump(finished=True)
                finally:
                    SESSION.configure(config.validate(saved))
                    if kind == "top":
                        _native.stats_reset()  # ctl's statistics are not the program's
        finally:
            # Only now, the trace written: `status` (which reads this without
            # the lock) says the recording is over once its file is whole.
            self.kind, self.path, self.until, self.saved = None, None, None, {}
        return path if kind == "start" else None


_own = _Own()


def cmd_start(args: dict[str, Any]) -> dict[str, Any]:
    """Record from now on, until ``stop`` or duration seconds."""
    duration = _arg(args, "duration", (int, float), None)
    if duration is not None and not 0 < duration < 1e7:
        raise _Refused(f"bad request: duration must be > 0 seconds, got {duration!r}")
    filename = _arg(args, "filename", str, None)
    rate = _arg(args, "sample_rate", (int, float), None)
    values: dict[str, Any] = {
        "filename": filename or f"mxprof-ctl-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}.json",
        "write_trace": True,  # a trace is what start is for, whatever the program set
    }
    if rate is not None:
        values["sample_rate"] = rate
    where = os.path.dirname(os.path.abspath(values["filename"]))
    if not os.access(where, os.W_OK | os.X_OK):
        raise _Refused(f"cannot write {values['filename']!r}: {where!r} is not a writable folder")
    with _own.lock:
        if _own.kind is not None:
            raise _Refused(f"`mxprof ctl` is recording here already ({_own.kind})")
        _own.begin("start", values, duration)
        return {"trace": os.path.abspath(SESSION.config.filename), "duration": duration}


def cmd_stop(args: dict[str, Any]) -> dict[str, Any]:
    """End what ``start`` began: the trace is written and the process idle."""
    with _own.lock:
        if _own.kind != "start":
            raise _Refused(
                "nothing to stop: `mxprof ctl stop` ends a recording that `ctl start` "
                "began, and none is running (the program's own profile is the program's)"
            )
        path = _own.end()
    return {"trace": None if path is None else os.path.abspath(path)}


def cmd_dump(args: dict[str, Any]) -> dict[str, Any]:
    """Write what the open profile holds, and keep recording."""
    with SESSION.lock:
        if not SESSION.profile_open:
            raise _Refused("nothing to dump: no profile is open (`mxprof ctl start` begins one)")
        if not SESSION.traced:
            raise _Refused("nothing to dump: this profile keeps statistics only (write_trace)")
        control.dump(finished=False)
        return {"trace": os.path.abspath(SESSION.config.filename)}


def cmd_snapshot(args: dict[str, Any]) -> dict[str, Any]:
    """A flight-recorder snapshot (``mxprof.trigger("ctl")``)."""
    path = flight.trigger("ctl")
    if path is None:
        raise _Refused(
            "no snapshot: no flight recorder is recording here (set_config(flight_recorder="
            "SECONDS) and state 'run'), or its interval or count limit held this one back"
        )
    return {"trace": os.path.abspath(path)}


def cmd_top(args: dict[str, Any]) -> dict[str, Any]:
    """Per-range statistics now: per interval (``since: 'last'``) while ctl
    owns the statistics, else since they began (``since: 'start'``)."""
    end = _arg(args, "end", bool, False)
    with _own.lock:
        if end:
            if _own.kind == "top":
                _own.end()
            return {"rows": [], "since": "last", "ended": True}
        if _own.kind is None and SESSION.state != "run":
            _own.begin("top", {"aggregate_stats": True, "write_trace": False}, None)
            _native.stats_reset()
        if not SESSION.config.aggregate_stats:
            raise _Refused(
                "the program records without statistics (aggregate_stats=False): `ctl top` "
                "has nothing to show"
            )
        _own.last_top = time.monotonic()
        mine = _own.kind == "top"
        rows = []
        for s in _native.stats_snapshot(reset=mine):
            if s.kind not in (KIND_TASK, KIND_FRAME, KIND_EVENT) or not s.count:
                continue
            info = _native.object_info(s.id)
            if is_own(info.domain, info.name):
                continue
            rows.append([info.domain, info.name, s.count, s.total, s.p99])
        return {"rows": rows, "since": "last" if mine else "start", "state": SESSION.state}


# ---- a whole job (mxprof ctl PID --job ...) ----

# The rank-0 worker of a distributed job registers these (mxprof.distributed):
# its label; fanout(cmd, args, timeout) -> every other process's reply by
# label; collect(path) -> the merged trace's summary.
Fanout = Callable[..., dict[str, Any]]
_job: dict[str, Any] = {}
JOB_TIMEOUT = 10.0  # s each process gets to answer a fanned-out command


def set_job(
    label: str | None, fanout: Fanout | None = None, collect: Callable[..., Any] | None = None
) -> None:
    """Make ``--job`` commands fan out through a distributed job's hub (None: not a hub)."""
    _job.clear()
    if label is not None and fanout is not None and collect is not None:
        _job.update(label=label, fanout=fanout, collect=collect)


def _answer_job(cmd: Any, args: Any) -> dict[str, Any]:
    if not _job:
        return {
            "ok": False,
            "error": "--job needs the rank-0 worker of a distributed job (one that called "
            "mxprof.distributed.init); this process is not one",
        }
    if cmd not in ("status", "where", "start", "stop", "dump", "snapshot"):
        return {"ok": False, "error": f"bad request: {cmd!r} cannot be sent to a whole job"}
    if not isinstance(args, dict):
        return {"ok": False, "error": f"bad request: args must be an object, got {args!r}"}
    try:
        with _own.lock:
            return {"ok": True, "result": _job_command(cmd, args)}
    except (ProfilerError, _Refused) as e:
        return {"ok": False, "error": str(e)}
    except Exception as e:  # never into the program
        return {"ok": False, "error": f"{cmd} --job failed: {e!r}"}


def _fanout(cmd: str, args: dict[str, Any]) -> dict[str, Any]:
    """cmd here and on every other process: each reply by label, this one first."""
    replies = {_job["label"]: answer(cmd, args)}
    replies.update(_job["fanout"](cmd, args, JOB_TIMEOUT))
    return replies


def _job_command(cmd: str, args: dict[str, Any]) -> dict[str, Any]:
    """start: every process records into a file of its own (the duration is
    kept here); dump: one merged trace of what they hold now; stop: the
    merged trace, then every process stops and is as before."""
    if cmd in ("status", "where", "snapshot"):
        return {"ranks": _fanout(cmd, args)}
    merged = _arg(args, "filename", str, None)
    if cmd == "start":
        duration = _arg(args, "duration", (int, float), None)
        if duration is not None and not 0 < duration < 1e7:
            raise _Refused(f"bad request: duration must be > 0 seconds, got {duration!r}")
        local = {k: v for k, v in args.items() if k not in ("filename", "duration")}
        replies = _fanout("start", local)
        _job["merged"] = merged or f"mxprof-ctl-job-{time.strftime('%Y%m%d-%H%M%S')}.json"
        _job["generation"] = _job.get("generation", 0) + 1
        if duration is not None:
            timer = threading.Timer(duration, _job_expire, (_job["generation"],))
            timer.daemon = True
            timer.name = "mxprof-control-timer"
            _sampler.own_thread(timer).start()
        return {"ranks": replies, "trace": os.path.abspath(_job["merged"]), "duration": duration}
    path = merged or _job.get("merged")
    if path is None:
        raise _Refused("no merged trace to write: give -o FILE (or `ctl --job start` first)")
    summary = _job["collect"](path)
    replies = _fanout("stop", {}) if cmd == "stop" else {}
    if cmd == "stop":
        _job.pop("merged", None)
    missing = summary.get("missing") if isinstance(summary, dict) else None
    return {"ranks": replies, "trace": os.path.abspath(path), "missing": missing}


def _job_expire(generation: int) -> None:
    with _own.lock:
        if "merged" not in _job or _job.get("generation") != generation:
            return  # stopped already (and perhaps started again)
        try:
            _job_command("stop", {})
        except Exception as e:  # on a timer thread: nobody to raise to
            _warn(f"mxprof: ending the job recording `mxprof ctl --job` began failed: {e!r}")


_COMMANDS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "status": cmd_status,
    "where": cmd_where,
    "start": cmd_start,
    "stop": cmd_stop,
    "dump": cmd_dump,
    "snapshot": cmd_snapshot,
    "top": cmd_top,
}


def _close_at_exit() -> None:
    try:
        with _own.lock:
            _own.end()  # ctl's recording is written as stop would
    except Exception:
        pass
    close()


atexit.register(_close_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
