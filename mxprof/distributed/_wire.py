"""The control channel's messages: JSON headers, binary bodies, an HMAC on each.

A message is four frames: a magic tag with the protocol version, an
HMAC-SHA256 of the header and body under the job's shared token, the header
(a JSON object, at most ``MAX_HEADER`` bytes) and a body (bytes, at most
``MAX_BODY``; trace chunks travel there).  Nothing received is ever
unpickled or evaluated: a header is parsed as JSON and its fields checked
before anything acts on it.  A message that fails a check is dropped and
counted in ``Tally``; it never gets an answer.

Requests carry ``"id"`` (unique per sender); answers carry ``"re"``, the id
they answer, and are matched to the waiting request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from typing import Any

MAGIC = b"MXP1"
MAX_HEADER = 64 * 1024
MAX_BODY = 8 * 1024 * 1024
CHUNK = 4 * 1024 * 1024  # trace upload piece, below MAX_BODY

# Requests, and the types an answer may have.
REQUESTS = frozenset(
    {
        "hello",
        "ping",
        "set_config",
        "set_state",
        "pause",
        "resume",
        "dump",
        "sync",
        "upload",
        "deposit",
        "dumps",
        "bye",
    }
)
ANSWERS = frozenset({"ok", "error"})

Header = dict[str, Any]


class Rejected(Exception):
    """A received message that is dropped; ``reason`` is a Tally field."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Tally:
    """Counts of messages handled and dropped, by reason (thread-safe)."""

    FIELDS = ("received", "sent", "bad_mac", "malformed", "oversized", "unknown_peer")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.FIELDS, 0)

    def add(self, field: str, n: int = 1) -> None:
        with self._lock:
            self._counts[field] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _mac(key: bytes, header: bytes, body: bytes) -> bytes:
    m = hmac.new(key, len(header).to_bytes(8, "big"), hashlib.sha256)
    m.update(header)
    m.update(body)
    return m.digest()


def encode(key: bytes, header: Header, body: bytes = b"") -> list[bytes]:
    """The frames of one message."""
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    if len(text) > MAX_HEADER or len(body) > MAX_BODY:
        raise ValueError(f"message too large ({len(text)} + {len(body)} bytes)")
    return [MAGIC, _mac(key, text, body), text, body]


def decode(key: bytes, frames: list[bytes]) -> tuple[Header, bytes]:
    """Check and parse one message; Rejected says why it is dropped."""
    if len(frames) != 4 or frames[0] != MAGIC:
        raise Rejected("malformed", f"{len(frames)} frames / not an mxprof message")
    _, mac, text, body = frames
    if len(text) > MAX_HEADER or len(body) > MAX_BODY:
        raise Rejected("oversized", f"header {len(text)} B, body {len(body)} B")
    if not hmac.compare_digest(mac, _mac(key, text, body)):
        raise Rejected("bad_mac", "the HMAC does not match (another token?)")
    try:
        header = json.loads(text)
    except ValueError as e:
        raise Rejected("malformed", f"header is not JSON ({e})") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise Rejected("malformed", "header is not an object with a 'type'")
    kind = header["type"]
    key_name = "re" if kind in ANSWERS else "id"
    if kind not in REQUESTS and kind not in ANSWERS:
        raise Rejected("malformed", f"unknown message type {kind!r}")
    ident = header.get(key_name)
    if not isinstance(ident, int) or isinstance(ident, bool):
        raise Rejected("malformed", f"{kind!r} without an integer {key_name!r}")
    args = header.get("args", {})
    if not isinstance(args, dict):
        raise Rejected("malformed", "'args' is not an object")
    return header, body
