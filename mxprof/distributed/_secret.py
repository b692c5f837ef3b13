"""The job's secret: the key every process proves before the hub obeys it.

A job always has one, whether or not the user gives a token:

- a token given (``token=`` or ``MXPROF_TOKEN``): the token;
- ``backend='torch'``: the rank-0 worker makes one and puts it into the
  process group's store, where the others read it (the store already
  carries the channel: whoever can reach it is inside the job);
- ZeroMQ on this host (loopback TCP, or ipc): the rank-0 worker makes one
  and writes it to a file only this user can read (0600, in a 0700
  directory that this user owns), named after the job's address; the
  others read it there.  Off this host a token is required (``init``).

What a stranger on the host can see is the address; what it would need is
the secret.  A process running as the same user can read the file, as it
could read the job's memory: that user is inside the trust boundary
(docs/distributed.md, "Threat model").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from urllib.parse import urlsplit

SECRET_BYTES = 32
_STORE_KEY = "mxprof/secret"


def generate() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def directories() -> list[str]:
    """Where this user's job secrets may be, the preferred first.

    ``$XDG_RUNTIME_DIR`` (a per-user tmpfs) when set, then
    ``/tmp/mxprof-<uid>``; a reader looks in both, so processes of one job
    that disagree on ``XDG_RUNTIME_DIR`` still meet.
    """
    found = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        found.append(os.path.join(runtime, "mxprof"))
    found.append(f"/tmp/mxprof-{os.getuid()}")
    return found


def _private_dir(path: str, create: bool) -> bool:
    """Whether path is a directory of this user's that nobody else may enter
    (made so when create); a symlink, another owner or a wider mode: no."""
    if create:
        with contextlib.suppress(FileExistsError, FileNotFoundError, PermissionError):
            os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    )


def file_name(address: str) -> str:
    """The secret file's name for a ZeroMQ address on this host.

    Loopback TCP is named by its port (``127.0.0.1``, ``localhost`` and
    ``[::1]`` reach one listener), ipc by a hash of its absolute path.
    """
    parts = urlsplit(address)
    if parts.scheme == "ipc":
        where = os.path.abspath(address[len("ipc://") :])
        return "job-ipc-" + hashlib.sha256(where.encode()).hexdigest()[:24]
    return f"job-tcp-{parts.port}"


def publish(address: str, secret: bytes) -> str:
    """Write secret for the job at address (the rank-0 worker); its path.

    Raises:
        PermissionError: no private directory can be made here.
    """
    for folder in directories():
        if _private_dir(folder, create=True):
            break
    else:
        raise PermissionError(
            f"no private directory for the job's secret: {' or '.join(directories())} is not a "
            "directory of this user's with mode 0700 (give a token instead: MXPROF_TOKEN)"
        )
    path = os.path.join(folder, file_name(address))
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secret.hex().encode() + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, path)  # readers see the old secret or the new, whole
    return path


def read(address: str) -> bytes | None:
    """The secret of the job at address, as its rank-0 worker wrote it
    (the newest where several places hold one); None: none yet."""
    best: tuple[float, bytes] | None = None
    for folder in directories():
        if not _private_dir(folder, create=False):
            continue  # another user's, or open to others: not to be trusted
        path = os.path.join(folder, file_name(address))
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
                continue
            text = os.read(fd, 4 * SECRET_BYTES)
        finally:
            os.close(fd)
        try:
            secret = bytes.fromhex(text.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            continue
        if len(secret) == SECRET_BYTES and (best is None or st.st_mtime > best[0]):
            best = (st.st_mtime, secret)
    return None if best is None else best[1]


def withdraw(path: str, secret: bytes) -> None:
    """Remove the secret file at path if it still holds secret (a later job
    on the same address may have replaced it)."""
    with contextlib.suppress(OSError):
        with open(path, "rb") as f:
            if f.read().strip() != secret.hex().encode():
                return
        os.unlink(path)


def store_key() -> str:
    """The key under which the rank-0 worker leaves the secret in a torch store."""
    return _STORE_KEY
