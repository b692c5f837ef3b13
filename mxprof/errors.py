"""mxprof's exception classes."""

from __future__ import annotations

from typing import Any


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


class _FileProblem(OSError):
    """An OSError whose message is mxprof's own sentence naming the file."""

    def __init__(self, message: str, filename: str, errno: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.filename = filename
        self.errno = errno

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by its own arguments (OSError's are (errno, strerror)), so that
        # it crosses from a worker process (mxprof.trace.engine) as it was.
        return (type(self), (self.message, self.filename, self.errno))


class OutputError(_FileProblem, ProfilerError):
    """A trace file could not be written; ``filename`` and ``errno`` name why.

    The events that were not written stay in memory and go to the next
    successful write (for instance after ``set_config(filename=...)``).
    """


class TraceFormatError(ProfilerError, ValueError):
    """A file is not a trace mxprof can read (not JSON, or JSON of another shape).

    The message names the file and what was wrong with it.
    """


class TraceReadError(_FileProblem, TraceFormatError):
    """A trace file could not be read at all: ``filename`` and ``errno`` say why.

    Raised by ``mxprof.load`` (and ``merge``, ``stats``) for a path that is
    missing, a directory, not readable, too long, or no path at all (a NUL
    byte, a lone surrogate: ``errno`` is ``EINVAL``).  It is both a
    ``TraceFormatError`` (everything ``load`` rejects is one) and an
    ``OSError``; the message names the path.

    Example:
        >>> import mxprof
        >>> try:
        ...     mxprof.load("no-such-trace.json")
        ... except mxprof.TraceFormatError as e:  # or OSError
        ...     print(type(e).__name__, e.errno == 2, e)
        TraceReadError True no-such-trace.json: cannot read: No such file or directory
    """


class DeviceUnavailable(ProfilerError):
    """A device feature cannot work here: no driver, no GPU, no cuda-python.

    The message names the reason (for CUDA: ``cudaErrorNoDevice``,
    ``cudaErrorInsufficientDriver``, a missing ``libcuda``, or cuda-python
    not installed).  Nothing else in mxprof depends on the device.
    """
