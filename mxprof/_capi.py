"""The C API's capsule, ``mxprof._C_API`` (see ``mxprof/include/mxprof_capi.h``).

Made once, when first asked for: native extensions import it with
``PyCapsule_Import("mxprof._C_API", 0)`` (the header's ``mxprof_capi_import``).
"""

from __future__ import annotations

from . import _native

C_API = _native.capi_capsule()
