"""mxprof's own reader of Perfetto protobuf traces (mxprof/trace/perfetto.py):
files of the first encoding and the current one, read a piece at a time."""

import json
import os
import pathlib
import sys

import pytest

import mxprof
from mxprof.errors import TraceFormatError
from mxprof.trace import perfetto

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
V1 = os.path.join(DATA, "perfetto_v1.pftrace")


def rows(trace):
    return [[e.name, e.category, e.ph, e.ts, e.dur, e.pid, e.tid, e.args] for e in trace.events]


def test_a_file_of_the_first_encoding_loads_as_its_own_reader_loaded_it():
    """One packet sequence, absolute timestamps with a clock id on every
    packet, a track on every event (tests/data/make_perfetto_v1.py)."""
    with open(os.path.join(DATA, "perfetto_v1.expected.json")) as f:
        expected = json.load(f)
    for trace in (mxprof.load(V1), mxprof.trace.model.read_events(V1)):
        assert rows(trace) == expected["events"]
        threads = sorted([pid, tid, name] for (pid, tid), name in trace.thread_names.items())
        assert threads == expected["threads"]
        assert sorted([p, n] for p, n in trace.process_names.items()) == expected["processes"]
        assert not trace.truncated and trace.unmatched == 0
    names = {r.name: (r.count, r.total) for r in mxprof.load(V1).key_averages()}
    assert names["outer"] == (2, 9_360_000) and names["left open"] == (1, 1_000_000)


def test_packets_split_across_pieces_read_alike(tmp_path, monkeypatch):
    """The file is read a piece at a time: any piece size gives the same trace."""
    whole = rows(mxprof.load(V1))
    for size in (1, 7, 64, 1000):
        monkeypatch.setattr(perfetto, "PIECE", size)
        assert rows(mxprof.load(V1)) == whole


def test_a_cut_file_holds_the_whole_packets_before_the_cut(tmp_path):
    data = pathlib.Path(V1).read_bytes()
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[: len(data) - 5])
    trace = mxprof.load(cut)
    assert trace.truncated
    full = rows(mxprof.load(V1))
    assert 0 < len(trace) < len(full)
    # Everything loaded is in the whole file (a range still open at the cut is left out).
    assert all(r in full for r in rows(trace))


def test_damage_names_the_file_and_the_packet(tmp_path):
    data = bytearray(pathlib.Path(V1).read_bytes())
    ends, pos = [], 0
    while pos < len(data):  # packet boundaries (each length fits a byte or two here)
        size, shift, p = 0, 0, pos + 1
        while True:
            size |= (data[p] & 0x7F) << shift
            shift += 7
            p += 1
            if data[p - 1] < 0x80:
                break
        pos = p + size
        ends.append(pos)
    bad = tmp_path / "bad.pftrace"
    bad.write_bytes(bytes(data[: ends[4]]) + b"\x0a\x02\x00\x01" + bytes(data[ends[4] :]))
    with pytest.raises(TraceFormatError, match=r"bad\.pftrace: not a Perfetto trace: packet 5: "):
        mxprof.load(bad)


def test_the_same_scenario_written_now_loads_as_the_first_encoding_did(tmp_path):
    """The fixture's scenario recorded by today's writer (a sequence per
    thread, deltas, default tracks) loads to the very events, arguments and
    names the first encoding's file did; only the pid differs."""
    sys.path.insert(0, DATA)
    try:
        import make_perfetto_v1
    finally:
        sys.path.remove(DATA)
    path = tmp_path / "now.pftrace"
    make_perfetto_v1.record(os.fspath(path))
    with open(os.path.join(DATA, "perfetto_v1.expected.json")) as f:
        expected = json.load(f)
    # Threads by name: the pid, and the tids the core gives out, depend on the process.
    names = {tid: name for _, tid, name in expected["threads"]}

    # Threads in name order, each thread's events in their own order: which
    # thread comes first depends on the tids the core gave out in this process.
    def by_thread(events):
        return sorted(events, key=lambda r: r[5])  # stable: each thread's order kept

    want = by_thread([r[:5] + [names.get(r[6], "")] + r[7:] for r in expected["events"]])
    for trace in (mxprof.load(path), mxprof.trace.model.read_events(path)):
        named = {tid: name for (_, tid), name in trace.thread_names.items()}
        got = by_thread([r[:5] + [named.get(r[6], "")] + r[7:] for r in rows(trace)])
        assert got == want
        assert sorted(named.values()) == sorted(names.values())
        assert not trace.truncated and trace.unmatched == 0


def test_many_names_long_deltas_and_args_load_as_from_json(tmp_path):
    """Names interned under ids past one varint byte, deltas of one to four
    bytes, frames' arguments, ranges open over a flush: the general way and
    the compact encoding's fast one read alike, and as the JSON recording."""
    from mxprof import _testing

    d = mxprof.Domain("many")
    tasks = [d.new_task(f"t{i}") for i in range(300)]
    step = d.new_frame("step")

    def record(path):
        with _testing.fake_clock(1_000_000_000) as clock:
            mxprof.set_config(filename=os.fspath(path), profile_api=False)
            mxprof.set_state("run")
            for k in range(3):
                with step:
                    for i, t in enumerate(tasks):
                        with t:
                            clock(1 + (i * 7919) % 3_000_000)
                            with tasks[-1 - i]:
                                clock(100 + i)
                    if k == 1:
                        mxprof.dump(finished=False)
            mxprof.set_state("stop")
            mxprof.dump()

    def loaded(path):
        trace = mxprof.load(path)
        names = trace.thread_names
        out = [(names[e.pid, e.tid], e.name, e.category, e.ts, e.dur, e.args) for e in trace]
        return out, trace.unmatched

    record(tmp_path / "t.json")
    record(tmp_path / "t.pftrace")
    got, expected = loaded(tmp_path / "t.pftrace"), loaded(tmp_path / "t.json")
    assert len(got[0]) == 3 * (1 + 2 * 300)
    assert got == expected
    assert sorted(e[5]["frame"] for e in got[0] if e[1] == "step") == [0, 1, 2]
