"""Rewrite a trace cut short (a process killed mid-write) or damaged as a valid one."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ..errors import TraceFormatError
from .nvidia import is_database
from .perfetto import looks_like_perfetto, read_perfetto
from .reader import open_trace, salvage, shown
from .writer import PERFETTO, encode, file_format


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """A protobuf varint at pos: (value, end), or None if the data ends first."""
    value, shift = 0, 0
    while pos < len(data):
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
    return None


def _perfetto_prefix(data: bytes) -> tuple[int, int]:
    """(bytes, packets) of the longest run of whole packets at the start."""
    pos = packets = 0
    while pos < len(data) and data[pos] == 0x0A:  # Trace.packet: field 1, length-delimited
        found = _varint(data, pos + 1)
        if found is None or found[1] + found[0] > len(data):
            break
        pos, packets = found[1] + found[0], packets + 1
    return pos, packets


def _write_atomically(target: str, payload: bytes) -> None:
    folder = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".mxprof-repair-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as raw:
            raw.write(payload)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def repair(
    path: str | os.PathLike[str], output: str | os.PathLike[str] | None = None
) -> dict[str, Any]:
    """Keep every complete event of a trace file and write them as a valid trace.

    What the readers refuse, repair reads as far as it goes: a file cut short
    by any writer, a gzip stream damaged or cut (the events its intact part
    holds are kept).

    The output is in the format its name gives, as for every file mxprof
    writes (``.json``, ``.gz``, ``.pftrace``/``.perfetto-trace``).  From
    Chrome JSON the object form is written, with the top-level members that
    survived the cut (mxprof writes ``baseTimeNanoseconds`` and the process's
    and threads' names before the events, so they survive a cut after them).
    From Perfetto protobuf to Perfetto, the whole packets before the cut are
    kept as they are ("events" then counts packets).

    Args:
        path: the trace to repair.
        output: where to write (default: over ``path``, replaced atomically).

    Returns:
        ``{"events": n, "truncated": bool, "problem": str | None}``: how many
        events were kept, whether the input was cut short or damaged (False:
        it was already complete and is written again with the same content),
        and what was wrong with it.

    Raises:
        TraceReadError: the input cannot be read (no such file ...).
        TraceFormatError: the input is not a trace, even cut short, or holds
            nothing complete (no event, no member) before its cut or damage:
            nothing is written.

    Example:
        >>> repair("crashed.json")  # doctest: +SKIP
        {'events': 81234, 'truncated': True, 'problem': 'the text ends inside the trace: ...'}
    """
    source = os.fspath(path)
    target = os.fspath(output) if output is not None else source
    fmt = file_format(target)
    data = b""
    if file_format(source) == PERFETTO and fmt == PERFETTO:
        with open_trace(source) as f:
            data = f.read()
    if data and looks_like_perfetto(data):
        # Packets kept as they are, once the reader has taken them: damage
        # (text, another format under this name) raises, naming the file, and
        # a file without one whole packet is refused: nothing is written.
        where = shown(source)
        read_perfetto(data, where)
        size, packets = _perfetto_prefix(data)
        cut = "the file ends inside a packet: it was cut short" if size < len(data) else None
        if packets == 0:
            raise TraceFormatError(f"{where}: {cut}, with nothing before it: nothing to keep")
        _write_atomically(target, data[:size])
        return {"events": packets, "truncated": cut is not None, "problem": cut}
    if target == source and is_database(source):  # NVIDIA-IMPORT HOOK: never over a database
        raise TraceFormatError(
            f"{source}: an NVIDIA profiler database, not a trace to repair in place; "
            "give -o to write it as a trace"
        )
    events, metadata, problem = salvage(source)
    if problem is not None and not events and not metadata:
        # Nothing readable before the damage: writing an empty trace (over
        # the input, by default) would only lose what someone might still read.
        where = shown(source)
        raise TraceFormatError(f"{where}: {problem}, with nothing before it: nothing to keep")
    doc: dict[str, Any] = dict(metadata)
    doc["traceEvents"] = events
    if problem is not None:
        other = doc.setdefault("otherData", {})
        if isinstance(other, dict):
            other["repaired"] = True  # the trailer with the final tallies was lost
    _write_atomically(target, encode(doc, fmt))
    return {"events": len(events), "truncated": problem is not None, "problem": problem}
