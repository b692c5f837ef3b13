"""Clock offsets between processes: NTP-style estimates and linear drift.

A peer sends a ping at t0 (its clock); the rank-0 worker stamps its
arrival t1 and the answer's departure t2 (its clock); the answer arrives at
t3 (the peer's clock).  Then ``offset = ((t1 - t0) + (t2 - t3)) / 2`` is
what to add to the peer's clock to read the rank-0 worker's, and ``delay =
(t3 - t0) - (t2 - t1)`` the time on the wire.  Whatever the asymmetry of the
two directions, the true offset lies within ``delay / 2`` of the estimate,
so the sample of least delay out of several is kept and its ``delay / 2``
is the error bound.

Two estimates (the earliest and the latest, at ``init`` and at ``collect``)
measure a drift, ``(offset_b - offset_a) / (at_b - at_a)``.  Each offset
may be wrong by up to its own error bound, so the drift may be wrong by up
to ``(error_a + error_b) / (at_b - at_a)``: its error bound.  A drift no
larger than that bound is not told apart from none (two estimates 60 ms
apart with 150 µs bounds cannot see less than 5,000 ppm, while clocks
drift by tens of ppm), and applying it would only stretch or squeeze one
process's timeline by noise.  So:

- a drift larger than its error bound is applied: the offset is
  interpolated linearly between the two estimates and held at the nearer
  one outside them;
- otherwise the offset is one constant: the middle of the range that both
  estimates allow (their intervals ``offset ± error`` overlap exactly when
  the drift is within its bound).

Either way, ``t + offset_at(t)`` never decreases as t grows (the applied
drift is above -1, see ``from_json``), so moving both ends of every event
with it keeps ranges nested and back-to-back ranges apart.

All times are integer ns of ``mxp_clock_wall_ns``, the clock traces are
placed on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Estimate:
    """One offset estimate: at peer time ``at_ns``, add ``offset_ns`` (± ``error_ns``)."""

    at_ns: int
    offset_ns: int
    error_ns: int
    samples: int

    def to_json(self) -> dict[str, int]:
        return {
            "at_ns": self.at_ns,
            "offset_ns": self.offset_ns,
            "error_ns": self.error_ns,
            "samples": self.samples,
        }

    @classmethod
    def from_json(cls, data: Any) -> Estimate:
        if not isinstance(data, dict):
            raise ValueError("a clock estimate must be an object")
        values: list[int] = []
        for k in ("at_ns", "offset_ns", "error_ns", "samples"):
            v = data.get(k)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"a clock estimate needs an integer {k!r}, got {data!r}")
            values.append(v)
        if values[2] < 0 or values[3] < 1:
            raise ValueError(f"bad clock estimate {data!r}")
        return cls(*values)


def exchange(t0: int, t1: int, t2: int, t3: int) -> tuple[int, int]:
    """(offset, delay) of one ping; see the module docstring."""
    offset = ((t1 - t0) + (t2 - t3)) // 2
    delay = (t3 - t0) - (t2 - t1)
    return offset, max(delay, 0)


def best(samples: list[tuple[int, int, int, int]]) -> Estimate:
    """The least-delay estimate out of (t0, t1, t2, t3) samples."""
    if not samples:
        raise ValueError("no clock samples")
    scored = [(exchange(*s), s) for s in samples]
    (offset, delay), (t0, _, _, t3) = min(scored, key=lambda x: x[0][1])
    return Estimate((t0 + t3) // 2, offset, (delay + 1) // 2, len(samples))


def _round_div(num: int, den: int) -> int:
    """num / den (den > 0) rounded to the nearest integer, halves up: monotonic in num."""
    return (2 * num + den) // (2 * den)


@dataclass(frozen=True)
class ClockModel:
    """A process's offset to the rank-0 worker over time."""

    estimates: tuple[Estimate, ...]

    @functools.cached_property
    def _span(self) -> tuple[Estimate, Estimate] | None:
        """The earliest and the latest estimate (None without estimates)."""
        if not self.estimates:
            return None
        ordered = sorted(self.estimates, key=lambda e: e.at_ns)
        return ordered[0], ordered[-1]

    @functools.cached_property
    def measured_drift(self) -> float:
        """Offset change per ns between the earliest and the latest estimate
        (0 when they are fewer than two or taken at one instant)."""
        if self._span is None or self._span[1].at_ns == self._span[0].at_ns:
            return 0.0
        a, b = self._span
        return (b.offset_ns - a.offset_ns) / (b.at_ns - a.at_ns)

    @functools.cached_property
    def drift_error(self) -> float:
        """Bound on the error of measured_drift: the two estimates' error
        bounds over the time between them (0 when no drift is measured)."""
        if self._span is None or self._span[1].at_ns == self._span[0].at_ns:
            return 0.0
        a, b = self._span
        return (a.error_ns + b.error_ns) / (b.at_ns - a.at_ns)

    @functools.cached_property
    def drift_applied(self) -> bool:
        """Whether the measured drift exceeds its error bound (compared in
        integers: the offsets differ by more than their two bounds)."""
        if self._span is None or self._span[1].at_ns == self._span[0].at_ns:
            return False
        a, b = self._span
        return abs(b.offset_ns - a.offset_ns) > a.error_ns + b.error_ns

    @property
    def constant(self) -> bool:
        """Whether offset_at is one number whatever the reading (no drift applied)."""
        return not self.drift_applied or self._span is None

    @property
    def drift(self) -> float:
        """The drift offset_at applies: the measured one, or 0 within its error bound."""
        return self.measured_drift if self.drift_applied else 0.0

    @functools.cached_property
    def _constant(self) -> int:
        """The offset when no drift is applied: the middle of what both
        estimates allow (with one estimate, its offset)."""
        if self._span is None:
            return 0
        a, b = self._span
        low = max(a.offset_ns - a.error_ns, b.offset_ns - b.error_ns)
        high = min(a.offset_ns + a.error_ns, b.offset_ns + b.error_ns)
        return (low + high) // 2

    def offset_at(self, t_ns: int) -> int:
        """What to add to the process's clock reading t_ns (integer ns)."""
        if not self.drift_applied or self._span is None:
            return self._constant
        a, b = self._span
        t = min(max(t_ns, a.at_ns), b.at_ns)
        step = _round_div((b.offset_ns - a.offset_ns) * (t - a.at_ns), b.at_ns - a.at_ns)
        return a.offset_ns + step

    @property
    def error_ns(self) -> int:
        """Bound on the error of offset_at at the estimates (and, for a true
        offset that changes linearly, between them): each estimate's bound
        plus how far offset_at lies from that estimate."""
        return max(
            (abs(self.offset_at(e.at_ns) - e.offset_ns) + e.error_ns for e in self._span or ()),
            default=0,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "offset_ns": self.offset_at(self._span[0].at_ns) if self._span else 0,
            "error_ns": self.error_ns,
            "drift": self.drift,
            "measured_drift": self.measured_drift,
            "drift_error": self.drift_error,
            "estimates": [e.to_json() for e in self.estimates],
        }

    @classmethod
    def from_json(cls, data: Any) -> ClockModel:
        """The model of a trace's ``distributedInfo.clock`` (only its
        ``estimates`` are read; the rest is derived from them again).

        Raises:
            ValueError: malformed estimates, or an applied drift of
                magnitude 1 or more (against the rank-0 worker's, the clock
                would stand still, run backwards or run twice as fast).
        """
        if not isinstance(data, dict) or not isinstance(data.get("estimates"), list):
            raise ValueError("clock metadata needs a list 'estimates'")
        model = cls(tuple(Estimate.from_json(e) for e in data["estimates"]))
        if abs(model.drift) >= 1:
            raise ValueError(f"the estimates give an impossible drift of {model.drift:g}")
        return model


IDENTITY = ClockModel(())  # the rank-0 worker's own clock
