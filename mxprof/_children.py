"""follow_children: child processes profile into ``<stem>.<pid><ext>``.

A child made by fork (``os.fork``, multiprocessing's fork and forkserver
methods) continues from the parent's state in the fork hook.  Any other
child (multiprocessing's spawn method, a subprocess running Python) finds
the parent's configuration in the environment variable
MXPROF_FOLLOW_CHILDREN and starts profiling when its live profiler loads: at
the first use of a live name (``Domain``, ``set_config`` ...) or import of a
live module, which every process that uses mxprof's objects makes (reading
traces loads nothing).  Children write their own files; ``mxprof merge``
puts them on one timeline with the parent's.
"""

from __future__ import annotations

import json
import os
from typing import Any

ENV = "MXPROF_FOLLOW_CHILDREN"

# Longest first: ".json.gz" before ".gz".
_SUFFIXES = (".perfetto-trace", ".json.gz", ".pftrace", ".json", ".gz")


def with_infix(base: str, infix: str) -> str:
    """base with infix before its format's ending (``.json.gz`` whole).

    Example:
        >>> with_infix("runs/train.json.gz", "-cycle1")
        'runs/train-cycle1.json.gz'
    """
    for suffix in _SUFFIXES:
        if base.endswith(suffix):
            return f"{base[: -len(suffix)]}{infix}{suffix}"
    stem, ext = os.path.splitext(base)
    return f"{stem}{infix}{ext}"


def child_filename(base: str, pid: int) -> str:
    """The trace file of child pid of a parent writing base.

    Example:
        >>> child_filename("runs/train.json.gz", 4242)
        'runs/train.4242.json.gz'
    """
    return with_infix(base, f".{pid}")


def export(config: dict[str, Any], base: str, paused: bool) -> None:
    """Offer children this configuration (base: the parent's own filename)."""
    os.environ[ENV] = json.dumps(
        {"parent": os.getpid(), "base": base, "paused": paused, "config": config}
    )


def withdraw() -> None:
    """Children started from now on do not profile (by this process's offer;
    an offer inherited from a parent stays until this process makes its own)."""
    raw = os.environ.get(ENV)
    if raw is None:
        return
    try:
        made_here = json.loads(raw).get("parent") == os.getpid()
    except (ValueError, AttributeError):
        made_here = True  # not an offer anyone can use
    if made_here:
        del os.environ[ENV]


def inherited() -> dict[str, Any] | None:
    """The offer this process was started with, if it is a child to profile."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    try:
        offer = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(offer, dict) or offer.get("parent") == os.getpid():
        return None
    if not isinstance(offer.get("base"), str) or not isinstance(offer.get("config"), dict):
        return None
    return offer


def _register_finalizer(session: Any) -> None:
    from multiprocessing import util

    if session.profile_open:
        util.Finalize(None, session.at_exit, exitpriority=100)


def write_at_multiprocessing_exit(session: Any) -> None:
    """Make multiprocessing's children complete their trace when they end.

    Its fork children leave by os._exit, skipping atexit; its exit hook
    (finalizers with an exit priority) still runs.  The finalizer must be
    registered from its after-fork hooks: the child clears the finalizers it
    inherited after the OS fork hooks ran.
    """
    from multiprocessing import util

    util.register_after_fork(session, _register_finalizer)
