"""What a step is, for every reader of steps (merge --window, the report and its hints).

A step is a range of a frame (category ``<domain>,frame``, its number in
``args.frame``) or torch.profiler's ``ProfilerStep#N`` (number N).
"""

from __future__ import annotations

import re

from .model import Event

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
