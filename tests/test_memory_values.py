"""Memory arguments outside the core's ranges: an error naming the argument,
its value and the range, and nothing recorded or lost."""

import json

import pytest

import mxprof
from mxprof import _testing, memory
from mxprof._testing import finish, start


@pytest.mark.parametrize(
    ("device", "shown"),
    [
        (2**32, "got 4294967296"),
        (2**40, "got 1099511627776"),
        ("gpu:4294967296", "got 4294967296 in 'gpu:4294967296'"),
        ("cuda/99999999999999999999", "got 99999999999999999999 in 'cuda/99999999999999999999'"),
        ("cpu:4294967296", "got 4294967296 in 'cpu:4294967296'"),
    ],
)
def test_a_device_ordinal_beyond_uint32_is_refused_and_nothing_is_lost(trace_file, device, shown):
    start(trace_file, profile_memory=True)
    with mxprof.scope("kept"):
        kept = memory.record_alloc(4096, "gpu:1", tag="weight")
    usage_before = memory.usage()
    with pytest.raises(ValueError) as info:
        memory.record_alloc(100, device)
    assert str(info.value) == f"device ordinal must be within 0 .. 2**32 - 1, {shown}"
    with pytest.raises(ValueError, match=r"0 \.\. 2\*\*32 - 1"):
        memory.device_name(device)
    assert [(a.ptr, a.nbytes, a.device, a.attribute) for a in memory.live()] == [
        (kept, 4096, "gpu/1", "kept:weight")
    ]
    assert memory.usage() == usage_before
    stats = json.loads(mxprof.dumps(format="json"))
    trace = finish(trace_file)
    assert [e["args"] for e in _testing.events(trace, "C", "Memory: gpu/1")] == [
        {"Memory: gpu/1": 4096}
    ]
    assert stats["Profiler"]["unknown_frees"] == 0


def test_the_largest_ordinal_is_taken():
    assert memory.device_name(2**32 - 1) == "gpu/4294967295"
    assert memory.device_name("cpu:4294967295") == "cpu/4294967295"
