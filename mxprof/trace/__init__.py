"""Load Chrome trace files (mxprof's and other tools') for analysis.

Example:
    >>> from mxprof.trace import load
    >>> trace = load("trace.json")  # doctest: +SKIP
    >>> print(trace.table(sort_by="self", row_limit=10))  # doctest: +SKIP
    >>> print(trace.filter(thread="MainThread").tree())  # doctest: +SKIP
"""

from .model import Event, Trace, base_time_ns, load
from .reader import read_raw
from .tree import CallNode, CallTree

__all__ = ["CallNode", "CallTree", "Event", "Trace", "base_time_ns", "load", "read_raw"]
