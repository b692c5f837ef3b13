"""Counter: a signed 64-bit value sampled into the trace on every change."""

from __future__ import annotations

from typing import TYPE_CHECKING, SupportsInt

from . import _native
from ._named import Named, check_domain

# The per-event calls, bound as module globals: a lookup on _native (or
# cffi's lib) per update would cost about as much as the call itself.
from ._native import counter_add as _add
from ._native import counter_set as _set
from ._native import counter_sub as _sub
from ._native import counter_value as _value
from ._threads import register_current

if TYPE_CHECKING:
    from .domain import Domain

_MIN = -(2**63)
_MAX = 2**63 - 1
_WIDE = 2**64  # a delta this large ends at a limit whatever the value was

# What cffi raises for an int64 argument it cannot take as is: a float or a
# non-number (TypeError), a value beyond int64 (OverflowError), a numpy NaN
# (ValueError).  The hot calls catch these and take the slow path below, so
# the common case stays one cffi call.  They return from inside the try, so
# that case runs no more bytecode than a bare call (a try is free in 3.11+)
# and register_current() stays outside it.
_REFUSED = (TypeError, ValueError, OverflowError)

# Operations of the slow path.
_INIT, _SET, _ADD, _SUB = range(4)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Counter(Named):
    """A named int64 counter; every change while recording is a ``"ph":"C"`` sample.

    Counters with the same domain and name are one counter.  ``value`` sees
    every change in every state; only samples depend on the state.

    Values and deltas are any real number, taken with ``int()`` as MXNet
    did: floats, numpy scalars, ``Fraction`` and ``Decimal`` are truncated
    toward zero.  A result beyond the int64 range is held at the limit
    (``2**63 - 1`` or ``-2**63``) and tallied as ``saturated_values`` (the
    ``Profiler`` section of :func:`mxprof.dumps`, the trace's ``otherData``);
    decrementing below zero goes negative.  A non-number (a str, None) is a
    ``TypeError`` and NaN or an infinity a ``ValueError``, each naming the
    counter and the value; the counter is then left as it was.

    Args:
        domain: the Domain it belongs to.
        name: its name.
        value: an initial value to set (None: leave it as it is).

    Example:
        >>> import mxprof
        >>> seen = mxprof.Counter(mxprof.Domain("data"), "samples", 0)
        >>> seen += 32
        >>> seen.increment(); seen.decrement(3)
        >>> seen.increment(2.9)  # truncated, as int(2.9)
        >>> seen.value
        32
    """

    __slots__ = ()
    _kind = _native.KIND_COUNTER

    def __init__(self, domain: Domain, name: str, value: SupportsInt | None = None) -> None:
        super().__init__(check_domain(domain, "Counter"), name)
        if value is None:
            return
        try:
            rc = _native.counter_init(self._id, value)
        except _REFUSED:
            rc = self._update(_INIT, value, "the initial value")
        if rc == _native.NEW_THREAD:
            register_current()

    @property
    def value(self) -> int:
        """The current value."""
        return int(_value(self._id))

    def set_value(self, value: SupportsInt) -> None:
        """Set the value.  Example: ``counter.set_value(5)``."""
        try:
            if not _set(self._id, value):
                return
        except _REFUSED:
            if not self._update(_SET, value, "set_value"):
                return
        register_current()

    def increment(self, delta: SupportsInt = 1) -> None:
        """Add delta.  Example: ``counter.increment(4)``."""
        try:
            if not _add(self._id, delta):
                return
        except _REFUSED:
            if not self._update(_ADD, delta, "increment"):
                return
        register_current()

    def decrement(self, delta: SupportsInt = 1) -> None:
        """Subtract delta.  Example: ``counter.decrement()``."""
        try:
            if not _sub(self._id, delta):
                return
        except _REFUSED:
            if not self._update(_SUB, delta, "decrement"):
                return
        register_current()

    def __iadd__(self, delta: SupportsInt) -> Counter:
        try:
            if not _add(self._id, delta):
                return self
        except _REFUSED:
            if not self._update(_ADD, delta, "+="):
                return self
        register_current()
        return self

    def __isub__(self, delta: SupportsInt) -> Counter:
        try:
            if not _sub(self._id, delta):
                return self
        except _REFUSED:
            if not self._update(_SUB, delta, "-="):
                return self
        register_current()
        return self

    def _update(self, op: int, value: object, what: str) -> int:
        """The slow path: what the C call refused, converted with int() and
        held at the int64 limits.  Returns the core's code as the hot calls."""
        number = self._integer(value, what)
        if op == _SUB:
            number = -number
        rc: int
        if _MIN <= number <= _MAX:  # a float, or a number type cffi does not convert
            call = _native.counter_init if op == _INIT else _set if op == _SET else _add
            rc = call(self._id, number)
        elif op in (_INIT, _SET) or abs(number) >= _WIDE:  # the result is a limit
            rc = _native.counter_saturate(self._id, number < 0, op == _INIT)
        else:
            rc = _native.counter_add_wide(self._id, number < 0, abs(number))
        return rc

    def _integer(self, value: object, what: str) -> int:
        """``int(value)`` for a number; an error naming the counter otherwise."""
        if isinstance(value, int):
            return value
        where = f"counter {self._name!r} (domain {self._domain.name!r})"  # type: ignore[union-attr]
        if not isinstance(value, (str, bytes, bytearray)):  # int() would parse these
            try:
                number: int = int(value)  # type: ignore[call-overload]
            except (ValueError, OverflowError) as e:  # NaN, an infinity
                raise ValueError(
                    f"{where}: {what} needs a finite number, got {_shown(value)} ({e})"
                ) from None
            except TypeError:
                pass
            else:
                return number
        raise TypeError(
            f"{where}: {what} needs a real number, got {type(value).__name__} {_shown(value)}"
        )

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, value={self.value})"
