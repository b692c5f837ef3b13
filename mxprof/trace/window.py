"""``load(path, window=(start, end))``: the events of a trace that overlap a
span of time, reading only the blocks that may hold them.

A file in mxprof's own shape with an index in its trailer (``_scan.index``)
is read at its head, its tail and the indexed blocks whose span overlaps the
window; one without an index is read block by block, and only the events
that may overlap are decoded as dicts (``_scan.window_events``).  Any other
file (another tool's, gzip of another shape, Perfetto protobuf, a file cut
short) is loaded whole and then cut.  Whatever the path, the events are
those ``load(path).filter(start=start, end=end)`` keeps: every event that
overlaps ``[start, end]``, ranges whole.

What differs from the whole load: a range's self time is that of the events
read (a child outside the window is not subtracted from a parent that
overlaps it), and only the stack samples taken inside the window are kept.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from . import _scan
from .model import Trace, load
from .reader import PathArg
from .samples import Samples

__all__ = ["checked", "load_window"]


def checked(window: Sequence[float]) -> tuple[float, float]:
    """``window`` as (start, end) ns, or why not.

    Raises:
        ValueError: not two finite numbers, or the end before the start.

    Example:
        >>> checked((0, 5_000_000))
        (0.0, 5000000.0)
    """
    if isinstance(window, (str, bytes)) or not isinstance(window, Sequence) or len(window) != 2:
        raise ValueError(f"window must be (start_ns, end_ns), got {window!r}")
    start, end = window
    for value in (start, end):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise ValueError(f"window must be two finite numbers of ns, got {window!r}")
    if end < start:
        raise ValueError(f"window {window!r}: the end comes before the start")
    return float(start), float(end)


def load_window(path: PathArg, window: Sequence[float]) -> Trace:
    """The trace at path cut to the events overlapping window (ns on its own
    ts axis, as ``Trace.filter``'s start and end).

    Raises:
        ValueError: a window that is not (start, end) (``checked``).
        TraceReadError, TraceFormatError: as ``load``.
    """
    start, end = checked(window)
    try:
        events, metadata = _scan.window_events(path, start, end)
    except _scan.NotLines:  # another shape, cut short or damaged: load names what
        whole = load(path)
    else:
        whole = Trace.from_raw(events, metadata=metadata, path=os.fspath(path))
    cut = whole.filter(start=start, end=end)
    cut.samples = Samples([s for s in whole.samples.samples if start <= s.ts <= end])
    return cut
