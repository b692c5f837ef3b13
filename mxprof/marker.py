"""Marker: an instant event."""

from __future__ import annotations

from typing import Any

from . import _native
from ._native import lib
from ._threads import register_current
from .domain import Domain, check_domain, check_name
from .errors import ConfigError

# MXNet's (and ITT's) scope names and values.
SCOPES = {"global": 1, "process": 2, "thread": 3, "task": 4, "marker": 5}

_mark = lib.mxp_marker_mark


class Marker:
    """A named instant: ``"ph":"i"`` in the trace, with ``s`` from its scope.

    Example:
        >>> import mxprof
        >>> epoch_end = mxprof.Marker(mxprof.Domain("train"), "epoch end")
        >>> epoch_end.mark("process")
    """

    __slots__ = ("_name", "_domain", "_id")

    def __init__(self, domain: Domain, name: str) -> None:
        self._domain = check_domain(domain, "Marker")
        self._name = check_name(name, "Marker name")
        self._id = _native.register(_native.KIND_MARKER, domain._utf8, name.encode("utf-8"))

    @property
    def name(self) -> str:
        return self._name

    @property
    def domain(self) -> Domain:
        return self._domain

    def mark(self, scope: Any = "process") -> None:
        """Record the instant now.

        Args:
            scope: 'global', 'process', 'thread', 'task' or 'marker'.  In the
                trace, global is ``s:"g"``, process ``"p"`` and the rest
                ``"t"``; ``args.scope`` keeps the name.

        Raises:
            ConfigError: an unknown scope (in any profiler state).
        """
        code = SCOPES.get(scope) if isinstance(scope, str) else None
        if code is None:
            raise ConfigError(f"unknown marker scope {scope!r}; valid scopes: {', '.join(SCOPES)}")
        if _mark(self._id, code) == 1:
            register_current()

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"Marker({self._domain.name!r}, {self._name!r})"
