"""Trace files written from Python (``merge``, ``repair``): the format follows the name.

The rule is the core's (``mxp_trace_format`` in native/src/mxp_format.c), in
Python so that writing or repairing a file needs no compiled core:
``.perfetto-trace`` and ``.pftrace`` are Perfetto protobuf, ``.gz`` is
gzip-compressed Chrome JSON, any other name Chrome JSON.
"""

from __future__ import annotations

import gzip
import os
from typing import Any

from .._tracejson import dumps as trace_json
from .perfetto import write_perfetto

JSON = "json"
JSON_GZ = "json.gz"
PERFETTO = "perfetto"

PERFETTO_SUFFIXES = (".perfetto-trace", ".pftrace")


def file_format(path: str | os.PathLike[str]) -> str:
    """The format a trace file named path is in: ``PERFETTO``, ``JSON_GZ`` or ``JSON``.

    Example:
        >>> file_format("run.pftrace"), file_format("run.json.gz"), file_format("run.trace")
        ('perfetto', 'json.gz', 'json')
    """
    name = os.fspath(path)
    if name.endswith(PERFETTO_SUFFIXES):
        return PERFETTO
    if name.endswith(".gz"):
        return JSON_GZ
    return JSON


def encode(doc: dict[str, Any], fmt: str) -> bytes:
    """doc (Chrome JSON's object form) as the bytes of a file in format fmt.

    Perfetto keeps the events and ``baseTimeNanoseconds`` (the format has no
    place for the rest of the metadata).

    Example:
        >>> encode({"traceEvents": []}, file_format("empty.json"))
        b'{"traceEvents": []}'
    """
    if fmt == PERFETTO:
        return write_perfetto(doc["traceEvents"], doc.get("baseTimeNanoseconds"))
    payload = trace_json(doc).encode("utf-8")
    return gzip.compress(payload, 6) if fmt == JSON_GZ else payload
