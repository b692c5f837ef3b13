"""Read Chrome Trace Event JSON files into raw event dicts, whole or cut short.

Both forms of the format are accepted: the object form ``{"traceEvents": [...],
...}`` and the array form ``[...]``; gzip is recognised by its magic bytes,
whatever the file is called.

A file cut short is read up to the cut, with ``truncated`` set, when mxprof's
core wrote it: that writer keeps its file valid after every flush and writes
the time base and names before the events, so a cut there is a process killed
mid-write and what precedes it is whole.  Any other cut (someone else's
writer, a copy cut short), and damage (a gzip stream that fails its check,
bytes after it that are not gzip, JSON that cannot be a trace's beginning),
raise ``TraceFormatError`` naming the file; ``salvage`` reads what such a
file still holds, for ``mxprof repair``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar, Union

from ..errors import TraceFormatError, TraceReadError
from . import nvidia
from .perfetto import looks_like_perfetto, read_perfetto

PathArg = Union[str, "os.PathLike[str]"]
RawEvent = dict[str, Any]

GZIP_MAGIC = b"\x1f\x8b"
_GZIP_CHUNK = 1 << 16  # compressed bytes fed at a time
TEXT_PIECE = 8 << 20  # the most text one piece of decompression holds
# The longest line a JSON trace may hold, in bytes of its (decompressed)
# text: mxprof's writers, Chrome's and Perfetto's put one event per line, so a
# longer line is a hostile or broken file (a gzip bomb of one huge string).
# It bounds what any reader holds besides the file's own events.
MAX_LINE = 64 << 20
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# How the core's writer (native/src/mxp_chrome.c) begins every file, before any
# event: a file that begins so and is cut short was cut by a killed process.
_CORE_HEAD = re.compile(r'\{"displayTimeUnit":"ms","baseTimeNanoseconds":-?\d+,"traceEvents":\[\n')
# strict=False: a raw control character inside a string (old writers, MXNet's
# among them, did not escape names) is not worth refusing a whole trace for.
_DECODER = json.JSONDecoder(strict=False)
# What json's scanner leaves unread at its error position when the text ends
# inside a token: nothing, a partial literal (tr, -Infin, Na), the rest of a
# number it stopped short of (1. -> '.', 1e+ -> 'e+'), or a \u escape (whole
# or not: the scanner wants a character after it).
# Anything else at the error position is damage, not a cut.
_PARTIAL_TOKEN = re.compile(
    r"-?(?:I(?:n(?:f(?:i(?:n(?:i(?:ty?)?)?)?)?)?)?)?"
    r"|N(?:aN?)?|t(?:ru?)?|f(?:a(?:ls?)?)?|n(?:ul?)?"
    r"|[.eE][-+]?"
    r"|\\?u[0-9a-fA-F]{0,4}"
)


def read_raw(path: PathArg) -> tuple[list[RawEvent], dict[str, Any], bool]:
    """Read a trace file's events as the dicts in the file, in file order.

    Args:
        path: the trace file: plain or gzip-compressed JSON, the Perfetto
            protobuf mxprof writes (``.pftrace``, ``.perfetto-trace``; told
            apart by content, see ``mxprof.trace.perfetto``), or an nvprof /
            Nsight Systems SQLite database (``mxprof.trace.nvidia``).

    Returns:
        ``(events, metadata, truncated)``: the event objects in file order;
        every top-level key except ``traceEvents`` (``{}`` for the array
        form); and whether the file ended before the trace did (then
        ``events`` holds exactly the events complete before the cut, and
        ``metadata`` the keys whose values were complete).  Only files the
        core wrote (once their head is whole) and Perfetto files cut
        between packets are read cut short (see the module's docstring).

    Raises:
        TraceReadError: the path cannot be read (missing, a directory, no
            permission, too long, a NUL byte or lone surrogate in it); a
            subclass of both TraceFormatError and OSError, with ``errno``.
        TraceFormatError: the file is empty, not JSON, or JSON that is not a
            trace (or a damaged Perfetto trace); a gzip stream that is
            damaged; a file cut short that the core did not write (or cut
            inside its head).  The message names the file and the
            problem, and for a cut or damage how ``mxprof repair`` keeps
            what is before it.

    Example:
        >>> events, metadata, truncated = read_raw("trace.json")  # doctest: +SKIP
        >>> events[0]["ph"], metadata["baseTimeNanoseconds"], truncated  # doctest: +SKIP
        ('X', 1795242929580964856, False)
    """
    events, metadata, fault = _read(path)
    if fault is None:
        return events, metadata, False
    if fault.readable:
        return events, metadata, True
    where = shown(os.fspath(path))
    if not any(e.get("ph") != "M" for e in events):  # names of processes, threads only
        before = "before its first event" if fault.cut else "no event before the damage"
        raise TraceFormatError(f"{where}: {fault.what}, {before}: nothing to read")
    n = len(events)
    raise TraceFormatError(
        f"{where}: {fault.what}; `mxprof repair {where} -o REPAIRED.json` writes the "
        f"{n} complete event{'s' * (n != 1)} before it as a valid trace"
    )


def salvage(path: PathArg) -> tuple[list[RawEvent], dict[str, Any], str | None]:
    """``read_raw`` that keeps what a cut or damaged file holds instead of refusing it.

    Returns:
        ``(events, metadata, problem)``: the events complete before the cut
        or the damage, the top-level members read whole, and what was wrong
        with the file (None: it was whole).

    Raises:
        TraceReadError: the path cannot be read.
        TraceFormatError: the file is empty, or its text cannot be the
            beginning of a trace.

    Example:
        >>> events, metadata, problem = salvage("crashed.json.gz")  # doctest: +SKIP
        >>> len(events), problem  # doctest: +SKIP
        (81234, 'the gzip stream ends inside a member: the file was cut short')
    """
    events, metadata, fault = _read(path)
    return events, metadata, None if fault is None else fault.what


@dataclass(frozen=True)
class _Fault:
    """What is wrong with a file that was read up to a point."""

    what: str  # as messages say it
    cut: bool  # the file ends early (else it is damaged)
    # Read up to the cut without asking: a cut the core's writer leaves (see
    # the module's docstring), even before its first event (a process killed
    # in its first write recorded nothing yet: an empty trace, truncated).
    readable: bool = False


def _read(path: PathArg) -> tuple[list[RawEvent], dict[str, Any], _Fault | None]:
    """The events and members a file holds, up to its first cut or damage, and that fault."""
    if nvidia.is_database(path):
        events, metadata, _ = nvidia.read_raw(path)
        return events, metadata, None
    where = shown(os.fspath(path))
    data, fault, compressed = _read_text(os.fspath(path), where)
    if not compressed and looks_like_perfetto(bytes(data[:_GZIP_CHUNK])):
        # Packets carry their own lengths: read_perfetto tells a cut from
        # damage (raising for damage), and the packets before a cut are whole.
        events, metadata, truncated = read_perfetto(bytes(data), where)
        cut = _Fault("the file ends inside a packet: it was cut short", True, True)
        return events, metadata, cut if truncated else None
    if data.endswith(b"\0") and fault is None:
        # A crash can leave a file's last blocks allocated but never written.
        data = data.rstrip(b"\0")
        fault = _Fault("the file ends in never-written (zero) bytes: it was cut short", True)
    # errors="replace": a cut inside a multi-byte character must not fail the
    # whole file; the broken character lies in the incomplete event, dropped.
    text = data.decode("utf-8-sig", errors="replace")
    if fault is not None and not text.strip():
        return [], {}, fault
    events, metadata, text_cut = parse_text(text, where)
    if text_cut and fault is None:
        fault = _Fault("the text ends inside the trace: the file was cut short", True)
    if fault is not None and fault.cut and _CORE_HEAD.match(text):
        fault = _Fault(fault.what, True, True)
    return events, metadata, fault


def shown(path: str) -> str:
    """The path as messages show it: itself, or its repr when it would not print.

    Example:
        >>> shown("a.json"), shown("bad\\udc80.json")
        ('a.json', "'bad\\\\udc80.json'")
    """
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return repr(path)
    return path if path.isprintable() else repr(path)


def open_trace(path: PathArg) -> BinaryIO:
    """The file open for reading bytes; every way the path can fail is one TraceReadError.

    Example:
        >>> with open_trace("trace.json") as f:  # doctest: +SKIP
        ...     head = f.read(16)
    """
    name = os.fspath(path)
    return _failing_as_trace_error(lambda: open(name, "rb"), name)


def _read_text(path: str, where: str) -> tuple[bytearray, _Fault | None, bool]:
    """The file's text (decompressed when it is gzip), what cut it short, and
    whether it was gzip.

    Read piece by piece, gzip as a stream: memory holds the text once, as
    for a plain file, and a line longer than ``MAX_LINE`` stops the reading.
    A Perfetto file is returned as its bytes (``looks_like_perfetto``).

    Raises:
        TraceReadError: the path cannot be read.
        TraceFormatError: a line longer than ``MAX_LINE``.
    """
    with open_trace(path) as f:
        first = _failing_as_trace_error(lambda: f.read(_GZIP_CHUNK), path)
        compressed = bool(first) and GZIP_MAGIC.startswith(first[:2])
        out = bytearray()
        pieces = gunzip(f.read, first) if compressed else _plain(f.read, first)
        # Perfetto packets hold any bytes, newlines or not: no lines to check.
        check = compressed or not looks_like_perfetto(first)
        lines = LineCheck(where)
        try:
            while True:
                piece = next(pieces)
                if check:
                    lines.add(piece)
                out += piece
        except StopIteration as done:
            fault: _Fault | None = done.value
        except OSError as e:
            reason = e.strerror or str(e)
            raise TraceReadError(f"{where}: cannot read: {reason}", path, e.errno) from None
    return out, fault, compressed


def _plain(read: Callable[[int], bytes], first: bytes) -> Generator[bytes, None, _Fault | None]:
    """A plain file's bytes, a piece at a time."""
    yield first
    while piece := read(TEXT_PIECE):
        yield piece
    return None


class LineCheck:
    """Stops a reading at the first line longer than ``MAX_LINE``, given the
    text piece by piece, in linear time (each byte is looked at once)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.offset = 0  # bytes of text given so far
        self.line = 0  # where the line now open began

    def add(self, piece: bytes | bytearray) -> None:
        """The next piece of text.

        Raises:
            TraceFormatError: a line is longer than ``MAX_LINE``, naming the
                file and the offset in its text where that line begins.
        """
        first = piece.find(b"\n")
        end = self.offset + (len(piece) if first < 0 else first)
        if end - self.line > MAX_LINE:
            raise line_too_long(self.where, self.line)
        if first >= 0:
            # Lines wholly inside the piece are shorter than it; check them too
            # when the piece may be longer than the limit.
            if len(piece) > MAX_LINE:
                start = first + 1
                while (nl := piece.find(b"\n", start)) >= 0:
                    if nl - start > MAX_LINE:
                        raise line_too_long(self.where, self.offset + start)
                    start = nl + 1
            self.line = self.offset + piece.rfind(b"\n") + 1
        self.offset += len(piece)
        if self.offset - self.line > MAX_LINE:
            raise line_too_long(self.where, self.line)


def line_too_long(where: str, offset: int) -> TraceFormatError:
    """The error for a line longer than ``MAX_LINE`` beginning at offset."""
    return TraceFormatError(
        f"{where}: a line of more than {MAX_LINE >> 20} MiB at byte {offset} of its text: "
        "not a trace mxprof reads (a trace has an event per line; see 'Loading traces' "
        "in the README)"
    )


_T = TypeVar("_T")


def _failing_as_trace_error(action: Callable[[], _T], path: str) -> _T:
    where = shown(path)
    try:
        return action()
    except OSError as e:
        reason = e.strerror or str(e)
        raise TraceReadError(f"{where}: cannot read: {reason}", path, e.errno) from None
    except ValueError as e:  # a NUL byte, a lone surrogate: no path the OS can take
        reason = "a NUL byte" if "\0" in path else "characters no file name can hold"
        message = f"{where}: cannot read: the path has {reason} ({e})"
        raise TraceReadError(message, path, errno.EINVAL) from None


def parse_text(text: str, where: str) -> tuple[list[RawEvent], dict[str, Any], bool]:
    """``read_raw`` on text already read; ``where`` names it in error messages.

    Example:
        >>> parse_text('[{"ph": "i", "ts": 1},\\n{"ph": "i", "ts', "example")
        ([{'ph': 'i', 'ts': 1}], {}, True)
    """
    if not text.strip():
        raise TraceFormatError(f"{where}: the file is empty, not a trace")
    try:
        doc = _DECODER.decode(text)
    except json.JSONDecodeError as err:
        # Not one complete JSON value: read it piece by piece, which keeps
        # what is complete when the text is cut short and pinpoints damage.
        return _parse_pieces(text, where, err)
    except (RecursionError, ValueError) as err:
        raise beyond_limits(where, err) from None
    events, metadata = _trace_parts(doc, where)
    return events, metadata, False


def beyond_limits(where: str, err: Exception) -> TraceFormatError:
    """The error for JSON that is valid but beyond what a reader takes: values
    nested deeper than Python's recursion limit, an integer of more digits
    than ``sys.get_int_max_str_digits()`` (4,300 by default)."""
    if isinstance(err, RecursionError):
        problem = "values nested too deep to read (more than about 900 levels)"
    else:
        problem = f"a value beyond what JSON numbers hold here ({err})"
    return TraceFormatError(f"{where}: not a trace mxprof reads: {problem}")


def gunzip(
    read: Callable[[int], bytes], first: bytes = b""
) -> Generator[bytes, None, _Fault | None]:
    """The text the gzip members of a stream decompress to, piece by piece,
    each member once; returns what cut the stream short or damaged it (None:
    it is whole).

    The one reader of gzip members (``_scan`` reads through it too): a stream
    that ends inside a member is a cut; a member that fails to decompress or
    its check (CRC, length), and bytes after the last member that are neither
    gzip nor zero padding, are damage.  Compressed input goes in chunks and
    each piece of output holds at most ``TEXT_PIECE`` bytes, so that a small
    file that decompresses to gigabytes is never held whole here, and the
    output before a damaged block is kept.

    Args:
        read: reads up to n more bytes of the file (b"": its end).
        first: bytes already read from its start.
    """
    data = first
    done = 0  # text given so far
    while True:
        member = zlib.decompressobj(wbits=31)
        while not member.eof:
            if not data:
                data = read(_GZIP_CHUNK)
                if not data:
                    cut = "the gzip stream ends inside a member: the file was cut short"
                    return _Fault(cut, True)
            before = member.copy()
            try:
                out = member.decompress(data, TEXT_PIECE)
            except zlib.error as e:
                # The output of the failing call is lost with it: feed that
                # input again a byte at a time, keeping all before the fault.
                kept = bytearray()
                for i in range(len(data)):
                    try:
                        kept += before.decompress(data[i : i + 1], TEXT_PIECE - len(kept))
                    except zlib.error:
                        break
                    if len(kept) >= TEXT_PIECE:
                        break
                yield bytes(kept)
                reason = str(e).partition(": ")[2] or str(e)
                damage = f"damaged gzip data ({reason}) after {done + len(kept)} bytes of text"
                return _Fault(damage, False)
            # Never call decompress after the member's end: what it is given
            # then would be added to unused_data again (a member read twice).
            data = b"" if member.eof else member.unconsumed_tail
            if out:
                done += len(out)
                yield out
        data = member.unused_data
        while len(data) < 2 and (more := read(_GZIP_CHUNK)):
            data += more
        if data and len(data) < 2 and GZIP_MAGIC.startswith(data):
            # The file ends inside the next member's first two bytes.
            return _Fault("the gzip stream ends inside a member: the file was cut short", True)
        if data[:2] != GZIP_MAGIC:
            # Zero padding after the last member is harmless; anything else is damage.
            while not data.strip(b"\0") and (more := read(_GZIP_CHUNK)):
                data = more
            if data.strip(b"\0"):
                return _Fault("bytes after the gzip stream that are not gzip", False)
            return None


def _json_type(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "null"


def _not_a_trace(where: str, problem: str) -> TraceFormatError:
    return TraceFormatError(f"{where}: JSON but not a trace: {problem}")


def _check_events(events: list[Any], where: str) -> list[RawEvent]:
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise _not_a_trace(where, f"event {i} is {_json_type(event)}, not an object")
    return events


def _trace_parts(doc: object, where: str) -> tuple[list[RawEvent], dict[str, Any]]:
    """Split a parsed document into (events, metadata), or say why it is no trace."""
    if isinstance(doc, list):
        return _check_events(doc, where), {}
    if not isinstance(doc, dict):
        raise _not_a_trace(
            where,
            f"the top level is {_json_type(doc)}, not an object with 'traceEvents' "
            "or an array of events",
        )
    if "traceEvents" not in doc:
        keys = ", ".join(repr(k) for k in list(doc)[:5]) or "none"
        raise _not_a_trace(where, f"the top-level object has no 'traceEvents' (keys: {keys})")
    events = doc["traceEvents"]
    if not isinstance(events, list):
        raise _not_a_trace(where, f"'traceEvents' is {_json_type(events)}, not an array")
    metadata = {k: v for k, v in doc.items() if k != "traceEvents"}
    return _check_events(events, where), metadata


class _Cut(Exception):
    """The text ended inside the trace; raised to unwind to _parse_pieces."""


def _parse_pieces(
    text: str, where: str, first_error: json.JSONDecodeError
) -> tuple[list[RawEvent], dict[str, Any], bool]:
    """Parse value by value; a cut keeps what came before it, damage raises."""
    reader = _Pieces(text, where)
    start = reader.skip(0)
    opening = text[start : start + 1]
    if opening not in ("[", "{"):
        raise TraceFormatError(
            f"{where}: not JSON ({first_error.msg} at line {first_error.lineno} "
            f"column {first_error.colno})"
        ) from first_error
    try:
        if opening == "[":
            reader.pos = start + 1
            reader.read_events()
        else:
            reader.read_object(start + 1)
    except _Cut:
        return reader.events, reader.metadata, True
    end = reader.skip(reader.pos)
    if end < len(text):
        raise reader.damage(end, "nothing after the end of the trace")
    if opening == "{" and not reader.found_events:
        raise _not_a_trace(where, "the top-level object has no 'traceEvents'")
    return reader.events, reader.metadata, False


class _Pieces:
    """A cursor over trace text that reads one JSON value at a time."""

    def __init__(self, text: str, where: str) -> None:
        self.text = text
        self.where = where
        self.pos = 0
        self.events: list[RawEvent] = []
        self.metadata: dict[str, Any] = {}
        self.found_events = False

    def skip(self, pos: int) -> int:
        """The position of the next non-whitespace character (len(text) at the end)."""
        match = _WHITESPACE.match(self.text, pos)
        return match.end() if match else pos

    def damage(self, pos: int, expected: str) -> TraceFormatError:
        line = self.text.count("\n", 0, pos) + 1
        column = pos - self.text.rfind("\n", 0, pos)
        return TraceFormatError(
            f"{self.where}: not valid JSON at line {line} column {column}: expected {expected}"
        )

    def next_char(self) -> str:
        """Skip whitespace and return the next character; _Cut at the end."""
        self.pos = self.skip(self.pos)
        if self.pos >= len(self.text):
            raise _Cut
        return self.text[self.pos]

    def value(self) -> Any:
        """Decode the value at pos (after whitespace) and move past it."""
        self.next_char()
        try:
            value, self.pos = _DECODER.raw_decode(self.text, self.pos)
        except (RecursionError, ValueError) as err:
            if not isinstance(err, json.JSONDecodeError):
                raise beyond_limits(self.where, err) from None
            if err.msg.startswith("Unterminated string") or _PARTIAL_TOKEN.fullmatch(
                self.text, err.pos
            ):
                raise _Cut from None
            raise TraceFormatError(
                f"{self.where}: not valid JSON at line {err.lineno} column {err.colno}: {err.msg}"
            ) from err
        return value

    def read_events(self) -> None:
        """Read events from just inside '[' to just past ']' into self.events.

        A comma before ']' is accepted, as JavaScript (and chrome://tracing) do.
        """
        self.found_events = True
        if self.next_char() == "]":
            self.pos += 1
            return
        while True:
            event = self.value()
            if not isinstance(event, dict):
                raise _not_a_trace(
                    self.where, f"event {len(self.events)} is {_json_type(event)}, not an object"
                )
            self.events.append(event)
            c = self.next_char()
            self.pos += 1
            if c == "]":
                return
            if c != ",":
                raise self.damage(self.pos - 1, "',' or ']' after an event")
            if self.next_char() == "]":
                self.pos += 1
                return

    def read_object(self, pos: int) -> None:
        """Read the top-level object's members from just inside '{' to just past '}'.

        A member is kept only once the ',' or '}' after it is read: a number cut
        short ("baseTimeNanoseconds": 17952) is a valid number, but not the value.
        """
        self.pos = pos
        if self.next_char() == "}":
            self.pos += 1
            return
        while True:
            if self.next_char() != '"':
                raise self.damage(self.pos, "a member name in double quotes")
            key = self.value()
            if self.next_char() != ":":
                raise self.damage(self.pos, "':' after a member name")
            self.pos += 1
            if key == "traceEvents" and self.next_char() == "[":
                self.pos += 1
                self.read_events()
            else:
                member = self.value()
                if key == "traceEvents":
                    raise _not_a_trace(self.where, f"'traceEvents' is {_json_type(member)}")
                if self.next_char() in ",}":
                    self.metadata[key] = member
            c = self.next_char()
            self.pos += 1
            if c == "}":
                return
            if c != ",":
                raise self.damage(self.pos - 1, "',' or '}' after a member")
