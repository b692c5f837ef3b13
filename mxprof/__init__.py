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
"""

from . import memory
from ._version import __version__
from .compat import dump_profile, profiler_set_config, profiler_set_state
from .control import dump, pause, resume, set_config, set_state
from .counter import Counter
from .domain import Domain
from .errors import (
    ConfigError,
    DeviceUnavailable,
    OutputError,
    ProfilerError,
    StateError,
    TraceFormatError,
    TraceReadError,
)
from .marker import Marker
from .ranges import Event, Frame, Task
from .schedule import ProfilerAction, profile, record_function, schedule
from .schedule import record_function as range  # noqa: F401 - mxprof.range; not in __all__ (it would shadow the builtin)
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
    "dump",
    "dump_profile",
    "dumps",
    "load",
    "memory",
    "pause",
    "profiler_set_config",
    "profile",
    "profiler_set_state",
    "record_function",
    "resume",
    "schedule",
    "scope",
    "set_config",
    "set_state",
]
