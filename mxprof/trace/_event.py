"""``Event``: one range, instant or counter sample of a loaded trace.

It is a frozen ``msgspec.Struct`` so that a file's text decodes straight into
it (``_scan`` and ``_convert``): the fields are named as Chrome JSON's keys,
``category`` being ``"cat"``, and the times, read in µs, are set to ns before
the event is handed out. Without ``gc`` tracking, ten million of them cost
the collector nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import msgspec

Id = Union[int, str]

if TYPE_CHECKING:
    _Time = int
    _Length = Optional[int]
    _Args = dict[str, Any]
else:  # what decoding takes (and checks), before the times are set in ns
    _Time = _Length = Union[int, float, None]
    _Args = Optional[dict[str, Any]]


class NoArgs(dict):  # type: ignore[type-arg]
    """The empty ``args`` shared by every event that has none: read-only."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("the empty args of an event are shared: copy them to change them")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse


NO_ARGS: dict[str, Any] = NoArgs()


class Event(msgspec.Struct, frozen=True, gc=False):
    """One range, instant or counter sample, times in ns on the trace's own axis.

    ``ph`` is ``'X'`` for every range, whatever phases it was written as (X,
    a B/E pair, a b/e pair); ``dur`` is None for events that are not ranges.
    ``pid`` and ``tid`` are as in the file (Kineto writes some as strings).
    Events without arguments share one empty, read-only ``args``.

    Example:
        >>> e = Event("step", "train", "X", ts=1_000, dur=500, pid=1, tid=1, args={})
        >>> e.end
        1500
    """

    name: str = ""
    category: str = msgspec.field(default="", name="cat")
    ph: str = ""
    ts: _Time = None  # type: ignore[assignment]
    dur: _Length = None
    pid: Id = 0
    tid: Id = 0
    args: _Args = None  # type: ignore[assignment]

    @property
    def end(self) -> int:
        """ts + dur in ns (ts for events that are not ranges)."""
        return self.ts + (self.dur or 0)


DECODE_EVENTS = msgspec.json.Decoder(list[Event]).decode
