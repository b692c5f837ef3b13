"""Trace JSON as mxprof writes it from Python (merge, repair, metadata).

It follows the C writers' one rule beyond JSON (native/src/mxp_json.c): a
backslash is written ``\\u005c``, never ``\\\\``.  Perfetto's JSON parser
(UI v52) takes any quote after a backslash for an escaped quote, so a string
whose text ends in a backslash would run on past its closing quote and the
whole file would fail to load.
"""

from __future__ import annotations

import json
from typing import Any


def dumps(value: Any) -> str:
    """JSON text of value, non-ASCII kept, backslashes as ``\\u005c``.

    In ``json.dumps``'s output every backslash begins an escape, and the only
    escape that contains a second one is the backslash's own, so each ``\\\\``
    is exactly one escaped backslash.

    Example:
        >>> dumps({"name": "ends\\\\"})
        '{"name": "ends\\\\u005c"}'
    """
    return json.dumps(value, ensure_ascii=False).replace("\\\\", "\\u005c")
