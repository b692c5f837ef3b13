"""The index in the trailer of mxprof's JSON traces, and windowed reads that use it."""

import json

import pytest

import mxprof
from mxprof import _testing
from mxprof.trace import _scan
from mxprof.trace.merge import merge, parse_window


@pytest.fixture(autouse=True)
def _fresh():
    _testing.reset()
    yield
    _testing.reset()


def _record(path, flushes, per_flush=5):
    """flushes blocks of per_flush steps, each step a frame holding a task."""
    mxprof.set_config(filename=str(path), aggregate_stats=False, profile_api=False)
    d = mxprof.Domain("train")
    step, work = d.new_frame("step"), d.new_task("work")
    mxprof.set_state("run")
    for _ in range(flushes):
        for _ in range(per_flush):
            with step, work:
                pass
        mxprof.dump(finished=False)
    mxprof.set_state("stop")
    mxprof.dump()


def _blocks(path):
    doc = json.loads(path.read_text())
    return doc, _scan.index(doc, path.stat().st_size)


def _events_in(path, block):
    with open(path, "rb") as f:
        f.seek(block.offset)
        return _scan.raw_events(_scan._array(f.read(block.size)))


def test_every_flush_that_wrote_events_is_a_block_that_says_what_it_holds(tmp_path):
    path = tmp_path / "t.json"
    _record(path, flushes=6)
    doc, blocks = _blocks(path)
    assert blocks is not None and len(blocks) == 6
    for a, b in zip(blocks, blocks[1:]):
        assert a.offset + a.size == b.offset  # back to back: the events, nothing between
    frames = []
    for block in blocks:
        events = [e for e in _events_in(path, block) if e["ph"] == "X"]
        assert len(events) == 10  # 5 steps and their tasks
        starts = [round(e["ts"] * 1000) for e in events]
        ends = [round((e["ts"] + e["dur"]) * 1000) for e in events]
        assert abs(block.first_ns - min(starts)) <= 1 and abs(block.last_ns - max(ends)) <= 1
        mine = sorted(e["args"]["frame"] for e in events if e["name"] == "step")
        assert (block.first_frame, block.last_frame) == (mine[0], mine[-1])
        assert not block.defines  # no samples here
        frames += mine
    assert frames == list(range(30))
    # The events of the file are exactly the blocks' and the head's and tail's metadata.
    indexed = sum(len(_events_in(path, b)) for b in blocks)
    timed = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert indexed - sum(1 for b in blocks for e in _events_in(path, b) if e["ph"] == "M") == len(
        timed
    )


def test_a_long_run_merges_neighbouring_blocks_and_still_covers_every_event(tmp_path):
    path = tmp_path / "t.json"
    _record(path, flushes=1100, per_flush=1)
    _, blocks = _blocks(path)
    assert blocks is not None and 512 <= len(blocks) <= 1024
    assert blocks[0].first_frame == 0
    for a, b in zip(blocks, blocks[1:]):
        assert a.offset + a.size == b.offset
        assert a.last_frame + 1 == b.first_frame  # one step a flush: frames in order
    assert blocks[-1].last_frame == 1099


def test_a_windowed_merge_reads_only_the_blocks_it_needs_and_keeps_what_a_scan_keeps(
    tmp_path, monkeypatch
):
    path = tmp_path / "t.json"
    _record(path, flushes=20)
    _, blocks = _blocks(path)
    middle = blocks[10]
    lo, hi = middle.first_ns / 1e9, middle.last_ns / 1e9
    taken = []
    real = _scan.indexed_blocks

    def counting(f, blocks, keep):
        taken.extend(b for b in blocks if keep(b))
        return real(f, blocks, keep)

    monkeypatch.setattr(_scan, "indexed_blocks", counting)
    merge([str(path)], str(tmp_path / "w.json"), window=parse_window(f"{lo}:{hi}"))
    assert middle in taken and len(taken) <= 3  # the block and at most its neighbours
    monkeypatch.setattr(_scan, "index", lambda metadata, size: None)  # no index: a scan
    merge([str(path)], str(tmp_path / "s.json"), window=parse_window(f"{lo}:{hi}"))
    with_index = _testing.load_trace(tmp_path / "w.json")["traceEvents"]
    scanned = _testing.load_trace(tmp_path / "s.json")["traceEvents"]
    # The same events; the same metadata (a scan also meets the copies of a
    # thread's name written before its first event, which the tail repeats).
    assert [e for e in with_index if e["ph"] != "M"] == [e for e in scanned if e["ph"] != "M"]

    def meta(events):
        return {json.dumps(e, sort_keys=True) for e in events if e["ph"] == "M"}

    assert meta(with_index) == meta(scanned)
    steps = [e for e in with_index if e.get("name") == "step"]
    assert 5 <= len(steps) < 20
    names = [e["args"]["name"] for e in with_index if e.get("name") == "thread_name"]
    assert names == ["MainThread"]  # from the tail: every thread's name


def test_a_file_changed_since_its_index_was_written_is_read_whole(tmp_path):
    path = tmp_path / "t.json"
    _record(path, flushes=8)
    _, blocks = _blocks(path)
    text = path.read_bytes()
    # One more event line at the start of the events: every offset is off by its length.
    cut = blocks[0].offset
    line = text[cut : text.index(b"\n", cut) + 1]
    path.write_bytes(text[:cut] + line + text[cut:])
    lo, hi = blocks[4].first_ns / 1e9, blocks[4].last_ns / 1e9
    with open(path, "rb") as f, pytest.raises(_scan.NotLines):
        next(_scan.indexed_blocks(f, blocks, lambda b: b is blocks[4]))
    merge([str(path)], str(tmp_path / "w.json"), window=parse_window(f"{lo}:{hi}"))
    got = _testing.load_trace(tmp_path / "w.json")["traceEvents"]
    frames = sorted(e["args"]["frame"] for e in got if e.get("name") == "step")
    assert frames[0] <= 20 and frames[-1] >= 24  # block 4's steps (20-24), read by a scan
    assert len([e for e in got if e.get("name") == "work"]) == len(frames)
