"""Domain: a named group of tasks, frames, counters and markers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, SupportsInt

from . import _native
from ._native import utf8
from .errors import ConfigError

if TYPE_CHECKING:
    from .counter import Counter
    from .marker import Marker
    from .ranges import Frame, Task


def check_name(name: Any, what: str) -> str:
    """A non-empty str that is valid Unicode text, else TypeError / ConfigError."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise ConfigError(f"{what} must not be empty")
    utf8(name, what)
    return name


class Domain:
    """A named group of profiling objects; its name is their trace category.

    Args:
        name: a non-empty name.

    Example:
        >>> import mxprof
        >>> d = mxprof.Domain("training")
        >>> step = d.new_task("step")
        >>> str(d)
        'training'
    """

    __slots__ = ("_name", "_utf8")

    def __init__(self, name: str) -> None:
        self._name = check_name(name, "Domain name")
        self._utf8 = name.encode("utf-8")

    @property
    def name(self) -> str:
        """The domain's name."""
        return self._name

    def new_task(self, name: str) -> Task:
        """A ``Task`` in this domain.  Example: ``d.new_task("forward")``."""
        return ranges.Task(self, name)

    def new_frame(self, name: str) -> Frame:
        """A ``Frame`` in this domain.  Example: ``d.new_frame("step")``."""
        return ranges.Frame(self, name)

    def new_counter(self, name: str, value: SupportsInt | None = None) -> Counter:
        """A ``Counter`` in this domain.  Example: ``d.new_counter("bytes", 0)``."""
        return counter.Counter(self, name, value)

    def new_marker(self, name: str) -> Marker:
        """A ``Marker`` in this domain.  Example: ``d.new_marker("epoch")``."""
        return marker.Marker(self, name)

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"Domain({self._name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Domain) and other._name == self._name

    def __hash__(self) -> int:
        return hash(("mxprof.Domain", self._name))


def check_domain(domain: Any, what: str) -> Domain:
    if not isinstance(domain, Domain):
        raise TypeError(f"{what} needs an mxprof.Domain, got {type(domain).__name__} {domain!r}")
    return domain


class Named:
    """What every profiling object shares: a name, a domain, the core's id.

    The id is interned once here, so the hot path passes only the integer.
    """

    __slots__ = ("_name", "_domain", "_id")
    _kind = 0  # an MXP_KIND_* of the subclass

    def __init__(self, domain: Domain | None, name: str) -> None:
        self._name = check_name(name, f"{type(self).__name__} name")
        self._domain = domain
        dom = domain._utf8 if domain is not None else b""
        self._id = _native.register(self._kind, dom, self._name.encode("utf-8"))

    @property
    def name(self) -> str:
        """The object's name."""
        return self._name

    @property
    def domain(self) -> Domain | None:
        """The object's domain (None for an Event)."""
        return self._domain

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        dom = f"{self._domain.name!r}, " if self._domain is not None else ""
        return f"{type(self).__name__}({dom}{self._name!r})"


# Last, because these modules import Named from here; the methods above look
# their classes up at call time (an import inside each method cost about a
# microsecond per object made).
from . import counter, marker, ranges  # noqa: E402
