"""Fuzz target: reading a file through its gzip stream (mxprof.trace.reader
and the line reader, mxprof.trace._scan), as ``load`` reads it.

Any bytes written to a file must load or raise TraceFormatError; the line
reader and the general reader must agree on the events of a file both take.
Seeds in tests/fuzz/corpus_gzip/ are small gzip traces (several members).
Run: python tests/fuzz/fuzz_gzip.py tests/fuzz/corpus_gzip -max_total_time=30
"""

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from mxprof.errors import TraceFormatError
    from mxprof.trace import load, read_raw

PATH = os.path.join(tempfile.mkdtemp(prefix="mxprof-fuzz-"), "input.json.gz")


def one_input(data: bytes) -> None:
    with open(PATH, "wb") as f:
        f.write(data)
    try:
        trace = load(PATH)
        rows = trace.key_averages()
    except TraceFormatError:
        return
    events, metadata, truncated = read_raw(PATH)  # the general way takes it too
    assert isinstance(events, list) and isinstance(metadata, dict)
    assert sum(r.count for r in rows) <= len(events)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
