"""The control channel's messages: JSON headers, binary bodies, an HMAC on each.

A message is five frames: a magic tag with the protocol version, a channel
id (empty or ``CHANNEL_ID`` bytes), an HMAC-SHA256 of everything after it,
the header (a JSON object, at most ``MAX_HEADER`` bytes) and a body (bytes,
at most ``MAX_BODY``; trace chunks travel there).  Nothing received is ever
unpickled or evaluated: a header is parsed as JSON only after its MAC
checks, and its fields are checked before anything acts on it.  A message
that fails a check is dropped and counted in ``Tally``; it never gets an
answer.

Keys.  Every job has a secret (``_secret``: the user's token, or one the
rank-0 worker made).  Under the secret itself only the handshake travels:
a peer's ``open`` request, carrying a fresh nonce of the peer's, and the
hub's answer, carrying a fresh channel id of the hub's.  Everything else
travels on that *channel*: its key is derived from the secret, the channel
id and the peer's nonce (``channel_key``), and every message on it carries
a sequence number (``"seq"``) under the MAC.  So a message copied off one
connection is worth nothing on another (the channel is bound to the
connection that opened it), and one sent again on its own connection is
refused (``Window``).  A replayed ``open`` gets a new channel whose key the
replayer cannot derive without the secret.

Requests carry ``"id"`` (unique per sender); answers carry ``"re"``, the id
they answer, and are matched to the waiting request on the channel it was
sent on.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
from typing import Any

MAGIC = b"MXP2"
CHANNEL_ID = 16  # bytes of a channel id
NONCE = 16  # bytes of a peer's handshake nonce
MAX_HEADER = 64 * 1024
MAX_BODY = 8 * 1024 * 1024
CHUNK = 4 * 1024 * 1024  # trace upload piece, below MAX_BODY

# Requests, and the types an answer may have.
REQUESTS = frozenset(
    {
        "open",
        "hello",
        "ping",
        "file",
        "set_config",
        "set_state",
        "pause",
        "resume",
        "dump",
        "sync",
        "upload",
        "deposit",
        "dumps",
        "ctl",  # mxprof ctl --job: a control command for the peer's own endpoint
        "bye",
        "flight",  # job-wide flight recorder snapshots (_flight)
        "flight_window",
        "flight_upload",
    }
)
ANSWERS = frozenset({"ok", "error"})
HANDSHAKE = "open"  # the one request that travels under the secret itself

Header = dict[str, Any]


class Rejected(Exception):
    """A received message that is dropped; ``reason`` is a Tally field."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Tally:
    """Counts of messages handled and dropped, by reason (thread-safe)."""

    FIELDS = (
        "received",
        "sent",
        "bad_mac",
        "malformed",
        "oversized",
        "unknown_peer",
        "replayed",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.FIELDS, 0)

    def add(self, field: str, n: int = 1) -> None:
        with self._lock:
            self._counts[field] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _mac(key: bytes, sid: bytes, header: bytes, body: bytes) -> bytes:
    m = hmac.new(key, MAGIC + bytes([len(sid)]) + sid, hashlib.sha256)
    m.update(len(header).to_bytes(8, "big"))
    m.update(header)
    m.update(body)
    return m.digest()


def channel_key(secret: bytes, sid: bytes, nonce: bytes) -> bytes:
    """A channel's key: only a holder of the job's secret can derive it."""
    return hmac.new(secret, b"mxprof channel\x00" + sid + nonce, hashlib.sha256).digest()


def encode(key: bytes, sid: bytes, header: Header, body: bytes = b"") -> list[bytes]:
    """The frames of one message on channel sid (b"": the handshake, under the secret)."""
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    if len(text) > MAX_HEADER or len(body) > MAX_BODY:
        raise ValueError(f"message too large ({len(text)} + {len(body)} bytes)")
    return [MAGIC, sid, _mac(key, sid, text, body), text, body]


def channel_of(frames: list[bytes]) -> bytes:
    """The channel id a message names, after its shape and sizes are checked."""
    if len(frames) != 5 or frames[0] != MAGIC:
        raise Rejected("malformed", f"{len(frames)} frames / not an mxprof message")
    sid = frames[1]
    if len(sid) not in (0, CHANNEL_ID):
        raise Rejected("malformed", f"a channel id of {len(sid)} bytes")
    if len(frames[3]) > MAX_HEADER or len(frames[4]) > MAX_BODY:
        raise Rejected("oversized", f"header {len(frames[3])} B, body {len(frames[4])} B")
    return sid


def decode(key: bytes, frames: list[bytes]) -> tuple[Header, bytes]:
    """Check and parse one message; Rejected says why it is dropped."""
    sid = channel_of(frames)
    _, _, mac, text, body = frames
    if not hmac.compare_digest(mac, _mac(key, sid, text, body)):
        raise Rejected("bad_mac", "the HMAC does not match (another job's secret or token?)")
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as e:
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


class Window:
    """Sequence numbers seen on a channel: each is admitted once.

    Messages may overtake each other by up to ``SPAN`` (several threads
    send on one channel, and a number is taken before its message is
    queued); older ones and repeats are refused.
    """

    SPAN = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._top = 0
        self._seen = 0  # bit i: top - i was admitted

    def admit(self, seq: Any) -> bool:
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= 0:
            return False
        with self._lock:
            if seq > self._top:
                shift = seq - self._top
                self._seen = ((self._seen << shift) | 1) & ((1 << self.SPAN) - 1)
                self._top = seq
                return True
            bit = 1 << (self._top - seq)
            if self._top - seq >= self.SPAN or self._seen & bit:
                return False
            self._seen |= bit
            return True


class Channel:
    """One end of an authenticated connection: its id, key and numbering.

    ``src`` is the transport's name for the other end (the hub binds each
    channel to the connection that opened it; a peer has one, the hub's).
    """

    def __init__(self, sid: bytes, key: bytes, src: Any = None) -> None:
        self.sid = sid
        self.key = key
        self.src = src
        self.joined = False  # the hub accepted its hello
        self._seq = itertools.count(1)
        self._window = Window()

    def seal(self, header: Header, body: bytes = b"") -> list[bytes]:
        """The frames of header and body on this channel, numbered."""
        return encode(self.key, self.sid, {**header, "seq": next(self._seq)}, body)

    def unseal(self, frames: list[bytes]) -> tuple[Header, bytes]:
        """Check and parse a message that came on this channel.

        Raises:
            Rejected: as decode, or ``replayed``: its number was seen or is
                too old.
        """
        header, body = decode(self.key, frames)
        if not self._window.admit(header.get("seq")):
            raise Rejected("replayed", f"sequence number {header.get('seq')!r} seen or too old")
        return header, body
