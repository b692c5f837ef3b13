"""scope(): the name under which memory is attributed, per thread and task.

The current scope lives in a context variable, so every thread and every
asyncio task has its own.  It is mirrored into the core for the calling
thread (one integer) on every enter and exit, so native code can attribute
by thread without calling Python.

``CURRENT`` is that context variable (a str, ``DEFAULT`` when no scope is
set): code that sets scopes on a hot path (the torch adapter, per module
call) sets and resets it directly and mirrors the scope's id with
``_native.scope_set``, as :func:`scope` does.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from . import _native
from ._threads import register_current

__all__ = ["CURRENT", "DEFAULT", "current_scope", "scope", "scope_id"]

DEFAULT = "<unk>:"

CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("mxprof_scope", default=DEFAULT)
_ids: dict[str, int] = {DEFAULT: 0}


def scope_id(name: str) -> int:
    """The core's id of a scope name (the default scope is 0)."""
    sid = _ids.get(name)
    if sid is None:
        sid = _native.register(_native.KIND_SCOPE, b"", _native.utf8(name, "scope name"))
        _ids[name] = sid
    return sid


def current_scope() -> str:
    """The calling context's scope name, e.g. ``'model:layer1:'``.

    Example:
        >>> import mxprof
        >>> with mxprof.scope("model"):
        ...     mxprof.current_scope()
        'model:'
    """
    return CURRENT.get()


def _mirror(name: str) -> None:
    if _native.scope_set(scope_id(name)) == _native.NEW_THREAD:
        register_current()


@contextlib.contextmanager
def scope(name: str = DEFAULT, append_mode: bool = True) -> Iterator[str]:
    """Attribute what happens inside the block to ``name``.

    A trailing ``:`` is added when missing.  With ``append_mode`` the name
    nests under the current scope (``outer:inner:``) unless that is the
    default ``<unk>:``.  The previous scope comes back when the block ends,
    also when it raises.

    Args:
        name: the scope's name.
        append_mode: nest under the current scope.

    Yields:
        The full scope name now in effect.

    Example:
        >>> import mxprof
        >>> with mxprof.scope("encoder") as outer:
        ...     with mxprof.scope("layer0") as inner:
        ...         print(outer, inner)
        encoder: encoder:layer0:
    """
    if not isinstance(name, str):
        raise TypeError(f"scope name must be a str, got {type(name).__name__} {name!r}")
    if not isinstance(append_mode, bool):
        raise TypeError(f"append_mode must be a bool, got {append_mode!r}")
    if not name.endswith(":"):
        name += ":"
    parent = CURRENT.get()
    if append_mode and parent != DEFAULT:
        name = parent + name
    _native.utf8(name, "scope name")
    token = CURRENT.set(name)
    _mirror(name)
    try:
        yield name
    finally:
        CURRENT.reset(token)
        _mirror(CURRENT.get())
