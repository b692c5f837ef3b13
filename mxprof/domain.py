"""Domain: a named group of tasks, frames, counters and markers.

The name handling lives in :mod:`mxprof._named` (which the objects build
on); this module adds the factory methods, so it imports the objects and
none of them imports it.
"""

from __future__ import annotations

from typing import SupportsInt

from ._named import DomainBase, check_domain, check_name
from .counter import Counter
from .marker import Marker
from .ranges import Frame, Task

__all__ = ["Domain", "check_domain", "check_name"]


class Domain(DomainBase):
    """A named group of profiling objects; its name is their trace category.

    Args:
        name: a non-empty name.

    Example:
        >>> import mxprof
        >>> d = mxprof.Domain("training")
        >>> step = d.new_task("step")
        >>> str(d)
        'training'
    """

    __slots__ = ()

    def new_task(self, name: str) -> Task:
        """A ``Task`` in this domain.  Example: ``d.new_task("forward")``."""
        return Task(self, name)

    def new_frame(self, name: str) -> Frame:
        """A ``Frame`` in this domain.  Example: ``d.new_frame("step")``."""
        return Frame(self, name)

    def new_counter(self, name: str, value: SupportsInt | None = None) -> Counter:
        """A ``Counter`` in this domain.  Example: ``d.new_counter("bytes", 0)``."""
        return Counter(self, name, value)

    def new_marker(self, name: str) -> Marker:
        """A ``Marker`` in this domain.  Example: ``d.new_marker("epoch")``."""
        return Marker(self, name)
