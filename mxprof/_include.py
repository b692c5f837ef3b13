"""Where the C API's header is: a leaf that loads nothing."""

from __future__ import annotations

import os


def get_include() -> str:
    """The folder holding ``mxprof_capi.h``, for compiling native extensions.

    Example:
        >>> import mxprof
        >>> os.path.exists(os.path.join(mxprof.get_include(), "mxprof_capi.h"))
        True
    """
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")
