"""Ranges: Task, Frame and Event -- timed spans of code on one thread.

Each works three ways, all recording the same thing::

    task.start(); ...; task.stop()
    with task: ...
    @task
    def f(): ...

Each begin and each end is one call into the core with a cached integer id
(DESIGN.md §2.2).  On a thread that runs an asyncio event loop the core
answers MXP_IN_LOOP instead, and the range goes to the running task's own
track (``_tasks``), where begins and ends pair per task.  The end of ``with`` and
of a decorated call runs in a ``finally``, so a raising body still closes
its range.  Ranges of one thread (or task) nest; a stop on another thread
(or task) than its start closes the range there and records it as an async
range; a stop with no start anywhere is tallied, never raised.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from . import _native, _tasks
from ._named import Named, check_domain

# The per-event calls, bound as module globals: each start/stop is then one
# global load and one cffi call (a lookup on _native or cffi's lib per event
# would cost about as much as the call).
from ._native import NEW_THREAD
from ._native import frame_enter as _frame_begin
from ._native import range_begin_token as _begin_token
from ._native import range_end_token as _end_token
from ._native import range_enter as _begin
from ._native import range_exit as _end
from ._native import track_begin as _track_begin
from ._native import track_end as _track_end
from ._tasks import begun as _begun
from ._tasks import ended as _ended
from ._tasks import running_loop as _loop
from ._threads import register_current
from .errors import DeviceUnavailable

if TYPE_CHECKING:
    from .domain import Domain

__all__ = ["Event", "Frame", "Task", "set_stream_task"]

F = TypeVar("F", bound=Callable[..., Any])

# The observer of steps (mxprof._triggers' slow step and watchdog), set only
# while one of them is on: called after each begin and end of a Frame as
# begin(id) / end(id).  Frames only (one per step), so that no other range
# pays for it; while it is None a frame pays one global load more.
_steps: Any = None


def set_steps(observer: Any) -> None:
    """Call observer.begin(id) / observer.end(id) at each Frame's begin and
    end from now on (None: stop).  ``mxprof._triggers`` is the only user.

    Example: ``ranges.set_steps(None)``.
    """
    global _steps
    _steps = observer


# What Task(domain, name, stream=s) makes: mxprof.cuda sets it when imported
# (set_stream_task), so that this module needs no device code.
_stream_task: type[Task] | None = None


def set_stream_task(cls: type[Task]) -> None:
    """Make ``Task(domain, name, stream=s)`` an instance of cls (a Task
    subclass taking ``(domain, name, stream)``).  ``mxprof.cuda`` calls this
    with :class:`mxprof.cuda.GpuTask` when it is imported.

    Example: ``ranges.set_stream_task(GpuTask)``.
    """
    global _stream_task
    _stream_task = cls


def _stream_class() -> type[Task]:
    if _stream_task is None:
        # The optional CUDA extension registers itself on import; mxprof.cuda
        # imports no CUDA library, so this fails only with a broken install.
        try:
            importlib.import_module(".cuda", __package__)
        except ImportError as e:
            raise DeviceUnavailable(
                f"Task(..., stream=...) needs mxprof.cuda, which cannot be imported ({e}); "
                'install it with pip install "mxprof[cuda]"'
            ) from e
    assert _stream_task is not None, "mxprof.cuda did not register its stream task"
    return _stream_task


class _Range(Named):
    """What Task, Frame and Event share."""

    __slots__ = ()
    _kind = _native.KIND_TASK

    def start(self) -> None:
        """Begin the range on the calling thread (or asyncio task)."""
        rc = _begin(self._id)
        if rc:
            _begun(rc, self._id)

    def stop(self) -> None:
        """End the innermost open range of this object on the calling thread
        (or asyncio task); with none open there, the one begun last elsewhere."""
        rc = _end(self._id)
        if rc:
            _ended(rc, self._id)

    def __enter__(self) -> _Range:
        rc = _begin(self._id)
        if rc:
            _begun(rc, self._id)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # Named parameters, not *exc: no tuple is built on every exit.
        rc = _end(self._id)
        if rc:
            _ended(rc, self._id)

    # Extension point: a subclass that times something more with each range
    # (mxprof.cuda.GpuTask: the span on a CUDA stream) overrides on_begin and
    # on_end; the decorator below then calls them around every call.
    hooked = False  # set by a subclass that overrides on_begin/on_end

    def on_begin(self) -> Any:
        """Called by the decorator right after each begin of the range (only
        for a subclass with ``hooked = True``); what it returns is handed to
        :meth:`on_end` of the same call.  Must not raise.

        Example: ``def on_begin(self): return record_gpu_start()``.
        """
        return None

    def on_end(self, state: Any) -> None:
        """Called by the decorator right before each end of the range, with
        what :meth:`on_begin` returned for the same call.  Must not raise.

        Example: ``def on_end(self, state): record_gpu_end(state)``.
        """

    def __call__(self, fn: F) -> F:
        """Decorate fn so that every call of it is one range.

        Coroutine functions are timed until they return (each call its own
        range, on the track of the asyncio task that runs it; driven without
        an event loop, each call still pairs with its own end).
        """
        if not callable(fn):
            raise TypeError(f"{type(self).__name__} decorates a callable, got {fn!r}")
        rid = self._id
        begin = _frame_begin if self._kind == _native.KIND_FRAME else _begin
        hooked = self.hooked
        on_begin, on_end = self.on_begin, self.on_end
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
                loop = _loop()
                tid = _tasks.track_of(loop, True) if loop is not None else 0
                if tid:
                    _track_begin(tid, rid)
                    state = on_begin() if hooked else None
                    try:
                        return await fn(*args, **kwargs)
                    finally:
                        if hooked:
                            on_end(state)
                        _track_end(tid, rid)
                token = _begin_token(rid)
                if token & NEW_THREAD:
                    register_current()
                state = on_begin() if hooked else None
                try:
                    return await fn(*args, **kwargs)
                finally:
                    if hooked:
                        on_end(state)
                    _end_token(rid, token)

            return timed_coroutine  # type: ignore[return-value]

        if hooked:

            @functools.wraps(fn)
            def timed_hooked(*args: Any, **kwargs: Any) -> Any:
                rc = begin(rid)
                if rc:
                    _begun(rc, rid)
                state = on_begin()
                try:
                    return fn(*args, **kwargs)
                finally:
                    on_end(state)
                    rc = _end(rid)
                    if rc:
                        _ended(rc, rid)

            return timed_hooked  # type: ignore[return-value]

        if self._kind == _native.KIND_FRAME:
            # One per step: through start/stop, which tell the steps' observer.
            start, stop = self.start, self.stop

            @functools.wraps(fn)
            def timed_step(*args: Any, **kwargs: Any) -> Any:
                start()
                try:
                    return fn(*args, **kwargs)
                finally:
                    stop()

            return timed_step  # type: ignore[return-value]

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            rc = begin(rid)
            if rc:
                _begun(rc, rid)
            try:
                return fn(*args, **kwargs)
            finally:
                rc = _end(rid)
                if rc:
                    _ended(rc, rid)

        return timed  # type: ignore[return-value]


class Task(_Range):
    """A timed range in a domain: a ``"ph":"X"`` event with ``cat`` = domain.

    Args:
        domain: the Domain it belongs to.
        name: its name; tasks with the same domain and name aggregate together.
        stream: a CUDA stream to time the range on as well (see
            :class:`mxprof.cuda.GpuTask`, which is what a stream makes; it
            imports :mod:`mxprof.cuda` on first use); without CUDA this raises
            :class:`mxprof.DeviceUnavailable`.

    Example:
        >>> import mxprof
        >>> forward = mxprof.Task(mxprof.Domain("train"), "forward")
        >>> with forward:
        ...     pass
    """

    __slots__ = ()

    def __new__(cls, domain: Any = None, name: Any = None, stream: Any = None) -> Task:
        # A stream makes a GpuTask: its own methods, so that these stay one call each.
        # (Defaults: copy and pickle call cls.__new__(cls).)
        if stream is None or cls is not Task:
            return super().__new__(cls)
        return super().__new__(_stream_class())

    def __init__(self, domain: Domain, name: str, stream: Any = None) -> None:
        if stream is not None:
            raise TypeError(
                f"{type(self).__name__} takes no stream; mxprof.Task(domain, name, stream=...) "
                "makes an mxprof.cuda.GpuTask"
            )
        super().__init__(check_domain(domain, "Task"), name)


class Frame(_Range):
    """A numbered range (0, 1, ... per frame and profile), e.g. one training step.

    In the trace: ``"ph":"X"``, ``cat`` = ``<domain>,frame``, ``args.frame`` =
    the index.

    Example:
        >>> import mxprof
        >>> step = mxprof.Frame(mxprof.Domain("train"), "step")
        >>> for _ in range(3):
        ...     with step:
        ...         pass
    """

    __slots__ = ()
    _kind = _native.KIND_FRAME

    def __init__(self, domain: Domain, name: str) -> None:
        super().__init__(check_domain(domain, "Frame"), name)

    # Each begin and end also tells the steps' observer, if any (set_steps).

    def start(self) -> None:
        """Begin the next frame on the calling thread (or asyncio task)."""
        rc = _frame_begin(self._id)
        if rc:
            _begun(rc, self._id)
        if _steps is not None:
            _steps.begin(self._id)

    def stop(self) -> None:
        """End the frame (as :meth:`Task.stop` ends a task)."""
        rc = _end(self._id)
        if rc:
            _ended(rc, self._id)
        if _steps is not None:
            _steps.end(self._id)

    # A frame is one per step: the call through start/stop costs nothing
    # that matters there, unlike a task's.

    def __enter__(self) -> Frame:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop()


class Event(_Range):
    """A timed range without a domain (trace category ``event``).

    Example:
        >>> import mxprof
        >>> load = mxprof.Event("load_batch")
        >>> load.start(); load.stop()
    """

    __slots__ = ()
    _kind = _native.KIND_EVENT

    def __init__(self, name: str) -> None:
        super().__init__(None, name)
