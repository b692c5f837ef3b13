"""The names of the core's tallies (``mxp_counts`` in mxprof.h), in its order.

What the core counts instead of recording as asked; ``dumps()`` shows them and
every trace carries them in ``otherData``.  A leaf, so that the live tier
(``_native``) and the offline tier (the report reading ``otherData``) share
one list.
"""

TALLIES = (
    "dropped_events",
    "unmatched_stops",
    "non_lifo_stops",
    "ignored_calls",
    "unknown_frees",
    "cut_ranges",
    "saturated_values",
    "invalid_calls",
)
