"""MXNet's deprecated profiler functions, kept so old code runs unchanged.

Each warns ``DeprecationWarning`` on every call and forwards to the current
API, as MXNet's wrappers did.
"""

from __future__ import annotations

import warnings

from . import control
from .errors import ConfigError

_MODES = {"symbolic": "profile_symbolic", "all": "profile_all"}


def profiler_set_config(mode: str = "symbolic", filename: str = "profile.json") -> None:
    """Deprecated: use ``set_config(profile_<mode>=True, filename=...)``.

    Example:
        >>> import mxprof
        >>> mxprof.profiler_set_config(mode="all", filename="old.json")  # doctest: +SKIP
    """
    warnings.warn(
        "profiler_set_config() is deprecated; use set_config()", DeprecationWarning, stacklevel=2
    )
    key = _MODES.get(mode) if isinstance(mode, str) else None
    if key is None:
        raise ConfigError(f"mode must be 'symbolic' or 'all', got {mode!r}")
    control.set_config(**{key: True, "filename": filename})


def profiler_set_state(state: str = "stop") -> None:
    """Deprecated: use ``set_state(state)``.  Example: ``profiler_set_state('run')``."""
    warnings.warn(
        "profiler_set_state() is deprecated; use set_state()", DeprecationWarning, stacklevel=2
    )
    control.set_state(state)


def dump_profile() -> None:
    """Deprecated: use ``dump(finished=True)``.  Example: ``dump_profile()``."""
    warnings.warn("dump_profile() is deprecated; use dump()", DeprecationWarning, stacklevel=2)
    control.dump(True)
