"""What every profiling object shares: a checked name, a domain, the core's id.

The objects (``ranges``, ``counter``, ``marker``) build on :class:`Named` and
check their domain with :func:`check_domain`, both from here; ``domain``
builds :class:`mxprof.Domain` on :class:`DomainBase` and adds the factory
methods (``new_task`` ...), importing the objects.  So the objects never
import ``domain``, and there is no import circle between them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from . import _native
from .errors import ConfigError

if TYPE_CHECKING:
    from .domain import Domain


def check_name(name: Any, what: str) -> str:
    """A non-empty str that is valid Unicode text, else TypeError / ConfigError.

    Example:
        >>> check_name("forward", "Task name")
        'forward'
    """
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise ConfigError(f"{what} must not be empty")
    _native.utf8(name, what)
    return name


class DomainBase:
    """A domain's name, checked and encoded once: everything of
    :class:`mxprof.Domain` but its factory methods."""

    __slots__ = ("_name", "_utf8")

    def __init__(self, name: str) -> None:
        self._name = check_name(name, "Domain name")
        self._utf8 = name.encode("utf-8")

    @property
    def name(self) -> str:
        """The domain's name."""
        return self._name

    @property
    def utf8(self) -> bytes:
        """The name as the core keeps it (UTF-8), e.g. to register an object
        in this domain.  Example: ``mxprof.Domain("io").utf8 == b"io"``."""
        return self._utf8

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"Domain({self._name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DomainBase) and other._name == self._name

    def __hash__(self) -> int:
        return hash(("mxprof.Domain", self._name))


def check_domain(domain: Any, what: str) -> Domain:
    """domain itself when it is an :class:`mxprof.Domain`, else TypeError
    naming what needed one.  Example: ``check_domain(d, "Task")``."""
    if not isinstance(domain, DomainBase):
        raise TypeError(f"{what} needs an mxprof.Domain, got {type(domain).__name__} {domain!r}")
    return cast("Domain", domain)  # DomainBase's one subclass


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
    def id(self) -> int:
        """The core's id of the object: what each of its events passes.

        Example: ``mxprof.Event("load").id`` (the same for every object
        of the same kind, domain and name)."""
        return self._id

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
