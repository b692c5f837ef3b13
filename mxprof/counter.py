"""Counter: a signed 64-bit value sampled into the trace on every change."""

from __future__ import annotations

from . import _native
from ._native import lib
from ._threads import register_current
from .domain import Domain, Named, check_domain

_set = lib.mxp_counter_set
_add = lib.mxp_counter_add
_value = lib.mxp_counter_value


class Counter(Named):
    """A named int64 counter; every change while recording is a ``"ph":"C"`` sample.

    Counters with the same domain and name are one counter.  ``value`` sees
    every change in every state; only samples depend on the state.  Adding
    past the int64 range saturates; decrementing below zero goes negative.

    Args:
        domain: the Domain it belongs to.
        name: its name.
        value: an initial value to set (None: leave it as it is).

    Example:
        >>> import mxprof
        >>> seen = mxprof.Counter(mxprof.Domain("data"), "samples", 0)
        >>> seen += 32
        >>> seen.increment(); seen.decrement(3)
        >>> seen.value
        30
    """

    __slots__ = ()
    _kind = _native.KIND_COUNTER

    def __init__(self, domain: Domain, name: str, value: int | None = None) -> None:
        super().__init__(check_domain(domain, "Counter"), name)
        if value is not None and lib.mxp_counter_init(self._id, value) == 1:
            register_current()

    @property
    def value(self) -> int:
        """The current value."""
        return int(_value(self._id))

    def set_value(self, value: int) -> None:
        """Set the value.  Example: ``counter.set_value(5)``."""
        if _set(self._id, value):
            register_current()

    def increment(self, delta: int = 1) -> None:
        """Add delta.  Example: ``counter.increment(4)``."""
        if _add(self._id, delta):
            register_current()

    def decrement(self, delta: int = 1) -> None:
        """Subtract delta.  Example: ``counter.decrement()``."""
        if _add(self._id, -delta):
            register_current()

    def __iadd__(self, delta: int) -> Counter:
        if _add(self._id, delta):
            register_current()
        return self

    def __isub__(self, delta: int) -> Counter:
        if _add(self._id, -delta):
            register_current()
        return self

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, value={self.value})"
