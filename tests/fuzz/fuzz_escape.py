"""Fuzz target: the core's JSON string escaper (mxp_json_escape).

Any text escaped by the core must parse back, with Python's json, to the very
same text.  Run: python tests/fuzz/fuzz_escape.py -max_total_time=30
"""

import json
import sys

import atheris

with atheris.instrument_imports():
    from mxprof._native import ffi, lib

OUT = ffi.new("char[]", 1 << 20)
NEEDED = ffi.new("size_t *")


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    text = fdp.ConsumeUnicodeNoSurrogates(len(data))
    raw = text.encode("utf-8")
    rc = lib.mxp_json_escape(raw, len(raw), OUT, len(OUT), NEEDED)
    if rc == lib.MXP_E_FULL:
        return  # longer than the buffer: not what is being checked
    assert rc == 0, rc
    literal = ffi.unpack(OUT, NEEDED[0])
    assert literal[:1] == b'"' and literal[-1:] == b'"', literal
    assert all(b >= 0x20 for b in literal), literal  # control characters escaped
    back = json.loads(literal.decode("utf-8"))
    assert back == text, (text, literal)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
