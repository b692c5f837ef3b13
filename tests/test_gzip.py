"""A trace file ending in .gz is gzip-compressed Chrome JSON, complete after every write."""

import gzip
import json

import pytest

import mxprof
from mxprof import _testing
from mxprof._native import lib


def scenario(path, clock, batches=3):
    d = mxprof.Domain("gz")
    task, counter, marker = d.new_task("t"), d.new_counter("c", 0), d.new_marker("m")
    mxprof.set_config(filename=str(path), continuous_dump=False, profile_api=False)
    mxprof.set_state("run")
    docs = []
    for _ in range(batches):
        for _ in range(10):
            with task:
                clock(1000)
            counter += 1
        marker.mark()
        mxprof.dump(finished=False)
        docs.append(read(path))
    mxprof.dump()
    return docs


def read(path):
    data = path.read_bytes()
    if path.suffix == ".gz":
        assert data[:2] == b"\x1f\x8b"
        data = gzip.decompress(data)  # every member, in order
    return json.loads(data)


def strip(doc):
    """The events, without what differs between two runs (pid)."""
    return [
        {k: v for k, v in e.items() if k != "pid"} for e in doc["traceEvents"] if e["ph"] != "M"
    ]


@pytest.mark.skipif(lib.mxp_trace_format(b"x.gz", 4) < 0, reason="built without zlib")
def test_gzip_is_valid_after_every_write_and_equals_plain(tmp_path, clock):
    gz_docs = scenario(tmp_path / "t.json.gz", clock)
    assert [len(_testing.events(d, "X", "t")) for d in gz_docs] == [10, 20, 30]
    _testing.reset()
    with _testing.fake_clock(1_000_000_000) as clock2:
        plain_docs = scenario(tmp_path / "t.json", clock2)
    for a, b in zip(gz_docs, plain_docs):
        assert strip(a) == strip(b)
    final = read(tmp_path / "t.json.gz")
    assert len(_testing.events(final, "C", "c")) == 30
    assert mxprof.load(tmp_path / "t.json.gz").key_averages()[0].count == 30


@pytest.mark.skipif(lib.mxp_trace_format(b"x.gz", 4) < 0, reason="built without zlib")
def test_gzip_cut_short_loads_what_was_written(tmp_path, clock):
    scenario(tmp_path / "t.json.gz", clock)
    data = (tmp_path / "t.json.gz").read_bytes()
    cut = tmp_path / "cut.json.gz"
    counts = []
    for size in range(20, len(data), max(1, len(data) // 40)):
        cut.write_bytes(data[:size])
        try:
            trace = mxprof.load(cut)
        except mxprof.TraceFormatError as e:  # only a cut before the first event
            assert not counts and "before its first event" in str(e), size
            continue
        assert trace.truncated
        counts.append(len(trace))
    assert counts == sorted(counts) and counts[-1] > 0  # more file, more events


@pytest.mark.skipif(lib.mxp_trace_format(b"x.gz", 4) < 0, reason="built without zlib")
def test_gzip_cut_in_the_next_members_magic_is_a_cut_file(tmp_path, clock):
    """A cut one byte into a member's header (its first magic byte) is a
    file cut short, read up to the cut, not bytes that are not gzip."""
    scenario(tmp_path / "t.json.gz", clock)
    data = (tmp_path / "t.json.gz").read_bytes()
    starts = [i for i in range(1, len(data) - 1) if data[i : i + 3] == b"\x1f\x8b\x08"]
    assert starts  # the writer's later members
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: starts[-1] + 1])
    assert mxprof.load(cut).truncated


@pytest.mark.skipif(lib.mxp_trace_format(b"x.gz", 4) < 0, reason="built without zlib")
def test_gzip_failed_write_then_a_good_path(tmp_path, clock):
    bad = tmp_path / "missing" / "t.json.gz"
    mxprof.set_config(filename=str(bad), continuous_dump=False, profile_api=False)
    mxprof.set_state("run")
    t = mxprof.Domain("gz").new_task("t")
    for _ in range(5):
        t.start()
        t.stop()
    with pytest.raises(mxprof.OutputError):
        mxprof.dump(finished=False)
    with pytest.warns(RuntimeWarning):
        mxprof.set_config(filename=str(tmp_path / "good.json.gz"))
    mxprof.dump()
    assert len(_testing.events(read(tmp_path / "good.json.gz"), "X", "t")) == 5


def test_gzip_needs_zlib_or_says_so(monkeypatch):
    if lib.mxp_trace_format(b"x.gz", 4) >= 0:
        assert lib.mxp_trace_format(b"x.gz", 4) == lib.MXP_FORMAT_JSON_GZ
        return
    with pytest.raises(mxprof.ConfigError, match="zlib"):
        mxprof.set_config(filename="x.json.gz")
