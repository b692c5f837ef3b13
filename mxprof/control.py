"""MXNet's profiler control functions: set_config, set_state, pause, resume, dump."""

from __future__ import annotations

from typing import Any

from . import config
from ._session import SESSION, STATES, check_process
from .config import check_bool
from .errors import ConfigError, OutputError
from .memory import csv_path, write_gpu_csv


def set_config(**kwargs: Any) -> None:
    """Configure the profiler; keys not passed keep their current values.

    Keys (MXNet's names, types and defaults, plus mxprof's ``max_events`` and
    ``write_trace``) are listed in ``mxprof.config.KEYS``.  Every value is
    checked before any is applied.  Changing ``filename`` while a profile is
    open completes the old file; later events go to the new one.  With
    ``profile_process='server'`` (MXNet's kvstore servers) the values go to
    every server of the distributed job instead of this process, and the
    call returns when all have applied them; every control call below takes
    it the same way.  A call that raises changes nothing in this process.

    Args:
        **kwargs: configuration keys and values.

    Raises:
        ConfigError: an unknown key (the message lists the valid ones) or a
            bad value.
        StateError: ``profile_process='server'`` outside a distributed job
            or not on its rank-0 worker.
        mxprof.distributed.DistributedError: a server failed to apply it
            (``DistributedTimeout``: a server is dead or silent).

    Example:
        >>> import mxprof
        >>> mxprof.set_config(filename="trace.json", aggregate_stats=True, dump_period=0.5)
    """
    values = config.validate(kwargs)
    if values.pop("profile_process", "worker") == "server":
        SESSION.remote("set_config", values)
        return
    SESSION.configure(values)
    if "control" in values:
        from . import _ctlserver  # it sits above this module: it calls these functions

        _ctlserver.apply(SESSION.config.control)


def set_state(state: str = "stop", profile_process: str = "worker") -> None:
    """Start (``'run'``) or stop (``'stop'``) recording.

    The first ``'run'`` of a profile sets the trace's time zero; a ``'run'``
    after ``dump(finished=True)`` begins a new profile that rewrites the file.
    ``'stop'`` keeps the profile open, so ``dump()`` still writes it; the
    ranges still open on any thread end there, cut short (``"cut_short"`` in
    their trace args, counted in ``dumps()``), and their own stops later
    record nothing.

    Raises:
        ConfigError: a state other than 'run' / 'stop', or a bad process.

    Example:
        >>> import mxprof
        >>> mxprof.set_state("run")
        >>> mxprof.set_state("stop")
    """
    if state not in STATES:
        raise ConfigError(f"state must be 'run' or 'stop', got {state!r}")
    if check_process(profile_process) == "server":
        SESSION.remote("set_state", {"state": state})
        return
    if state == "run":
        SESSION.run()
    else:
        SESSION.stop()


def pause(profile_process: str = "worker") -> None:
    """Stop recording without ending the state 'run'; ``resume()`` continues.

    Example:
        >>> import mxprof
        >>> mxprof.pause(); mxprof.resume()
    """
    if check_process(profile_process) == "server":
        SESSION.remote("pause", {})
        return
    SESSION.pause()


def resume(profile_process: str = "worker") -> None:
    """Undo ``pause()``.

    Example:
        >>> import mxprof
        >>> mxprof.resume()
    """
    if check_process(profile_process) == "server":
        SESSION.remote("resume", {})
        return
    SESSION.resume()


def dump(finished: bool = True, profile_process: str = "worker") -> None:
    """Write everything recorded so far to the trace file.

    The file is complete JSON afterwards either way.  ``finished=True`` also
    ends the file, and the ranges still open end there, cut short.  Output
    then ends until the next ``set_state('run')`` (a new profile, which
    rewrites the file), and a ``dump()`` until then writes nothing new --
    except that, if the state is still ``'run'``, what is recorded afterwards
    is never lost: the next write that has events for it (a background write,
    ``dump()``, the new profile's start, exit) puts them in a continuation
    file, ``<stem>-1<ext>`` (then ``-2``, ...), and warns naming it.  With
    ``profile_memory``, once GPU allocations have been
    recorded, it also (re)writes MXNet's GPU memory CSV,
    ``<gpu_memory_profile_filename_prefix>-pid_<pid>.csv`` (see
    :func:`mxprof.memory.write_gpu_csv`).

    Raises:
        StateError: the profiler has never run.
        OutputError: the file cannot be written (the events stay in memory and
            go to the next successful write, e.g. after a new filename), or
            the CSV cannot.

    Example:
        >>> import mxprof
        >>> mxprof.set_state("run")
        >>> mxprof.dump(finished=False)   # the file is valid; recording goes on
    """
    finished = check_bool("finished", finished)
    if check_process(profile_process) == "server":
        SESSION.remote("dump", {"finished": finished})
        return
    with SESSION.lock:
        if SESSION.dump(finished) and SESSION.config.enabled("profile_memory"):
            _write_gpu_csv(SESSION.config.gpu_memory_profile_filename_prefix)


def _write_gpu_csv(prefix: str) -> None:
    try:
        write_gpu_csv(prefix)
    except OSError as e:
        path = csv_path(prefix)
        raise OutputError(
            f"cannot write the GPU memory profile {path!r}: {e.strerror or e}", path, e.errno or 0
        ) from e
