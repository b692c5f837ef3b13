"""Clock offsets between processes: NTP-style estimates and linear drift.

A peer sends a ping at t0 (its clock); the rank-0 worker stamps its
arrival t1 and the answer's departure t2 (its clock); the answer arrives at
t3 (the peer's clock).  Then ``offset = ((t1 - t0) + (t2 - t3)) / 2`` is
what to add to the peer's clock to read the rank-0 worker's, and ``delay =
(t3 - t0) - (t2 - t1)`` the time on the wire.  Whatever the asymmetry of the
two directions, the true offset lies within ``delay / 2`` of the estimate,
so the sample of least delay out of several is kept and its ``delay / 2``
is the error bound.

Two estimates (at ``init`` and at ``collect``) give a drift: the offset at
time t is interpolated linearly between them (and held at the nearer one
outside them).
All times are ns of ``mxp_clock_wall_ns``, the clock traces are placed on.
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


@dataclass(frozen=True)
class ClockModel:
    """A process's offset to the rank-0 worker over time."""

    estimates: tuple[Estimate, ...]

    @functools.cached_property
    def drift(self) -> float:
        """Offset change per ns of the process's clock (0 with one estimate)."""
        if len(self.estimates) < 2:
            return 0.0
        a, b = self.estimates[0], self.estimates[-1]
        if b.at_ns == a.at_ns:
            return 0.0
        return (b.offset_ns - a.offset_ns) / (b.at_ns - a.at_ns)

    @property
    def error_ns(self) -> int:
        """Bound on the error of offset_at between (and at) the estimates."""
        return max((e.error_ns for e in self.estimates), default=0)

    def offset_at(self, t_ns: float) -> float:
        """What to add to the process's clock reading t_ns: interpolated
        between the estimates; before the first or after the last, that
        estimate's offset (a drift measured over a short span is mostly
        noise, and extending it would multiply the noise)."""
        if not self.estimates:
            return 0.0
        a, b = self.estimates[0], self.estimates[-1]
        t = min(max(t_ns, a.at_ns), b.at_ns)
        return a.offset_ns + self.drift * (t - a.at_ns)

    def to_json(self) -> dict[str, Any]:
        first = self.estimates[0] if self.estimates else None
        return {
            "offset_ns": first.offset_ns if first else 0,
            "error_ns": self.error_ns,
            "drift": self.drift,
            "estimates": [e.to_json() for e in self.estimates],
        }

    @classmethod
    def from_json(cls, data: Any) -> ClockModel:
        if not isinstance(data, dict) or not isinstance(data.get("estimates"), list):
            raise ValueError("clock metadata needs a list 'estimates'")
        return cls(tuple(Estimate.from_json(e) for e in data["estimates"]))


IDENTITY = ClockModel(())  # the rank-0 worker's own clock
