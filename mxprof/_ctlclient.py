"""``mxprof ctl``: ask a running process that uses mxprof what it is doing.

The client side of the control endpoint (``mxprof._ctlserver``).  It is
offline: it imports nothing of the live profiler, so the command starts no
profiler of its own.  Each command is one request on one connection, with a
timeout; what the target cannot answer in time is said, with what the OS
shows of its threads.

Errors (``CtlError``, exit status 2): a process that is gone, one that has no
endpoint (it does not use mxprof's live API, it turned the endpoint off, or
it belongs to another user), a refusal, a reply that does not come.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from typing import Any, TextIO

from . import _ctlwire

__all__ = ["ACTIONS", "CtlError", "attach", "list_processes", "request", "run"]

ACTIONS = ("status", "where", "start", "stop", "dump", "snapshot", "top", "attach")
DEFAULT_TIMEOUT = 2.0
_STATES = {"R": "running", "S": "sleeping", "D": "in I/O", "T": "stopped", "t": "traced"}


class CtlError(Exception):
    """What ``mxprof ctl`` could not do, in words for its user (exit status 2)."""


def _alive(pid: int) -> bool:
    """Whether process pid exists and has not exited (a zombie has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read(512)
    except OSError:
        return True  # no /proc: kill() said it exists
    return text[text.rfind(b")") + 2 : text.rfind(b")") + 3] not in (b"Z", b"X")


def _os_threads(pid: int) -> str:
    """The target's threads as the OS shows them: 'tid name (state)', ..."""
    out = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return "unknown (no /proc)"
    for tid in tids[:32]:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                text = f.read(512)
        except OSError:
            continue
        start, end = text.find(b"("), text.rfind(b")")
        name = text[start + 1 : end].decode("utf-8", "replace")
        letter = text[end + 2 : end + 3].decode("ascii", "replace")
        out.append(f"{tid} {name} ({_STATES.get(letter, letter)})")
    more = f", and {len(tids) - 32} more" if len(tids) > 32 else ""
    return ", ".join(out) + more


def _no_endpoint(pid: int) -> CtlError:
    if not _alive(pid):
        return CtlError(f"no process {pid}: it is gone (or never was)")
    hint = (
        "; on CPython 3.14+ `mxprof ctl PID attach` can load mxprof into it"
        if sys.version_info >= (3, 14)
        else ""
    )
    return CtlError(
        f"process {pid} is not an mxprof process: it has no control endpoint in "
        f"{_ctlwire.control_dir()} (it does not use mxprof's live API, runs with "
        f"MXPROF_CONTROL=0 or control=False, or belongs to another user){hint}"
    )


def request(
    pid: int, cmd: str, args: dict[str, Any] | None = None, timeout: float = 2.0, job: bool = False
) -> Any:
    """Send one command to process pid; its result.

    Raises:
        CtlError: the process is gone, has no endpoint, refused, answered
            with an error, or did not answer within timeout.

    Example:
        >>> request(os.getpid(), "status")["pid"] == os.getpid()  # doctest: +SKIP
        True
    """
    path = _ctlwire.socket_path(pid)
    if not os.path.exists(path):
        raise _no_endpoint(pid)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            if not _alive(pid):
                _remove_stale(path)
                raise CtlError(f"no process {pid}: it is gone (its socket was stale)") from None
            raise _no_endpoint(pid) from None
        except socket.timeout:
            raise _late(pid, cmd, timeout) from None
        try:
            message: dict[str, Any] = {"cmd": cmd, "args": args or {}}
            if job:
                message["job"] = True
            # Refused before it read the request: its reply says why.
            with contextlib.suppress(BrokenPipeError):
                _ctlwire.write_message(sock, message)
            reply = _ctlwire.read_message(sock, _ctlwire.MAX_REPLY, timeout)
        except _ctlwire.ProtocolError as e:
            if "in time" in str(e):
                raise _late(pid, cmd, timeout) from None
            raise CtlError(f"process {pid} answered {cmd!r} with a bad reply: {e}") from None
        except OSError as e:
            raise CtlError(f"process {pid}: the connection failed: {e}") from None
    finally:
        sock.close()
    if not reply.get("ok"):
        raise CtlError(f"process {pid}: {reply.get('error', 'an error without a message')}")
    return reply.get("result")


def _late(pid: int, cmd: str, timeout: float) -> CtlError:
    if not _alive(pid):
        return CtlError(f"no process {pid}: it ended before answering {cmd!r}")
    return CtlError(
        f"process {pid} did not answer {cmd!r} within {timeout:g} s. Its control thread "
        "needs the GIL, and the thread holding it has not let it go (a C call that keeps "
        "the GIL, a long computation in one C call, or a stopped process); no stack or "
        f"range could be read. Its threads, as the OS shows them: {_os_threads(pid)}. "
        "Try again with a longer --timeout, or read the native stacks (py-spy dump --native)."
    )


def _remove_stale(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def list_processes(timeout: float = 1.0) -> list[dict[str, Any]]:
    """This user's processes with an endpoint, each with its status (or the
    error that came instead); sockets of processes that are gone are removed."""
    directory = _ctlwire.control_dir()
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = []
    for name in sorted(names):
        stem, _, ext = name.partition(".")
        if ext != "sock" or not stem.isdigit():
            continue
        pid = int(stem)
        path = os.path.join(directory, name)
        if not _alive(pid):
            _remove_stale(path)
            continue
        try:
            out.append({"pid": pid, "status": request(pid, "status", timeout=timeout)})
        except CtlError as e:
            if not os.path.exists(path):
                continue  # found stale by request() and removed
            out.append({"pid": pid, "error": str(e)})
    return out


# ---- attach (CPython 3.14+) ----

# Run in the target's main thread at its next safe point, in a namespace of
# its own (sys.remote_exec runs a script in __main__'s otherwise).
_ATTACH = """\
import importlib, sys
try:
    importlib.import_module("mxprof")
except ImportError:
    sys.path.append({root!r})
importlib.import_module("mxprof._ctlserver").start()
"""


def attach(pid: int, timeout: float) -> str:
    """Load mxprof into process pid and open its endpoint (``sys.remote_exec``,
    CPython 3.14+); the socket's path.

    Raises:
        CtlError: unavailable here, refused by the OS or the target, or the
            endpoint did not appear within timeout.
    """
    remote_exec = getattr(sys, "remote_exec", None)
    if remote_exec is None:
        raise CtlError(
            "attach is unavailable: it needs CPython 3.14+ (sys.remote_exec), on both "
            f"sides; this is {sys.implementation.name} {sys.version.split()[0]}"
        )
    if not _alive(pid):
        raise CtlError(f"no process {pid}: it is gone (or never was)")
    path = _ctlwire.socket_path(pid)
    if os.path.exists(path):
        return path
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    body = _ATTACH.format(root=root)
    script = f"exec(compile({body!r}, '<mxprof attach>', 'exec'), {{}})\n"
    fd, name = tempfile.mkstemp(prefix="mxprof-attach-", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(script)
        os.chmod(name, 0o644)  # the target reads it
        try:
            remote_exec(pid, name)
        except (OSError, RuntimeError) as e:
            raise CtlError(
                f"cannot attach to process {pid}: {e} (it needs the same user, permission "
                "to trace it (ptrace_scope, CAP_SYS_PTRACE), the same Python version, and "
                "remote debugging not disabled in the target: PYTHON_DISABLE_REMOTE_DEBUG, "
                "-X disable_remote_debug)"
            ) from None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(path):
                return path
            time.sleep(0.05)
    finally:
        time.sleep(0.2 if os.path.exists(path) else 0)
        os.unlink(name)
    raise CtlError(
        f"process {pid} took the attach script but opened no endpoint within {timeout:g} s: "
        "its main thread runs it at its next Python instruction (not while blocked in C), "
        "and mxprof must be importable there"
    )


# ---- text output ----


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _range_chain(ranges: list[dict[str, Any]] | None) -> str:
    if ranges is None:
        return "(this mxprof's core cannot list open ranges)"
    if not ranges:
        return "(none)"
    return " > ".join(f"{r['domain']}:{r['name']} ({r['open_s']:.3f} s)" for r in ranges)


def render_status(s: dict[str, Any], out: TextIO) -> None:
    """status as text."""
    cmd = " ".join(s.get("argv") or []) or "?"
    out.write(f"pid {s['pid']}: {cmd}\n")
    out.write(f"  python {s['python']}, mxprof {s['mxprof_version']}\n")
    dist = s.get("distributed")
    if dist:
        out.write(
            f"  job: {dist.get('role')} rank {dist.get('rank')} of {dist.get('world_size')}\n"
        )
    state = s["state"] + (" (paused)" if s.get("paused") else "")
    out.write(f"  state: {state}\n")
    own = s.get("ctl_recording")
    if own:
        left = own.get("seconds_left")
        more = f", {left:.1f} s left" if left is not None else ""
        out.write(f"  ctl recording: {own['kind']}{more}\n")
    out.write(f"  trace: {s.get('trace') or '(no profile open)'}\n")
    cfg = s.get("config", {})
    keys = ("aggregate_stats", "sample_rate", "write_trace", "max_events", "continuous_dump")
    out.write("  config: " + ", ".join(f"{k}={cfg.get(k)!r}" for k in keys) + "\n")
    tallies = s.get("tallies", {})
    out.write(
        f"  events waiting to be written: {s.get('pending_events', 0)}; dropped: "
        f"{tallies.get('dropped_events', 0)}; cut short: {tallies.get('cut_ranges', 0)}\n"
    )
    ranges = s.get("open_ranges") or {}
    out.write("  open ranges:" + ("" if ranges else " (none)") + "\n")
    for thread, chain in ranges.items():
        out.write(f"    {thread}: {_range_chain(chain)}\n")


def render_where(w: dict[str, Any], out: TextIO, title: str = "") -> None:
    """where as text: each thread's stack, innermost last, then its open ranges."""
    out.write(f"{title or 'pid ' + str(w['pid'])}: {len(w['threads'])} thread(s)\n")
    for t in w["threads"]:
        state = _STATES.get(t["os_state"], t["os_state"])
        tag = " [main]" if t["main"] else (" [daemon]" if t["daemon"] else "")
        out.write(f"\nThread {t['name']!r} (native id {t['native_id']}, {state}){tag}\n")
        for func, file, line in t["frames"]:
            out.write(f"    {func} ({file}:{line})\n")
        out.write(f"  open ranges: {_range_chain(t['ranges'])}\n")
    if not w.get("recording"):
        out.write("\n(not recording: ranges are known only while the state is 'run')\n")


def render_list(procs: list[dict[str, Any]], out: TextIO) -> None:
    """list as text: one line per process."""
    if not procs:
        out.write(f"no mxprof processes of this user ({_ctlwire.control_dir()})\n")
        return
    out.write(f"{'PID':>8}  {'STATE':<8} {'JOB':<12} {'TRACE':<30} COMMAND\n")
    for p in procs:
        s = p.get("status")
        if s is None:
            out.write(f"{p['pid']:>8}  {'?':<8} {'':<12} {'':<30} ({p['error']})\n")
            continue
        dist = s.get("distributed")
        job = f"{dist['role']}:{dist['rank']}" if dist else ""
        cmd = " ".join(s.get("argv") or [])
        out.write(f"{p['pid']:>8}  {s['state']:<8} {job:<12} {s.get('trace') or '-':<30} {cmd}\n")


def render_top(rows: list[list[Any]], interval: float, out: TextIO, title: str) -> None:
    """One frame of top: per-range statistics over the last interval."""
    out.write(f"{title}\n")
    header = ("Range", "Count", "Total (ms)", "Avg (ms)", "P99 (ms)", "Per s")
    table = [
        (
            f"{domain}:{name}",
            str(count),
            _ms(total),
            _ms(total / count),
            _ms(p99) if p99 is not None else "-",
            f"{count / interval:.1f}",
        )
        for domain, name, count, total, p99 in rows
    ]
    widths = [
        max(len(h), *(len(r[i]) for r in table)) if table else len(h) for i, h in enumerate(header)
    ]
    out.write(
        "  ".join(
            h.ljust(widths[0]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(header)
        )
    )
    out.write("\n")
    for r in table:
        out.write(
            "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))
        )
        out.write("\n")
    if not table:
        out.write("(no range ended in this interval)\n")


def _top_rows(now: dict[str, Any], before: dict[tuple[str, str], list[Any]]) -> list[list[Any]]:
    """The interval's rows: as given (since 'last'), or the difference from
    the previous reading (since 'start'; P99 then covers since the start)."""
    rows = []
    for domain, name, count, total, p99 in now["rows"]:
        if now["since"] == "start":
            prev = before.get((domain, name))
            if prev is not None:
                count, total = count - prev[2], total - prev[3]
        if count > 0:
            rows.append([domain, name, count, total, p99])
    rows.sort(key=lambda r: (-r[3], r[0], r[1]))
    return rows


def top(
    pid: int, interval: float, iterations: int | None, timeout: float, fmt: str, out: TextIO
) -> None:
    """Refresh a table of the last interval's ranges until interrupted (or
    iterations frames); ends ctl's own statistics recording after."""
    before: dict[tuple[str, str], list[Any]] = {}
    now = request(pid, "top", timeout=timeout)
    before = {(r[0], r[1]): r for r in now["rows"]}
    clear = fmt == "text" and out.isatty()
    frame = 0
    try:
        while iterations is None or frame < iterations:
            time.sleep(interval)
            now = request(pid, "top", timeout=timeout)
            rows = _top_rows(now, before)
            before = {(r[0], r[1]): r for r in now["rows"]}
            frame += 1
            if fmt == "json":
                out.write(
                    json.dumps(
                        {
                            "pid": pid,
                            "interval_s": interval,
                            "since": now["since"],
                            "rows": [
                                {"domain": d, "name": n, "count": c, "total_ns": t, "p99_ns": p}
                                for d, n, c, t, p in rows
                            ],
                        }
                    )
                    + "\n"
                )
            else:
                if clear:
                    out.write("\x1b[H\x1b[2J")
                p99 = "" if now["since"] == "last" else " (P99 since the statistics began)"
                render_top(
                    rows, interval, out, f"pid {pid}: ranges ended in the last {interval:g} s{p99}"
                )
            out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        with contextlib.suppress(CtlError):
            request(pid, "top", {"end": True}, timeout=timeout)


# ---- the command ----


def _emit(result: Any, fmt: str, out: TextIO, text: str) -> None:
    if fmt == "json":
        out.write(json.dumps(result, indent=1) + "\n")
    else:
        out.write(text + "\n")


def run(args: Any, out: TextIO | None = None) -> int:
    """``mxprof ctl``; args is the command's parsed arguments (cli.py)."""
    out = out or sys.stdout
    fmt, timeout = args.format, args.timeout
    if args.target == "list":
        if args.action is not None:
            raise CtlError(f"`ctl list` takes no action, got {args.action!r}")
        procs = list_processes(timeout=timeout)
        if fmt == "json":
            out.write(json.dumps(procs, indent=1) + "\n")
        else:
            render_list(procs, out)
        return 0
    try:
        pid = int(args.target)
        if pid <= 0:
            raise ValueError
    except ValueError:
        raise CtlError(f"the target must be 'list' or a process id, got {args.target!r}") from None
    action = args.action or "status"
    _check_options(args, action)
    if args.job:
        return _run_job(pid, action, args, out)
    if action == "attach":
        path = attach(pid, timeout=max(timeout, 10.0))
        _emit({"pid": pid, "socket": path}, fmt, out, f"process {pid}: control endpoint at {path}")
        return 0
    if action in ("status", "where"):
        answer = request(pid, action, timeout=timeout)
        if fmt == "json":
            _emit(answer, fmt, out, "")
        else:
            (render_status if action == "status" else render_where)(answer, out)
    elif action == "start":
        _start(pid, args, timeout, fmt, out)
    elif action in ("stop", "dump", "snapshot"):
        r = request(pid, action, timeout=max(timeout, 30.0) if action != "snapshot" else timeout)
        verb = {"stop": "stopped; wrote", "dump": "wrote", "snapshot": "snapshot"}[action]
        _emit(r, fmt, out, f"process {pid}: {verb} {r.get('trace')}")
    elif action == "top":
        top(pid, args.interval, args.iterations, timeout, fmt, out)
    return 0


# ---- a whole job ----

# What a job command waits for: the rank-0 worker gives each process 10 s
# (_ctlserver.JOB_TIMEOUT); a merged trace takes its collect.
_JOB_WAIT = {"start": 30.0, "stop": 300.0, "dump": 300.0}


def _run_job(pid: int, action: str, args: Any, out: TextIO) -> int:
    """``ctl PID --job ACTION``: PID is the rank-0 worker; every process
    answers.  Exit status 2 when any process failed (after printing all)."""
    if action in ("top", "attach"):
        raise CtlError(f"`ctl PID --job {action}` is not offered: run it per process")
    request_args: dict[str, Any] = {}
    if action == "start":
        request_args = _start_args(args)
    elif args.output is not None:
        request_args["filename"] = os.path.abspath(args.output)
    wait = max(args.timeout, _JOB_WAIT.get(action, 15.0))
    result = request(pid, action, request_args, timeout=wait, job=True)
    ranks: dict[str, Any] = result.get("ranks", {})
    failed = {label: r["error"] for label, r in ranks.items() if not r.get("ok")}
    if args.format == "json":
        out.write(json.dumps(result, indent=1) + "\n")
    else:
        for label, r in ranks.items():
            if not r.get("ok"):
                out.write(f"{label}: error: {r.get('error')}\n")
            elif action == "where":
                render_where(r["result"], out, title=label)
                out.write("\n")
            elif action == "status":
                out.write(f"== {label}\n")
                render_status(r["result"], out)
            else:
                out.write(f"{label}: {action} ok {r['result'].get('trace') or ''}\n")
        if result.get("trace"):
            verb = "recording; merged trace will be" if action == "start" else "merged trace:"
            out.write(f"{verb} {result['trace']}\n")
        for gap in result.get("missing") or []:
            out.write(f"missing from the merged trace: {gap.get('process')}: {gap.get('why')}\n")
    if failed:
        raise CtlError(
            f"{len(failed)} of {len(ranks)} processes failed: "
            + "; ".join(f"{label}: {error}" for label, error in failed.items())
        )
    return 0


def _start_args(args: Any) -> dict[str, Any]:
    request_args: dict[str, Any] = {}
    if args.duration is not None:
        request_args["duration"] = args.duration
    if args.output is not None:
        request_args["filename"] = os.path.abspath(args.output)
    if args.sample is not None:
        request_args["sample_rate"] = args.sample
    return request_args


def _check_options(args: Any, action: str) -> None:
    given = {
        "--duration": args.duration is not None,
        "-o": args.output is not None,
        "--sample": args.sample is not None,
        "--iterations": args.iterations is not None,
        "--interval": args.interval != 1.0,
    }
    allowed = {"start": {"--duration", "-o", "--sample"}, "top": {"--iterations", "--interval"}}
    if args.job:  # -o names the merged trace
        allowed = {**allowed, "dump": {"-o"}, "stop": {"-o"}}
    for option, present in given.items():
        if present and option not in allowed.get(action, set()):
            raise CtlError(f"{option} does not apply to `ctl PID {action}`")


def _start(pid: int, args: Any, timeout: float, fmt: str, out: TextIO) -> None:
    request_args = _start_args(args)
    r = request(pid, "start", request_args, timeout=max(timeout, 10.0))
    if args.duration is None:
        _emit(
            r, fmt, out, f"process {pid}: recording into {r['trace']} until `mxprof ctl {pid} stop`"
        )
        return
    if fmt == "text":
        out.write(f"process {pid}: recording into {r['trace']} for {args.duration:g} s\n")
        out.flush()
    # The target ends it on its own; wait for that, bounded.
    deadline = time.monotonic() + args.duration + max(timeout, 30.0)
    time.sleep(args.duration)
    while True:
        s = request(pid, "status", timeout=timeout)
        own = s.get("ctl_recording")
        if own is None or own.get("kind") != "start":
            break
        if time.monotonic() > deadline:
            raise CtlError(f"process {pid} has not ended the recording after {args.duration:g} s")
        time.sleep(0.1)
    written = os.path.exists(r["trace"])
    r = {**r, "written": written}
    _emit(
        r,
        fmt,
        out,
        f"process {pid}: wrote {r['trace']}"
        if written
        else f"process {pid}: recording ended; no trace at {r['trace']}",
    )
