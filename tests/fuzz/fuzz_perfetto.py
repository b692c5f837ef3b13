"""Fuzz target: the Perfetto protobuf reader (mxprof.trace.perfetto).

Any bytes must end in events read (raw event dicts, a metadata dict, a
truncated flag) or TraceFormatError; whatever was read can be analysed.
Seeds in tests/fuzz/corpus_perfetto/ are small traces the core wrote.
Run: python tests/fuzz/fuzz_perfetto.py tests/fuzz/corpus_perfetto -max_total_time=30
"""

import sys

import atheris

with atheris.instrument_imports():
    from mxprof.errors import TraceFormatError
    from mxprof.trace import Trace
    from mxprof.trace.perfetto import read_perfetto


def one_input(data: bytes) -> None:
    try:
        events, metadata, truncated = read_perfetto(data, "fuzz")
    except TraceFormatError:
        return
    assert isinstance(events, list) and all(isinstance(e, dict) for e in events)
    assert isinstance(metadata, dict) and isinstance(truncated, bool)
    trace = Trace.from_raw(events, metadata=metadata, truncated=truncated)
    trace.key_averages()
    trace.tree()


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
