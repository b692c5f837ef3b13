"""Fuzz target: the distributed wire decoder (mxprof.distributed._wire).

Frames from the bytes (split at a separator) must be taken or Rejected by
``channel_of``; frames signed with the key (so that the MAC passes and the
header's parsing is what is fuzzed) must decode or be Rejected.
Seeds in tests/fuzz/corpus_wire/ are messages of each type.
Run: python tests/fuzz/fuzz_wire.py tests/fuzz/corpus_wire -max_total_time=30
"""

import sys

import atheris

with atheris.instrument_imports():
    from mxprof.distributed import _wire

KEY = b"k" * 32
SEPARATOR = b"\x00|\x00"


def one_input(data: bytes) -> None:
    frames = data.split(SEPARATOR)
    try:
        sid = _wire.channel_of(frames)
    except _wire.Rejected:
        return
    assert isinstance(sid, bytes)
    frames[2] = _wire._mac(KEY, sid, frames[3], frames[4])  # a message signed with the key
    try:
        header, body = _wire.decode(KEY, frames)
    except _wire.Rejected:
        return
    assert isinstance(header, dict) and isinstance(header["type"], str)
    assert body == frames[4]


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
