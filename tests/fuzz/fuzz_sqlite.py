"""Fuzz target: the NVIDIA profiler database readers (mxprof.trace.nvidia).

Any bytes written as a database file must be read into raw events or raise
TraceFormatError (never sqlite3's own errors, never another exception).
Seeds in tests/fuzz/corpus_sqlite/ are small nvprof and Nsight databases.
Run: python tests/fuzz/fuzz_sqlite.py tests/fuzz/corpus_sqlite -max_total_time=30
"""

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from mxprof.errors import TraceFormatError
    from mxprof.trace import nvidia

PATH = os.path.join(tempfile.mkdtemp(prefix="mxprof-fuzz-"), "input.sqlite")


def one_input(data: bytes) -> None:
    with open(PATH, "wb") as f:
        f.write(data)
    try:
        events, metadata, truncated = nvidia.read_raw(PATH)
    except TraceFormatError:
        return
    assert isinstance(events, list) and all(isinstance(e, dict) for e in events)
    assert isinstance(metadata, dict) and truncated is False


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
