"""Marker: an instant event."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _native
from ._named import Named, check_domain

# Bound as a module global: one cffi call per mark, no lookup on _native.
from ._native import marker_mark as _mark
from ._threads import register_current
from .errors import ConfigError

if TYPE_CHECKING:
    from .domain import Domain

# MXNet's (and ITT's) scope names and values.
SCOPES = {"global": 1, "process": 2, "thread": 3, "task": 4, "marker": 5}


class Marker(Named):
    """A named instant: ``"ph":"i"`` in the trace, with ``s`` from its scope.

    Example:
        >>> import mxprof
        >>> epoch_end = mxprof.Marker(mxprof.Domain("train"), "epoch end")
        >>> epoch_end.mark("process")
    """

    __slots__ = ()
    _kind = _native.KIND_MARKER

    def __init__(self, domain: Domain, name: str) -> None:
        super().__init__(check_domain(domain, "Marker"), name)

    def mark(self, scope: Any = "process") -> None:
        """Record the instant now.

        Args:
            scope: 'global', 'process', 'thread', 'task' or 'marker'.  In the
                trace, global is ``s:"g"``, process ``"p"`` and the rest
                ``"t"``; ``args.scope`` keeps the name.

        Raises:
            ConfigError: an unknown scope (in any profiler state).
        """
        # The core rejects scope 0 before anything else, in any state.
        try:
            rc = _mark(self._id, SCOPES.get(scope, 0))
        except TypeError:  # unhashable: not a scope name either
            rc = _mark(self._id, 0)
        if rc:
            if rc < 0:
                raise ConfigError(
                    f"unknown marker scope {scope!r}; valid scopes: {', '.join(SCOPES)}"
                )
            register_current()
