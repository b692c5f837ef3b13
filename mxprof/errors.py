"""mxprof's exception classes."""

from __future__ import annotations


class ProfilerError(RuntimeError):
    """Base class of every error mxprof raises on purpose."""


class ConfigError(ProfilerError, ValueError):
    """An unknown key, a bad value, or an impossible request.

    Example:
        >>> import mxprof
        >>> try:
        ...     mxprof.set_config(dump_period=0)
        ... except mxprof.ConfigError as e:
        ...     print("rejected")
        rejected
    """


class StateError(ProfilerError):
    """The request does not fit the profiler's current state.

    Example: ``mxprof.dump()`` before ``set_state('run')`` was ever called.
    """


class OutputError(ProfilerError, OSError):
    """A trace file could not be written; ``filename`` and ``errno`` name why.

    The events that were not written stay in memory and go to the next
    successful write (for instance after ``set_config(filename=...)``).
    """

    def __init__(self, message: str, filename: str, errno: int) -> None:
        super().__init__(message)
        self.message = message
        self.filename = filename
        self.errno = errno

    def __str__(self) -> str:
        return self.message


class TraceFormatError(ProfilerError, ValueError):
    """A file is not a trace mxprof can read (not JSON, or JSON of another shape).

    The message names the file and what was wrong with it.
    """


class DeviceUnavailable(ProfilerError):
    """A device feature cannot work here: no driver, no GPU, no cuda-python.

    The message names the reason (for CUDA: ``cudaErrorNoDevice``,
    ``cudaErrorInsufficientDriver``, a missing ``libcuda``, or cuda-python
    not installed).  Nothing else in mxprof depends on the device.
    """
