"""The compiled .pftrace path (native/offline/mxo_pftrace.c, perfetto._Compiled)
against the pure decoding.

Every trace here is read twice, with ``MXPROF_PURE_READER=1`` and without,
and everything a reading gives is compared exactly (test_fastjson's
comparison: each thread's columns and args, the keys in their order,
``key_averages`` of ``load`` and of ``read_events``, metadata, names,
samples, unmatched slices, cut files) plus the lists of Events
``read_protobuf`` fills for ``merge`` and one shared sink, or the same
error.  The traces: ones the live core writes (several threads, flushes,
counters, frames, markers, memory, samples), the old encoding
(tests/data/perfetto_v1.pftrace), ``merge``'s output, packets made by hand
at the edges of what the C takes, and damaged, cut and random copies.

Run under AddressSanitizer by native/offline/asan.sh (.ci/run does).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_fastjson import _Shared, _threads

import mxprof
from mxprof import _testing
from mxprof.errors import TraceFormatError
from mxprof.trace import _fastread, perfetto
from mxprof.trace.model import read_events, read_protobuf

DATA = Path(__file__).resolve().parent / "data"

pytestmark = pytest.mark.skipif(
    not _fastread.available() and os.environ.get("MXPROF_PURE_READER", "") in ("", "0"),
    reason="mxprof.trace._fastjson is not built",
)


def _reading(path, pure: bool):
    """Everything the readers give of a .pftrace, the compiled path on or off."""
    saved = os.environ.get("MXPROF_PURE_READER")
    os.environ["MXPROF_PURE_READER"] = "1" if pure else "0"
    try:
        out: dict = {}
        try:
            t = mxprof.load(path)
        except TraceFormatError as e:
            return {"error": str(e)}
        out["load"] = (
            [repr(r) for r in t.key_averages()],
            len(t),
            sorted(t.point_categories()),
            sorted(t.categories()),
            t.truncated,
            t.metadata,
            t.process_names,
            t.thread_names,
            t.unmatched,
            repr(t.samples),
        )
        out["load_events"] = _threads(t)
        e = read_events(path)
        out["read_events"] = (_threads(e), [repr(r) for r in e.key_averages()], e.unmatched)
        read = read_protobuf(path, None)  # merge's way: lists of Events
        assert read is not None
        converted, metadata, truncated = read
        lists = {k: list(v) for k, v in converted.finish().items()}
        out["lists"] = (lists, metadata, truncated, converted.unmatched)
        out["sinks made"] = list(lists)  # in order: merge renumbers pids in that order
        out["names"] = (converted.process_names, converted.thread_names)
        shared = _Shared()  # one sink for every thread: the order across threads counts
        read = read_protobuf(path, lambda key: shared)
        assert read is not None
        read[0].finish()
        out["shared"] = shared.events
        return out
    finally:
        if saved is None:
            del os.environ["MXPROF_PURE_READER"]
        else:
            os.environ["MXPROF_PURE_READER"] = saved


def _same(path):
    """Read path both ways; assert the same; return the compiled reading."""
    pure = _reading(path, pure=True)
    fast = _reading(path, pure=False)
    assert fast.keys() == pure.keys()
    for part in pure:
        assert fast[part] == pure[part], part
    return fast


@pytest.fixture
def taken(monkeypatch):
    """The ranges the compiled path paired, handed on per batch."""
    seen: list[int] = []
    take = _fastread.Reader.flush_rows

    def spy(self):
        seen.append(self.state.n)
        take(self)

    monkeypatch.setattr(_fastread.Reader, "flush_rows", spy)
    return seen


# ---- traces the live core writes ----


def _record(path: Path, steps: int, threads: int = 2, samples: bool = True) -> None:
    """Ranges on the main thread and on `threads` others, frames, a counter,
    markers of each scope, memory, stack samples; flushed every 25 steps."""
    _testing.reset()
    config = dict(filename=str(path), profile_api=False, profile_memory=True, max_events=0)
    if samples:
        config["sample_rate"] = 2000
    mxprof.set_config(**config)
    d = mxprof.Domain("train")
    step = d.new_frame("step")
    loss = d.new_counter("loss", 0)
    tasks = [d.new_task(n) for n in ("data", "forward", "backward", 'ünïcode "q"')]
    mark = d.new_marker("tick")

    def work(n: int, scope: str) -> None:
        for i in range(n):
            with tasks[0], tasks[2]:
                pass
            with tasks[1]:
                buf = mxprof.memory.record_alloc(1 << 20, "gpu:0", tag="act")
                for _ in range(2):
                    with tasks[3]:
                        sum(range(200))
                mxprof.memory.record_free(buf)
            loss.set_value(i)
            mark.mark(scope)

    mxprof.set_state("run")
    others = [
        threading.Thread(target=work, args=(steps, ("thread", "global")[k % 2]))
        for k in range(threads)
    ]
    for t in others:
        t.start()
    for i in range(steps):
        with step:
            work(1, "process")
        if i % 25 == 24:
            mxprof.dump(finished=False)
    for t in others:
        t.join(timeout=60)
    mxprof.set_state("stop")
    mxprof.dump()
    _testing.reset()


@pytest.fixture(scope="module")
def core(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("core") / "core.pftrace"
    _record(path, 120)
    return path


def test_a_core_trace_reads_the_same_the_compiled_way(core, taken):
    got = _same(core)
    ranges = sum(int(r.split("count=")[1].split(",")[0]) for r in got["load"][0])
    # Every plain range the compiled way (the frames' steps carry args: Python's).
    assert sum(taken) >= 3 * 2 * (ranges - 120) // 4  # (load, read_events, load's events)
    assert ranges == 120 + 3 * 120 * 5
    threads, keys = got["read_events"][0]
    assert len(threads) >= 4 and 'ünïcode "q"' in keys[0]
    assert got["load"][8] == 0  # no slice left unmatched
    assert "Samples" in got["load"][9] or "sample" in got["load"][9].lower()


def test_small_pieces_and_batches(core, monkeypatch, taken):
    """Pieces of the file that cut packets anywhere, and batches of 7 rows:
    every seam between the C and Python meets every kind of packet."""
    monkeypatch.setattr(perfetto, "PIECE", 997)
    init = perfetto._Compiled.__init__

    def small(self, reader):
        init(self, reader)
        self.pf.row_limit = 7

    monkeypatch.setattr(perfetto._Compiled, "__init__", small)
    _same(core)
    assert len(taken) > 100 and max(taken) <= 7 + 1  # (a Python put may pass the limit)


def test_cut_copies(core, tmp_path):
    data = core.read_bytes()
    rng = random.Random(5)
    cut_short = 0
    for k, cut in enumerate(sorted(rng.sample(range(1, len(data)), 25)) + [len(data) - 1]):
        path = tmp_path / f"cut{k}.pftrace"
        path.write_bytes(data[:cut])
        got = _same(path)
        cut_short += "error" not in got and got["load"][4]
    assert cut_short >= 20  # (a cut between packets leaves a whole trace)


@pytest.mark.parametrize("seed", range(40))
def test_damaged_copies(core, tmp_path, seed):
    """Bytes flipped, dropped or added: the same error, or the same result."""
    data = bytearray(core.read_bytes()[: 40_000 + 997 * seed])
    rng = random.Random(seed)
    for _ in range(rng.randrange(1, 6)):
        at = rng.randrange(len(data))
        how = rng.randrange(4)
        if how == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif how == 1:
            data[at] = rng.randrange(256)
        elif how == 2:
            del data[at]
        else:
            data[at:at] = bytes([rng.randrange(256)])
    path = tmp_path / "damaged.pftrace"
    path.write_bytes(bytes(data))
    _same(path)


@pytest.mark.parametrize("seed", range(10))
def test_random_bytes(tmp_path, seed):
    rng = random.Random(100 + seed)
    path = tmp_path / "random.pftrace"
    path.write_bytes(b"\n" + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4000))))
    _same(path)


def test_the_old_encoding():
    got = _same(DATA / "perfetto_v1.pftrace")
    assert got["load"][1] > 0


def test_merge_outputs(tmp_path, taken):
    """merge -o X.pftrace writes the compact encoding: read the compiled way."""
    from test_merge_pftrace import awkward
    from test_merge_stream import BASE, steps, write

    from mxprof.trace.merge import merge

    a = write(tmp_path / "a.json", steps(40, 0.0, n=200) + awkward(7), base=BASE)
    b = write(tmp_path / "b.json", steps(41, 50.0, n=200) + awkward(9, tid=0), base=BASE + 5_000)
    merge([a, b], tmp_path / "m.pftrace")
    got = _same(tmp_path / "m.pftrace")
    assert got["load"][1] > 1200 and sum(taken) >= 3 * 2 * 200  # (every fwd, at least)
    merge([tmp_path / "m.pftrace"], tmp_path / "again.pftrace")
    _same(tmp_path / "again.pftrace")


# ---- packets made by hand: the edges of what the C takes ----


def _v(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _num(field: int, value: int) -> bytes:
    return _v(field << 3) + _v(value)


def _msg(field: int, body: bytes) -> bytes:
    return _v(field << 3 | 2) + _v(len(body)) + body


def _packet(body: bytes) -> bytes:
    return b"\x0a" + _v(len(body)) + body


SEQ = 9
TRACK = 77
HEAD = b"".join(
    [
        # The trace's MONOTONIC base (process sequence), a process and a thread.
        _packet(_num(10, 1) + _msg(6, _msg(1, _num(1, 3) + _num(2, 5000)))),
        _packet(_num(10, 1) + _msg(60, _num(1, 5) + _msg(3, _num(1, 42) + _msg(6, b"proc")))),
        _packet(
            _num(10, 1) + _msg(60, _num(1, TRACK) + _num(5, 5) + _msg(4, _num(1, 42) + _num(2, 7)))
        ),
        # The thread's sequence: cleared, defaults (clock 64, the track), clock 64 at the base.
        _packet(_num(10, SEQ) + _num(13, 1) + _msg(59, _num(58, 64) + _msg(11, _num(11, TRACK)))),
        _packet(
            _num(10, SEQ)
            + _msg(
                6,
                _msg(1, _num(1, 64) + _num(2, 5000) + _num(3, 1))
                + _msg(1, _num(1, 3) + _num(2, 5000)),
            )
        ),
        # Interned names 1 and 2 and categories 1 and 2.
        _packet(
            _num(10, SEQ)
            + _msg(
                12,
                _msg(2, _num(1, 1) + _msg(2, b"alpha"))
                + _msg(2, _num(1, 2) + _msg(2, "b\u00e9ta".encode()))
                + _msg(1, _num(1, 1) + _msg(2, b"cat"))
                + _msg(1, _num(1, 2) + _msg(2, b"c2")),
            )
        ),
    ]
)


def _begin(delta: int, name: int = 1, cat: int = 1, seq: int = SEQ, flags: bytes = b"") -> bytes:
    event = _num(9, 1) + _num(10, name) + _num(3, cat)
    return _packet(_num(8, delta) + _num(10, seq) + flags + _msg(11, event))


def _end(delta: int, seq: int = SEQ) -> bytes:
    return _packet(_num(8, delta) + _num(10, seq) + _msg(11, _num(9, 2)))


def _sample(delta: int, track: int, value: int, seq: int = SEQ) -> bytes:
    """A counter sample as the core writes it: type, track, value (field 30)."""
    event = _num(9, 4) + _num(11, track) + _num(30, value)
    return _packet(_num(8, delta) + _num(10, seq) + _msg(11, event))


def _sequence(seq: int, track: int) -> bytes:
    """A sequence started as the core starts a thread's: cleared, defaults
    (clock 64, the track), clock 64 at the base."""
    defaults = _num(58, 64) + _msg(11, _num(11, track))
    clocks = _msg(1, _num(1, 64) + _num(2, 5000) + _num(3, 1)) + _msg(1, _num(1, 3) + _num(2, 5000))
    return _packet(_num(10, seq) + _num(13, 1) + _msg(59, defaults)) + _packet(
        _num(10, seq) + _msg(6, clocks)
    )


LOSS = 555  # a counter track, declared by COUNTER_TRACK
COUNTER_TRACK = _packet(
    _num(10, 1) + _msg(60, _num(1, LOSS) + _num(5, 5) + _msg(2, b"loss") + _msg(8, b""))
)


PLAIN = _begin(10) + _begin(5, 2, 2) + _end(3) + _end(4)

EDGES = {
    "plain": PLAIN,
    "flags": _begin(1, flags=_num(13, 2)) + _end(1),
    "cleared": _begin(1) + _begin(1, flags=_num(13, 3)) + _end(1) + _end(1),
    "unknown iids": _begin(1, 300, 2**40) + _end(1),
    "iid of 64 bits": _begin(1, 2**64 - 1, 2**63) + _end(1),
    "unmatched end": _end(1) + PLAIN + _end(2),
    "open at the end": PLAIN + _begin(1) + _begin(2),
    "redundant varint": _packet(b"\x40\x85\x00\x50" + _v(SEQ) + _msg(11, _num(9, 2)))
    + _begin(1)
    + _packet(b"\x40\x85\x80\x80\x00\x50" + _v(SEQ) + _msg(11, b"\x48\x82\x00")),
    "ten-byte varint": _begin(1)
    + _packet(b"\x40" + b"\x81" + b"\x80" * 8 + b"\x00\x50" + _v(SEQ) + _msg(11, _num(9, 2))),
    "past 64 bits": _begin(1)
    + _packet(b"\x40" + b"\xff" * 9 + b"\x7f\x50" + _v(SEQ) + _msg(11, _num(9, 2)))
    + _end(1),
    "eleven bytes": _begin(1)
    + _packet(b"\x40" + b"\x80" * 10 + b"\x00\x50" + _v(SEQ) + _msg(11, _num(9, 2))),
    "a huge delta": _begin(1) + _end(2**62) + _begin(1) + _end(1),
    "past int64": _begin(1) + _begin(2**63 + 5) + _end(2**63) + _end(1) + PLAIN,
    "near the limit": _begin(2**61 - 10_000) + _end(9_000) + _begin(500) + _end(2000),
    "another sequence": _begin(1) + _begin(1, seq=SEQ + 1) + _end(1) + _end(1, seq=SEQ + 1),
    "a big sequence id": _begin(1, seq=2**64 - 1) + PLAIN,
    "an extra field": _begin(1)
    + _packet(_num(8, 1) + _num(10, SEQ) + _msg(11, _num(9, 2) + _num(11, TRACK))),
    "extra packet field": _begin(1)
    + _packet(_num(8, 1) + _num(10, SEQ) + _num(99, 4) + _msg(11, _num(9, 2))),
    "event length short": _begin(1)
    + _packet(_num(8, 1) + _num(10, SEQ) + b"\x5a\x01" + _num(9, 2)),
    "event length long": _begin(1) + _packet(_num(8, 1) + _num(10, SEQ) + b"\x5a\x03" + _num(9, 2)),
    "an instant between": _begin(1)
    + _packet(_num(8, 1) + _num(10, SEQ) + _msg(11, _num(9, 3) + _num(10, 2) + _num(3, 2)))
    + _end(1),
    "a counter between": _begin(1)
    + _packet(_num(8, 1) + _num(10, SEQ) + _msg(11, _num(9, 4) + _num(11, 5) + _num(30, 9)))
    + _end(1),
    "an end on another track": _begin(1)
    + _packet(_num(8, 1) + _num(10, SEQ) + _msg(11, _num(9, 2) + _num(11, TRACK)))
    + _end(1),
    "args on a begin": _packet(
        _num(8, 1)
        + _num(10, SEQ)
        + _msg(11, _num(9, 1) + _num(10, 1) + _num(3, 1) + _msg(4, _msg(10, b"k") + _num(3, 7)))
    )
    + _begin(2)
    + _end(1)
    + _end(1),
    "empty packet": _begin(1) + _packet(b"") + _end(1),
    "counters": COUNTER_TRACK
    + _begin(1)
    + _sample(1, LOSS, 7)
    + _sample(2, LOSS, 2**64 - 3)
    + _end(1)
    + _sample(0, LOSS, 0),
    "a counter of an unknown track": _begin(1)
    + _sample(1, 999, 4)
    + _end(1)
    + _packet(_num(10, SEQ) + _msg(12, _msg(2, _num(1, 0) + _msg(2, b"zero"))))
    + _sample(1, 999, 5),
    "a counter declared late": _sample(1, LOSS, 1) + COUNTER_TRACK + _sample(1, LOSS, 2),
    "a counter past 64 bits": _sample(1, LOSS, 3)
    + _packet(
        _num(8, 1)
        + _num(10, SEQ)
        + _msg(11, _num(9, 4) + _num(11, LOSS) + b"\xf0\x01" + b"\xff" * 9 + b"\x03")
    ),
    "a counter of the process": _sample(1, 5, 11) + PLAIN + _sample(1, 5, 12),
    # Sequence ids past one byte: the pure decoding makes the thread's sink at
    # its first range, not where the sequence starts (merge numbers pids so).
    "a big sequence": COUNTER_TRACK
    + _packet(_num(10, 1) + _msg(60, _num(1, 6) + _msg(3, _num(1, 43) + _msg(6, b"p2"))))
    + _packet(_num(10, 1) + _msg(60, _num(1, 556) + _num(5, 6) + _msg(2, b"gpu") + _msg(8, b"")))
    + _packet(_num(10, 1) + _msg(60, _num(1, 78) + _num(5, 5) + _msg(4, _num(1, 42) + _num(2, 8))))
    + _sequence(300, 78)
    + _sample(1, 556, 1, seq=300)
    + _sample(1, LOSS, 2, seq=300)
    + _begin(1, seq=300)
    + _sample(1, 556, 3, seq=300)
    + _end(1, seq=300)
    + _sample(1, LOSS, 4, seq=300),
    "zero length": _begin(5) + _end(0) + _begin(0, 2, 2) + _end(0),
    "interned again": PLAIN
    + _packet(_num(10, SEQ) + _msg(12, _msg(2, _num(1, 1) + _msg(2, b"renamed"))))
    + PLAIN,
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edges(tmp_path, name, monkeypatch):
    path = tmp_path / "edge.pftrace"
    path.write_bytes(HEAD + EDGES[name] * 3)
    python_put: list[str] = []  # the events Python decoded and handed to the rows
    put = perfetto._Compiled.put

    def spy(self, pid, tid, ts, dur, name, cat, ph, args):
        python_put.append(ph)
        return put(self, pid, tid, ts, dur, name, cat, ph, args)

    monkeypatch.setattr(perfetto._Compiled, "put", spy)
    got = _same(path)
    if name == "a big sequence":
        assert got["sinks made"] == [(42, 7), (43, 0), (42, 0), (42, 8)]
    if name == "counters":  # every sample and range the C's (3 readings, the file thrice)
        assert python_put == []
        samples = [e for e in got["lists"][0][(42, 0)] if e.ph == "C"]
        assert [e.args for e in samples] == [{"loss": 7}, {"loss": -3}, {"loss": 0}] * 3
    if name == "plain":
        rows = got["read_events"][0][0]
        assert [(t[0], t[1], t[2], t[3]) for t in rows] == [
            (42, 7, [10, 15, 32, 37, 54, 59], [12, 3, 12, 3, 12, 3])
        ]
        assert got["read_events"][0][1][0] == ["b\u00e9ta", "alpha"]


def test_all_edges_in_one_file_in_small_pieces(tmp_path, monkeypatch):
    path = tmp_path / "edges.pftrace"
    path.write_bytes(HEAD + b"".join(EDGES[k] for k in sorted(EDGES)))
    _same(path)
    for piece in (3, 64, 1000):
        monkeypatch.setattr(perfetto, "PIECE", piece)
        _same(path)


# ---- the switch, and the C's own checks ----


def test_the_switch(monkeypatch):
    from mxprof.trace._convert import Converter

    def decoder(converter):
        return perfetto._Decoder(converter, converter and _fastread.reader(converter))

    monkeypatch.setenv("MXPROF_PURE_READER", "1")
    assert decoder(Converter()).compiled is None
    monkeypatch.setenv("MXPROF_PURE_READER", "0")
    assert decoder(Converter()).compiled is not None
    assert decoder(None).compiled is None  # read_perfetto: raw events, pure


def test_a_sink_that_takes_row_blocks_gets_events(core, monkeypatch):
    """A sink every thread shares with ``take_rows`` (parquet's) takes JSON's
    rows as RowBlocks; a .pftrace's (args held in Python) come as events."""

    class Rows(_Shared):
        def take_rows(self, block):
            raise AssertionError("a .pftrace's rows as a RowBlock")

    got = {}
    for pure in ("1", "0"):
        monkeypatch.setenv("MXPROF_PURE_READER", pure)
        sink = Rows()
        read = read_protobuf(core, lambda key, sink=sink: sink)
        assert read is not None
        read[0].finish()
        got[pure] = sink.events
    assert got["0"] == got["1"] and len(got["1"]) > 1000


def test_without_the_module_the_pure_path_runs(core):
    """mxprof.trace._fastjson missing (no compiler at install): a .pftrace
    loads the pure way, with the same result."""
    code = (
        "import sys, json; sys.modules['mxprof.trace._fastjson'] = None\n"
        "import mxprof\nfrom mxprof.trace import _fastread\n"
        "t = mxprof.load(sys.argv[1])\n"
        "print(json.dumps([_fastread.lib is None, [repr(r) for r in t.key_averages()],\n"
        "    [repr(e) for e in t.events]]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("MXPROF_PURE_READER", None)
    run = subprocess.run(
        [sys.executable, "-c", code, str(core)], env=env, capture_output=True, text=True,
        timeout=120, cwd=str(core.parent),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    missing, rows, events = json.loads(run.stdout)
    t = mxprof.load(core)
    assert missing and rows == [repr(r) for r in t.key_averages()]
    assert events == [repr(e) for e in t.events] and len(events) > 1000


def test_stacks_and_arguments():
    ffi, lib = _fastread.ffi, _fastread.lib
    pf = ffi.gc(lib.mxo_pf_new(), lib.mxo_pf_free)
    r = ffi.gc(lib.mxo_new(), lib.mxo_free)
    ts, ref, pos = ffi.new("int64_t *"), ffi.new("int64_t *"), ffi.new("size_t *")
    a, b = lib.mxo_pf_stack_new(pf), lib.mxo_pf_stack_new(pf)
    assert (a, b) == (0, 1)
    for i in range(3000):
        assert lib.mxo_pf_push(pf, a, i, -i) == 0
    assert lib.mxo_pf_pop(pf, b, ts, ref) == 0  # empty
    assert pf.open == 3000
    assert lib.mxo_pf_pop(pf, a, ts, ref) == 1 and (ts[0], ref[0]) == (2999, -2999)
    assert lib.mxo_pf_push(pf, 2, 0, 0) < 0 and lib.mxo_pf_pop(pf, -1, ts, ref) < 0
    assert lib.mxo_pf_cache(pf, 1, 1, 0) < 0  # no such proto
    assert lib.mxo_pf_proto(pf, b"n", 1, b"", 0, b"X") == 0
    assert lib.mxo_pf_cache(pf, 1, 1, 0) == 0
    # A run with a stack or thread that is not there, or a clock out of range: refused.
    data = PLAIN
    assert lib.mxo_pf_run(r, pf, data, len(data), pos) < 0  # no thread yet
    assert lib.mxo_pf_thread(r, pf, 1, 2) == 0
    pf.seq, pf.stack = SEQ, b
    pf.now = 2**61 + 1
    assert lib.mxo_pf_run(r, pf, data, len(data), pos) < 0
    pf.now = 0
    pos[0] = len(data) + 1
    assert lib.mxo_pf_run(r, pf, data, len(data), pos) < 0
    pos[0] = 0
    assert lib.mxo_pf_run(r, pf, data, len(data), pos) == 1  # iid 2 is not cached
    assert (pos[0], pf.miss_name, pf.miss_cat, pf.count) == (len(_begin(10)), 2, 2, 1)
    assert lib.mxo_pf_proto(pf, b"m", 1, b"c", 1, b"X") == 1 and lib.mxo_pf_cache(pf, 2, 2, 1) == 0
    assert lib.mxo_pf_run(r, pf, data, len(data), pos) == 0
    assert (pos[0], pf.count, pf.now, r.n, pf.open) == (len(data), 4, 22, 2, 2999)
    assert (r.ts[0], r.dur[0], r.ts[1], r.dur[1]) == (15, 3, 10, 12)
