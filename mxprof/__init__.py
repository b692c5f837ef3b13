"""mxprof: a low-overhead profiler with Apache MXNet's profiler API and a C core.

Code written for ``mxnet.profiler`` runs with ``import mxprof as profiler``::

    import mxprof as profiler
    profiler.set_config(filename="trace.json", aggregate_stats=True)
    domain = profiler.Domain("train")
    step = domain.new_task("step")
    profiler.set_state("run")
    with step:
        ...
    profiler.set_state("stop")
    profiler.dump()
    print(profiler.dumps())

Importing the package starts nothing.  The live profiler (the compiled core,
and the session with its exit, fork and signal hooks) loads at the first use
of one of its names (``set_config``, ``Domain``, ``dumps``, ...), or when one
of its modules is imported.  Reading traces (``load``, ``mxprof.trace``) never
loads it.
"""

import importlib as _importlib
import sys as _sys
import types as _types
import typing as _typing

from ._version import __version__
from .errors import (
    ConfigError,
    DeviceUnavailable,
    OutputError,
    ProfilerError,
    StateError,
    TraceFormatError,
    TraceReadError,
)

if _typing.TYPE_CHECKING:
    from . import flight as flight
    from . import memory
    from ._capi import C_API as _C_API  # noqa: F401 - the capsule, not in __all__
    from ._include import get_include
    from .compat import dump_profile, profiler_set_config, profiler_set_state
    from .control import dump, pause, resume, set_config, set_state
    from .counter import Counter
    from .domain import Domain
    from .flight import trigger
    from .marker import Marker
    from .ranges import Event, Frame, Task
    from .report import report
    from .report.diff import diff
    from .report.sql import sql
    from .schedule import ProfilerAction, profile, record_function, schedule
    from .schedule import record_function as range  # noqa: F401 - not in __all__ (the builtin)
    from .scope import current_scope, scope
    from .stats import dumps
    from .trace import load

__all__ = [
    "ConfigError",
    "Counter",
    "DeviceUnavailable",
    "Domain",
    "Event",
    "Frame",
    "Marker",
    "OutputError",
    "ProfilerAction",
    "ProfilerError",
    "StateError",
    "Task",
    "TraceFormatError",
    "TraceReadError",
    "__version__",
    "current_scope",
    "diff",
    "dump",
    "dump_profile",
    "dumps",
    "get_include",
    "load",
    "memory",
    "pause",
    "profiler_set_config",
    "profile",
    "profiler_set_state",
    "record_function",
    "report",
    "resume",
    "schedule",
    "scope",
    "set_config",
    "set_state",
    "sql",
    "trigger",
]

# The live API: name -> (module, attribute; None: the module itself).
_LIVE: dict[str, tuple[str, _typing.Optional[str]]] = {
    "Counter": ("counter", "Counter"),
    "Domain": ("domain", "Domain"),
    "Event": ("ranges", "Event"),
    "Frame": ("ranges", "Frame"),
    "Marker": ("marker", "Marker"),
    "ProfilerAction": ("schedule", "ProfilerAction"),
    "Task": ("ranges", "Task"),
    "current_scope": ("scope", "current_scope"),
    "dump": ("control", "dump"),
    "dump_profile": ("compat", "dump_profile"),
    "dumps": ("stats", "dumps"),
    "trigger": ("flight", "trigger"),
    "memory": ("memory", None),
    "pause": ("control", "pause"),
    "profile": ("schedule", "profile"),
    "profiler_set_config": ("compat", "profiler_set_config"),
    "profiler_set_state": ("compat", "profiler_set_state"),
    "range": ("schedule", "record_function"),
    "record_function": ("schedule", "record_function"),
    "resume": ("control", "resume"),
    "schedule": ("schedule", "schedule"),
    "scope": ("scope", "scope"),
    "set_config": ("control", "set_config"),
    "set_state": ("control", "set_state"),
}
# The offline API: reading traces needs neither the core nor a session.
_OFFLINE: dict[str, tuple[str, _typing.Optional[str]]] = {
    "diff": ("report.diff", "diff"),
    "load": ("trace", "load"),
    "sql": ("report.sql", "sql"),
    "report": ("report", None),  # the package, callable as its report()
    "get_include": ("_include", "get_include"),
}
# The C API's capsule loads the core but not the session: native code records
# under whatever state the Python side sets.
_CORE_ONLY: dict[str, tuple[str, _typing.Optional[str]]] = {
    "_C_API": ("_capi", "C_API"),
}
# Modules that ``import mxprof`` loaded when it loaded everything: still
# attributes of the package, each imported when first asked for.
_SUBMODULES = frozenset(
    {
        "_children", "_native", "_session", "_signals", "_tasks", "_threads", "_tracejson",
        "_render", "averages", "compat", "config", "control", "counter", "domain", "flight",
        "marker", "memory", "ranges", "schedule", "scope", "stats", "trace",
    }
)  # fmt: skip


def _load_live() -> None:
    """Import the live tier and bind its public names here, all at once:
    after this the package is what ``import mxprof`` used to give."""
    values: dict[str, object] = {}
    for name, (module, attribute) in _LIVE.items():
        loaded = _importlib.import_module(f"{__name__}.{module}")
        values[name] = loaded if attribute is None else getattr(loaded, attribute)
    globals().update(values)
    # The control endpoint of `mxprof ctl` opens with the live tier.
    _importlib.import_module(f"{__name__}._ctlserver").start()


def __getattr__(name: str) -> _typing.Any:
    if name in _LIVE:
        _load_live()
        return globals()[name]
    if name in _OFFLINE or name in _CORE_ONLY:
        module, attribute = _OFFLINE.get(name) or _CORE_ONLY[name]
        loaded = _importlib.import_module(f"{__name__}.{module}")
        value = loaded if attribute is None else getattr(loaded, attribute)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the package's submodules and the usual module
    attributes; not this module's own machinery."""
    names = set(__all__) | set(_LIVE) | set(_OFFLINE) | _SUBMODULES
    for name, value in globals().items():
        if isinstance(value, _types.ModuleType):
            if value.__name__.startswith(f"{__name__}."):
                names.add(name)
        elif name.startswith("__") and name not in ("__getattr__", "__dir__", "__annotations__"):
            names.add(name)
    return sorted(names)


class _Package(_types.ModuleType):
    """The package object: importing submodule ``mxprof.scope`` (or
    ``mxprof.schedule``) must not hide the function of that name, which the
    import system would do by setting the submodule as an attribute here."""

    def __setattr__(self, name: str, value: _typing.Any) -> None:
        target = _LIVE.get(name) or _OFFLINE.get(name) or _CORE_ONLY.get(name)
        if target is not None and target[1] is not None and isinstance(value, _types.ModuleType):
            return  # the submodule stays in sys.modules; the name keeps the API object
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
