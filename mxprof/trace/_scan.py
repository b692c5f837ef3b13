"""Read a Chrome JSON trace in pieces, by its lines, without holding the whole file.

mxprof's writers (the core's and ``merge``'s) put one event per line between
the line that opens ``"traceEvents": [`` and the line that closes it, and the
other top-level members before and after. A file of that shape is read block
by block: each block, cut at its last newline, is a run of whole events that
``msgspec`` decodes straight into ``Event`` objects, so memory holds a block
at a time, not the file (or, for a load, not the text besides the events).

Anything else (another shape, a file cut short, damage, a value the fast
decoder will not take) raises ``NotLines`` and the caller reads the file the
slow, general way (``reader.read_raw``), which alone judges a cut or damaged
file (plain or gzip) and names the damage. Gzip is decompressed as a stream,
member after member.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator, Iterator
from typing import IO, Any, NamedTuple

import msgspec

from ..errors import TraceFormatError
from ._event import DECODE_EVENTS
from .reader import GZIP_MAGIC, MAX_LINE, LineCheck, PathArg, gunzip, open_trace, shown

BLOCK = 8 << 20  # bytes of text decoded at a time
_ENDS = 1 << 20  # bytes of each end read first for the members around the events
_HEAD_LIMIT = 1 << 20  # how far the opening of the events array may lie
_OPENING = re.compile(rb'\A\s*(?:\[|\{(?P<members>.*?)"traceEvents"\s*:\s*\[)', re.DOTALL)
# A line that begins with ']' closes the array: JSON strings hold no raw newline.
_CLOSING = re.compile(rb"\n[ \t\r]*\]")
# Members kept apart from the events: a decoder that accepts anything.
_DECODER = json.JSONDecoder(strict=False)


class NotLines(Exception):
    """The file is not one event per line (or is damaged): read it the general way."""


def _text(f: IO[bytes]) -> Iterator[bytes]:
    """The file's text, decompressed if it is gzip, block by block (gzip: by
    ``reader.gunzip``, each member once).

    Raises:
        NotLines: the gzip stream is cut or damaged (the general reader names it).
    """
    data = f.read(BLOCK)
    if not data.startswith(GZIP_MAGIC):
        yield data
        while block := f.read(BLOCK):
            yield block
        return
    fault = yield from gunzip(f.read, data)
    if fault is not None:
        raise NotLines


def _checked(text: Iterator[bytes], lines: LineCheck) -> Iterator[bytes]:
    """text, each block given to lines first (a line too long raises there)."""
    for block in text:
        lines.add(block)
        yield block


def blocks(f: IO[bytes], where: str | None = None) -> Generator[bytes, None, dict[str, Any]]:
    """The file's events as JSON arrays of whole events; returns its other members.

    Yields ``b"[...]"`` texts, each a run of complete events in file order;
    the generator's return value is every top-level member but the events
    (``{}`` for the array form).  Linear in the text: each byte is searched
    once for the end of a line and of the events.

    Args:
        f: the file, open for reading bytes.
        where: the file as messages name it (default: ``f.name``).

    Raises:
        NotLines: the file is not in the one-event-per-line shape, or is cut
            short or damaged (the caller then reads it the general way).
        TraceFormatError: a line longer than ``reader.MAX_LINE``, or text
            that is only whitespace: no reading would take the file.
    """
    where = where if where is not None else shown(str(getattr(f, "name", "the file")))
    text = _checked(_text(f), LineCheck(where))
    head = b""
    offset = 0  # where head, then pending, begins in the text
    opening = None
    for block in text:
        head += block
        if not head.strip():  # whitespace before the trace: nothing to keep
            offset += len(head)
            head = b""
            continue
        opening = _OPENING.match(head)
        if opening is not None or len(head) >= _HEAD_LIMIT:
            break
    if opening is None:
        if not head:  # the text ended, whole, and held nothing but whitespace
            raise TraceFormatError(f"{where}: the file is empty, not a trace")
        raise NotLines
    # A bytearray: text is appended in place (a long line comes in many
    # pieces: bytes would be copied whole at each).
    pending = bytearray(head[opening.end() :])
    offset += opening.end()
    if pending.lstrip().startswith(b"]"):
        pending[:0] = b"\n"  # an empty array: its closing, as a line of its own
        offset -= 1
    # pending[:scanned] holds no closing of the events, and its last newline
    # is at last_nl (-1: none): only what follows is searched again.
    scanned = 0
    last_nl = -1
    while True:
        closing = _CLOSING.match(pending, last_nl) if last_nl >= 0 else None
        if closing is None:
            closing = _CLOSING.search(pending, max(scanned, last_nl + 1))
        if closing is not None:
            if pending[: closing.start()].strip():
                yield _array(pending[: closing.start()])
            tail = bytearray(pending[closing.end() :])
            for rest in text:  # the members after the events: a trailer, bounded
                tail += rest
                if len(tail) > MAX_LINE:
                    raise TraceFormatError(
                        f"{where}: more than {MAX_LINE >> 20} MiB of text after the events "
                        f"(at byte {offset + closing.end()}): not a trace mxprof reads"
                    )
            return members(opening.group("members"), bytes(tail))
        found = pending.rfind(b"\n", scanned)
        if found >= 0:
            last_nl = found
        if last_nl > 0:
            if pending[:last_nl].strip():
                yield _array(pending[:last_nl])
            del pending[:last_nl]
            offset += last_nl
            last_nl = 0
        scanned = len(pending)
        more = next(text, None)
        if more is None:
            raise NotLines  # the text ends inside the events: a cut file
        pending += more


def metadata(f: IO[bytes]) -> dict[str, Any]:
    """The top-level members other than the events, read from the file's two
    ends when it is plain text (seekable, not gzip), else from all of it.

    The middle is not read: a damaged event there shows only when the events
    are read.

    Raises:
        NotLines: not in the one-event-per-line shape, or damaged.
    """
    size = f.seek(0, 2)
    f.seek(0)
    # A small read of each end first (a window of many files reads little
    # else), then a block of each, then all of it.
    for ends in (_ENDS, BLOCK):
        f.seek(0)
        head = f.read(ends)
        if head.startswith(GZIP_MAGIC) or size <= 2 * ends:
            continue
        opening = _OPENING.match(head)
        f.seek(size - ends)
        tail = f.read()
        # The first line opening with ']' in the last piece closes the events
        # (unless what follows them is longer than the piece: then it fails to parse).
        closing = _CLOSING.search(tail)
        if opening is not None and closing is not None:
            try:
                return members(opening.group("members"), tail[closing.end() :])
            except NotLines:
                pass
    f.seek(0)
    blocks_ = blocks(f)
    while True:
        try:
            next(blocks_)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def _array(body: bytes | bytearray) -> bytes:
    """A run of events, with the commas between them, as one JSON array."""
    return b"[" + body.strip().strip(b",") + b"]"


def members(members: bytes | None, tail: bytes) -> dict[str, Any]:
    """The top-level members other than the events, from the text around them."""
    if members is None:
        if tail.strip():
            raise NotLines
        return {}
    doc_text = (b"{" + members + b'"traceEvents":[]' + tail).decode("utf-8-sig", "replace")
    try:
        doc = _DECODER.decode(doc_text)
    except (RecursionError, ValueError):  # JSONDecodeError, too deep, too many digits
        raise NotLines from None
    if not isinstance(doc, dict):
        raise NotLines
    doc.pop("traceEvents", None)
    return doc


def raw_events(text: bytes) -> list[dict[str, Any]]:
    """A run of events (``blocks``' form) as the dicts in the file.

    Raises:
        NotLines: the run is not an array of objects.
    """
    try:
        events = _DECODER.decode(text.decode("utf-8", "replace"))
    except (RecursionError, ValueError):  # JSONDecodeError, too deep, too many digits
        raise NotLines from None
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise NotLines
    return events


# ---- the index in the trailer of mxprof's own JSON files ----

INDEX_KEY = "mxprofIndex"
_INDEX_FIELDS = 7  # offset, bytes, first ns, last ns, first frame, last frame, defines
_TAIL_START = b'{"name":"process_name","ph":"M"'


class Block(NamedTuple):
    """One block of a file's events as its index names it (see ``index``)."""

    offset: int  # where it begins in the file
    size: int  # its bytes
    first_ns: int  # the earliest start of its events, ns from ts 0
    last_ns: int  # the latest end of its events
    first_frame: int  # the frame indexes of its steps (-1: it has none)
    last_frame: int
    defines: bool  # it defines sample ids: its metadata events are needed by any window


def index(metadata: dict[str, Any], size: int) -> list[Block] | None:
    """The blocks of events a file's trailer lists (the core writes one per
    flush that wrote events), checked; None where there is no index or it
    does not fit the file (then read it whole)."""
    raw = metadata.get(INDEX_KEY)
    if not isinstance(raw, list) or not raw:
        return None
    blocks = []
    end = 0
    for entry in raw:
        if (
            not isinstance(entry, list)
            or len(entry) != _INDEX_FIELDS
            or not all(type(v) is int for v in entry)
        ):
            return None
        offset, size_, first_ns, last_ns, first_frame, last_frame, defines = entry
        block = Block(offset, size_, first_ns, last_ns, first_frame, last_frame, defines != 0)
        if block.offset < end or block.size <= 0:
            return None
        end = block.offset + block.size
        blocks.append(block)
    return blocks if end <= size else None


def indexed_blocks(
    f: IO[bytes], blocks: list[Block], keep: Callable[[Block], bool]
) -> Iterator[bytes]:
    """``blocks``' texts of a plain file, reading only the head, the tail and
    the indexed blocks ``keep`` takes: the events before the first block (the
    process's name), those blocks', and the tail's (every thread's name).

    Every block taken is checked before anything is yielded (whole lines of
    events where the index says, the tail where it ends), so a file changed
    since its index was written raises ``NotLines`` up front and the caller
    reads it whole.

    Raises:
        NotLines: the file does not match its index.
    """
    taken = [b for b in blocks if keep(b)]
    for b in taken:
        f.seek(b.offset)
        first = f.read(1)
        f.seek(b.offset + b.size - 2)
        if first != b"{" or f.read(2) != b",\n":
            raise NotLines
    f.seek(0)
    head = f.read(blocks[0].offset)
    opening = _OPENING.match(head)
    if opening is None:
        raise NotLines
    end = blocks[-1].offset + blocks[-1].size
    f.seek(end)
    tail = f.read(MAX_LINE + 1)
    closing = _CLOSING.search(b"\n" + tail)
    # The core's tail begins with the process's name: where the index says.
    if closing is None or not tail.startswith(_TAIL_START):
        raise NotLines
    if head[opening.end() :].strip():
        yield _array(head[opening.end() :])
    for b in taken:
        f.seek(b.offset)
        left = b.size
        carry = b""
        while left > 0:  # a big block in pieces, each cut at its last newline
            piece = carry + f.read(min(BLOCK, left))
            left = b.size - (f.tell() - b.offset)
            cut = piece.rfind(b"\n") + 1 if left > 0 else len(piece)
            if cut <= 0:
                carry = piece
                continue
            yield _array(piece[:cut])
            carry = piece[cut:]
    events = tail[: max(closing.start() - 1, 0)]
    if events.strip():
        yield _array(events)


# ---- a window of time: only what may overlap it ----

# A run holding B/E or b/e halves is kept whole: a half outside the window may
# pair with one inside, and the pairs are made after the cut.
_HALVES = re.compile(rb'"ph"\s*:\s*"[BEbe]"')


def near(text: bytes, first: float, last: float) -> bytes:
    """A run of events (one per line, ``blocks``' form) cut to those that may
    overlap [first, last] (µs on the file's own axis) and those without a time.

    Decoded typed first (fast), so only the lines kept are decoded again as
    dicts; the run comes back whole where it does not decode that way or is
    not one event per line.
    """
    try:
        events = DECODE_EVENTS(text)
    except msgspec.ValidationError:
        return text  # a value the fast decoding does not take: every event, as dicts
    keep = [
        k
        for k, e in enumerate(events)
        if e.ts is None or (e.ts <= last and e.ts + (e.dur or 0) >= first)
    ]
    if len(keep) == len(events):
        return text
    lines = text[1:-1].split(b"\n")
    if len(lines) != len(events):
        return text  # not one event per line after all
    return b"[" + b",".join(lines[k].rstrip().rstrip(b",") for k in keep) + b"]"


def window_events(
    path: PathArg, start_ns: float, end_ns: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events of a file in mxprof's shape that may overlap [start_ns,
    end_ns] (its own ts axis; the caller cuts exactly), as dicts, and its
    top-level members.

    A plain file with an index (``index``) is read at its head, its tail and
    the blocks whose span overlaps the window (and those that define sample
    ids); one without (gzip, another writer, an index that no longer fits the
    file) is read whole, block by block, decoding as dicts only the events
    that may overlap.

    Raises:
        NotLines: not in the one-event-per-line shape, cut short or damaged:
            read it whole the general way.
    """
    lo, hi = start_ns / 1000 - 1, end_ns / 1000 + 1  # µs, a rounding's margin

    def cut(text: bytes) -> list[dict[str, Any]]:
        return raw_events(text if _HALVES.search(text) else near(text, lo, hi))

    with open_trace(path) as f:
        members_ = metadata(f)
        plain = f.seek(0) == 0 and f.read(2) != GZIP_MAGIC
        blocks_ = index(members_, f.seek(0, 2)) if plain else None
    if blocks_ is not None:

        def keep(b: Block) -> bool:
            return b.defines or (b.first_ns <= hi * 1000 and b.last_ns >= lo * 1000)

        with open(path, "rb") as f:
            try:
                return [e for text in indexed_blocks(f, blocks_, keep) for e in cut(text)], members_
            except NotLines:
                pass  # changed since its index was written: read it all (below)
    with open_trace(path) as f:
        return [e for text in blocks(f) for e in cut(text)], members_
