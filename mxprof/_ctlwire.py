"""What both ends of ``mxprof ctl`` share: where the sockets live, and the framing.

A process that uses the live profiler listens on a Unix socket
``<dir>/<pid>.sock`` (``mxprof._ctlserver``); ``mxprof ctl`` connects to it
(``mxprof._ctlclient``).  This module is a leaf of the offline tier (stdlib
only), so the command never loads the live profiler.

The directory is per user: ``$MXPROF_CONTROL_DIR`` if set, else
``$XDG_RUNTIME_DIR/mxprof`` when that exists, else
``<tempdir>/mxprof-<uid>``.  It is created with mode 0700, and a directory
that another user owns, or that others may enter, is refused rather than
used: a socket there could be replaced by someone else's.

A message is a 4-byte big-endian length, then that many bytes of UTF-8 JSON
holding one object.  A request is ``{"cmd": NAME, "args": {...}}``; its
length is at most ``MAX_REQUEST``.  A reply is ``{"ok": true, "result":
...}`` or ``{"ok": false, "error": TEXT}``; one connection carries one
request and its reply.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import struct
import tempfile
import time
from typing import Any

__all__ = [
    "MAX_REPLY",
    "MAX_REQUEST",
    "ProtocolError",
    "control_dir",
    "read_message",
    "socket_path",
    "write_message",
]

MAX_REQUEST = 64 * 1024  # bytes of JSON: a request names a command and a few arguments
MAX_REPLY = 64 * 1024 * 1024  # a `where` of thousands of threads fits
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """A message that is not one: cut short, too long, not a JSON object, or late."""


def control_dir(create: bool = False) -> str:
    """The calling user's socket directory (see the module docstring).

    Args:
        create: make it (mode 0700) when missing.

    Raises:
        OSError: it cannot be made, or is not safe to use (another owner,
            or open to others); the message names it.

    Example:
        >>> control_dir().endswith(("mxprof", f"mxprof-{os.getuid()}")) or True
        True
    """
    path = os.environ.get("MXPROF_CONTROL_DIR")
    if not path:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if runtime and os.path.isdir(runtime):
            path = os.path.join(runtime, "mxprof")
        else:
            path = os.path.join(tempfile.gettempdir(), f"mxprof-{os.getuid()}")
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise OSError(f"mxprof control directory {path!r} is not a directory of this user")
    if info.st_mode & 0o077:
        raise OSError(
            f"mxprof control directory {path!r} is open to other users "
            f"(mode {stat.S_IMODE(info.st_mode):o}); it must be 0700"
        )
    return path


def socket_path(pid: int, directory: str | None = None) -> str:
    """The socket of process pid."""
    return os.path.join(directory or control_dir(), f"{pid}.sock")


def write_message(sock: socket.socket, obj: Any) -> None:
    """Send obj as one message (blocking, under the socket's timeout)."""
    data = json.dumps(obj, separators=(",", ":"), default=str).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _read_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    parts: list[bytes] = []
    while n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProtocolError("the message did not arrive in time (half sent?)")
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(n, 1 << 20))
        except socket.timeout:
            raise ProtocolError("the message did not arrive in time (half sent?)") from None
        if not chunk:
            raise ProtocolError("the connection closed in the middle of a message")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_message(sock: socket.socket, limit: int, timeout: float) -> dict[str, Any]:
    """Read one message: a JSON object of at most limit bytes, whole within timeout.

    Raises:
        ProtocolError: anything else, naming what was wrong.
        OSError: the connection failed.
    """
    deadline = time.monotonic() + timeout
    (n,) = _HEADER.unpack(_read_exact(sock, _HEADER.size, deadline))
    if n > limit:
        raise ProtocolError(f"a message of {n} bytes is over the limit of {limit}")
    try:
        obj = json.loads(_read_exact(sock, n, deadline).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"the message is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"the message is a JSON {type(obj).__name__}, not an object")
    return obj
