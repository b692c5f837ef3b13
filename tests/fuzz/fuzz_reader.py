"""Fuzz target: the trace reader (mxprof.trace.reader).

Any bytes given to the reader must end in one of two ways: events read (a
list of objects, the metadata a dict, a truncated flag), or TraceFormatError.
Anything else is a bug.  Seeds in tests/fuzz/corpus/ start it on real traces.
Run: python tests/fuzz/fuzz_reader.py tests/fuzz/corpus -max_total_time=30
"""

import io
import sys

import atheris

with atheris.instrument_imports():
    from mxprof.errors import TraceFormatError
    from mxprof.trace import Trace, reader


def one_input(data: bytes) -> None:
    if data[:2] == b"\x1f\x8b":
        data = b"".join(reader.gunzip(io.BytesIO(data).read))
    text = data.decode("utf-8", errors="replace")
    try:
        events, metadata, truncated = reader.parse_text(text, "fuzz")
    except TraceFormatError:
        return
    assert isinstance(events, list) and all(isinstance(e, dict) for e in events)
    assert isinstance(metadata, dict) and isinstance(truncated, bool)
    trace = Trace.from_raw(events, metadata=metadata, truncated=truncated)
    trace.key_averages()  # whatever was read can be analysed
    trace.tree()


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
