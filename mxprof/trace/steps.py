"""What a step is, for every reader of steps (merge --window, the report and
its hints through ``trace.processes``, the Parquet form's ``step`` column).

A step is a range of a frame (category ``<domain>,frame``, its number in
``args.frame``) or torch.profiler's ``ProfilerStep#N`` (number N).  A
process's steps are one group of such ranges on one thread (:func:`group`):
the group with the most ranges, then the most time (:func:`chosen`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

from .model import Event

K = TypeVar("K")

PROFILER_STEPS = "ProfilerStep#"  # the name of the group of torch's ProfilerStep#N
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def is_frame(category: str) -> bool:
    """Whether ranges of this category are frames (numbered steps)."""
    return category.endswith(",frame")


def is_profiler_step(name: str) -> bool:
    """Whether a range of this name is torch.profiler's ``ProfilerStep#N``."""
    return _PROFILER_STEP.match(name) is not None


def step_number(event: Event, order: int) -> int:
    """A step's number: the frame's index, the N of ProfilerStep#N, else its
    order among its kind's steps.

    Example: ``step_number(event, 3)`` is 7 for ``ProfilerStep#7``.
    """
    return number(event.name, event.args, order)


def number(name: str, args: object, order: int) -> int:
    """``step_number`` of a range given by its name and args (as in the file)."""
    index = args.get("frame") if isinstance(args, dict) else None
    if isinstance(index, int) and not isinstance(index, bool):
        return index
    match = _PROFILER_STEP.match(name)
    return int(match.group(1)) if match else order


def group(name: str, category: str) -> tuple[str, str] | None:
    """The group of steps a range of this name and category belongs to on its
    thread: a frame's (name, category), every ``ProfilerStep#N`` together as
    (``PROFILER_STEPS``, category); None for a range that is no step.

    Example:
        >>> group("step", "train,frame"), group("ProfilerStep#3", ""), group("fwd", "train")
        (('step', 'train,frame'), ('ProfilerStep#', ''), None)
    """
    if is_frame(category):
        return name, category
    if is_profiler_step(name):
        return PROFILER_STEPS, category
    return None


def chosen(candidates: Mapping[K, tuple[int, int]]) -> K:
    """Which of a process's groups of steps (each measured as (ranges, total
    ns)) are its steps: the most ranges, then the most time; among equals,
    the first given.  Callers give the groups in thread order (pid and tid
    as text), then by their first start.

    Example:
        >>> chosen({"epochs": (2, 900), "steps": (40, 800), "loads": (40, 100)})
        'steps'
    """
    return max(candidates, key=candidates.__getitem__)
