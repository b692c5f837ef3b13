"""The compiled reader (mxprof.trace._fastjson, trace/_fastread.py) against the pure one.

Every trace here is read twice, with ``MXPROF_PURE_READER=1`` and without,
and everything a reading gives is compared exactly: each thread's columns
(ts, dur, kind), its args, the keys in their order, the metadata, names,
samples, ``key_averages`` of ``load`` (the summary sink) and of
``read_events`` (the columns), and the lists of Events ``read_lines`` fills
for ``merge`` and for one shared sink (``parquet``'s).  The traces: ones
the live core writes, and lines in the core's shape mixed with hostile
ones, cut into small blocks so that rows and runs meet at every boundary.

Run under AddressSanitizer by native/offline/asan.sh (.ci/run does).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import mxprof
from mxprof import _testing
from mxprof.errors import TraceFormatError
from mxprof.trace import _fastread, _scan
from mxprof.trace.model import read_events, read_lines

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not _fastread.available() and os.environ.get("MXPROF_PURE_READER", "") in ("", "0"),
    reason="mxprof.trace._fastjson is not built",
)


class _Shared:
    """One sink for every thread, as parquet's: the order across threads counts."""

    def __init__(self) -> None:
        self.events: list = []
        self.append = self.events.append


def _threads(trace):
    events = trace.events
    return (
        [
            (t.pid, t.tid, list(t.ts), list(t.dur), list(t.kind), t.extras, t.ranges)
            for t in events.threads
        ],
        (events.keys.names, events.keys.categories, events.keys.phases),
    )


def _reading(path, pure: bool):
    """Everything the readers give of path, the compiled path on or off."""
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
        try:
            converted, metadata = read_lines(path, None)
            lists = {k: list(v) for k, v in converted.finish().items()}
            out["lists"] = (lists, metadata, converted.process_names, converted.thread_names)
            shared = _Shared()
            converted, _ = read_lines(path, lambda key: shared)
            converted.finish()
            out["shared"] = shared.events
        except _scan.NotLines:
            out["lists"] = "not lines"
        return out
    finally:
        if saved is None:
            del os.environ["MXPROF_PURE_READER"]
        else:
            os.environ["MXPROF_PURE_READER"] = saved


def _same(path):
    """Read path both ways; assert the same; return the reading."""
    pure = _reading(path, pure=True)
    fast = _reading(path, pure=False)
    for part in pure:
        assert fast[part] == pure[part], part
    assert fast.keys() == pure.keys()
    return fast


@pytest.fixture
def takes(monkeypatch):
    """The outcomes of Reader.take (True: the block was read the compiled way)."""
    seen: list[bool] = []
    take = _fastread.Reader.take

    def spy(self, text):
        seen.append(take(self, text))
        return seen[-1]

    monkeypatch.setattr(_fastread.Reader, "take", spy)
    return seen


# ---- traces the live core writes ----


def _record(path: Path, steps: int) -> None:
    _testing.reset()
    mxprof.set_config(filename=str(path), profile_api=False, profile_memory=True, max_events=0)
    d = mxprof.Domain("train")
    step = d.new_frame("step")
    loss = d.new_counter("loss", 0)
    tasks = [d.new_task(n) for n in ("data", "forward", "backward", 'ünïcode "q"')]
    mark = d.new_marker("tick")
    mxprof.set_state("run")
    for i in range(steps):
        with step:
            with tasks[0]:
                pass
            with mxprof.scope("fwd:"), tasks[1]:
                buf = mxprof.memory.record_alloc(1 << 20, "gpu:0", tag="act")
                for _ in range(3):
                    with tasks[2]:
                        pass
                mxprof.memory.record_free(buf)
            with tasks[3]:
                pass
            loss.set_value(i)
            mark.mark("process")
    mxprof.set_state("stop")
    mxprof.dump()
    _testing.reset()


def test_a_core_trace_reads_the_same_and_the_compiled_way(tmp_path, takes):
    path = tmp_path / "core.json"
    _record(path, 300)
    got = _same(path)
    assert takes and all(takes)  # every block the compiled way: the comparison is not vacuous
    rows = {r.split("(")[0] for r in got["load"][0]}
    assert len(got["load"][0]) >= 5 and rows  # the statistics were worked out
    threads, keys = got["read_events"][0]
    assert sum(len(t[2]) for t in threads) == got["load"][1] > 300 * 8
    assert 'ünïcode "q"' in keys[0]  # an escaped, non-ASCII name (a run) among rows


def test_a_core_trace_in_small_blocks(tmp_path, monkeypatch, takes):
    path = tmp_path / "core.json"
    _record(path, 60)
    monkeypatch.setattr(_scan, "BLOCK", 700)  # rows, runs and block ends everywhere
    _same(path)
    assert len(takes) > 20 and all(takes)


def test_gzip_and_an_indexed_core_trace(tmp_path):
    import gzip

    path = tmp_path / "core.json"
    _record(path, 40)
    (tmp_path / "core.json.gz").write_bytes(gzip.compress(path.read_bytes()))
    _same(tmp_path / "core.json.gz")


# ---- lines: the core's shape and hostile ones ----

GOOD = [
    '{"name":"a","cat":"c","ph":"X","ts":338.417,"dur":2.604,"pid":4127,"tid":1}',
    '{"name":"b","cat":"c","ph":"X","ts":338,"dur":2,"pid":4127,"tid":1}',
    '{"name":"p","cat":"c","ph":"X","ts":330.1,"dur":20.75,"pid":4127,"tid":1}',
    '{"name":"z","cat":"","ph":"X","ts":0,"dur":0,"pid":0,"tid":0}',
    '{"name":"n","cat":"c","ph":"X","ts":-5.5,"dur":-1,"pid":-3,"tid":2}',
    '{"name":"nodur","cat":"c","ph":"X","ts":12.345,"pid":1,"tid":2}',
    '{"ph":"X","ts":1.5,"dur":1}',
    '{"tid":7,"pid":1,"dur":4.5,"ts":99.999,"ph":"X","cat":"k","name":"order"}',
    '{ "name" : "ws" , "cat":"c", "ph":"X", "ts": 3 , "dur" : 1 ,"pid":1,"tid":1 }',
    '{"name":"Memory: gpu/0","cat":"Device Storage","ph":"C","ts":445.342,"pid":1,"tid":1,'
    '"args":{"Memory: gpu/0":1048576}}',
    '{"name":"loss","cat":"train","ph":"C","ts":446,"pid":1,"tid":1,"args":{"loss":0.25}}',
    '{"name":"tick","cat":"m","ph":"i","ts":447.001,"pid":1,"tid":1,"args":{}}',
    '{"name":"i2","cat":"m","ph":"i","ts":447.001,"pid":1,"tid":1}',
    '{"name":"n","cat":"m","ph":"n","ts":448,"pid":1,"tid":3}',
    '{"name":"r","cat":"m","ph":"R","ts":449,"pid":1,"tid":3,"args":{"s":"x","v":-0.5}}',
    '{"name":"big","cat":"c","ph":"X","ts":999999999999.999,"dur":999999999999.999,'
    '"pid":999999999999999999,"tid":-999999999999999999}',
    '{"name":"neg0","cat":"c","ph":"X","ts":-0,"dur":-0.0,"pid":1,"tid":1}',
    '{"name":"ph-args","cat":"c","ph":"i","ts":1,"pid":1,"tid":1,"args":{"ph":"b"}}',
    # JSON's whitespace, newlines too, may come between the members: one row still.
    '{"name":"multi",\n"cat":"c","ph":"X","ts":7,"dur":1,\n"pid":1,"tid":1}',
]

HOSTILE = [
    '{"name":"esc\\"aped\\u00e9","cat":"c","ph":"X","ts":1,"dur":1,"pid":1,"tid":1}',
    '{"name":"ünï","cat":"c","ph":"X","ts":2,"dur":1,"pid":1,"tid":1}',
    '{"name":"digits","cat":"c","ph":"X","ts":1.0005,"dur":0.0015,"pid":1,"tid":1}',
    '{"name":"manyd","cat":"c","ph":"X","ts":338.41700000000003,"dur":2.6,"pid":1,"tid":1}',
    '{"name":"huge","cat":"c","ph":"X","ts":1e20,"dur":1,"pid":1,"tid":1}',
    '{"name":"huger","cat":"c","ph":"X","ts":1e400,"dur":1,"pid":1,"tid":1}',
    '{"name":"epoch","cat":"c","ph":"X","ts":1700000000000000.125,"dur":1.5,"pid":1,"tid":1}',
    '{"name":"13d","cat":"c","ph":"X","ts":1000000000000.5,"dur":1,"pid":1,"tid":1}',
    '{"name":"exp","cat":"c","ph":"X","ts":1.5e3,"dur":1,"pid":1,"tid":1}',
    '{"name":"fpid","cat":"c","ph":"X","ts":5,"dur":1,"pid":1.0,"tid":1}',
    '{"name":"spid","cat":"c","ph":"X","ts":5,"dur":1,"pid":"p1","tid":"t"}',
    '{"name":"bigpid","cat":"c","ph":"X","ts":5,"dur":1,"pid":12345678901234567890,"tid":1}',
    '{"name":"strts","cat":"c","ph":"X","ts":"12","dur":1,"pid":1,"tid":1}',
    '{"name":"nullts","cat":"c","ph":"X","ts":null,"dur":1,"pid":1,"tid":1}',
    '{"name":"nulldur","cat":"c","ph":"X","ts":3,"dur":null,"pid":1,"tid":1}',
    '{"name":"nots","cat":"c","ph":"X","dur":1,"pid":1,"tid":1}',
    '{"name":"noph","cat":"c","ts":1,"dur":1,"pid":1,"tid":1}',
    '{"name":"B","cat":"c","ph":"B","ts":10,"pid":1,"tid":1}',
    '{"name":"B","cat":"c","ph":"E","ts":12.5,"pid":1,"tid":1,"args":{"e":1}}',
    '{"name":"as","cat":"c","ph":"b","ts":10,"pid":1,"tid":1,"id":7}',
    '{"name":"as","cat":"c","ph":"e","ts":11,"pid":1,"tid":1,"id":7}',
    '{"name":"I","cat":"c","ph":"I","ts":4,"pid":1,"tid":1}',
    '{"name":"nested","cat":"c","ph":"X","ts":4,"dur":1,"pid":1,"tid":1,"args":{"a":{"b":[1]}}}',
    '{"name":"dup","cat":"c","ph":"X","ts":4,"ts":5,"dur":1,"pid":1,"tid":1}',
    '{"name":"other","cat":"c","ph":"X","ts":4,"dur":1,"pid":1,"tid":1,"id":"x"}',
    '{"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"proc"}}',
    '{"name":"thread_name","ph":"M","pid":1,"tid":1,"args":{"name":"main"}}',
    '{"name":"mxprof_frame","ph":"M","pid":1,"tid":1,"args":{"id":1,"function":"f",'
    '"file":"x.py","line":3}}',
    '{"name":"mxprof_stack","ph":"M","pid":1,"tid":1,"args":{"id":1,"parent":0,"frame":1}}',
    '{"name":"f","cat":"mxprof.sample","ph":"i","ts":5,"pid":1,"tid":1,"args":{"stack":1}}',
    '{"name":"f","cat":"mxprof.sample","ph":"i","ts":6,"pid":1,"tid":1}',
    "{}",
    '{"name":"ctl\\t","cat":"c","ph":"X","ts":1,"dur":1,"pid":1,"tid":1}',
    '{"name":"t","cat":"c","ph":"X","ts":1,"dur":1,"pid":true,"tid":1}',
    '{"name":"t","cat":"c","ph":"X","ts":1,"dur":1,"pid":1,"tid":1,"args":null}',
    '{"name":1,"cat":"c","ph":"X","ts":1,"dur":1,"pid":1,"tid":1}',
    # A line that looks like a row inside an event of many lines.
    '{"name":"outer","cat":"c","ph":"X","ts":8,"dur":9,"pid":1,"tid":1,"args":{"l":[\n'
    '{"name":"inner","cat":"c","ph":"X","ts":8,"dur":1,"pid":1,"tid":1},\n'
    '{"name":"inner2","cat":"c","ph":"X","ts":8,"dur":1,"pid":1,"tid":1}]}}',
    # ... and after a comma: the compiled way takes it for a row, then declines the block.
    '{"name":"outer2","cat":"c","ph":"X","ts":8,"dur":9,"pid":1,"tid":1,"args":{"l":[1,\n'
    '{"name":"inner3","cat":"c","ph":"X","ts":8,"dur":1,"pid":1,"tid":1},\n'
    "2]}}",
]

DAMAGE = [
    '{"name":"lead0","cat":"c","ph":"X","ts":01,"dur":1,"pid":1,"tid":1}',
    '{"name":"nan","cat":"c","ph":"X","ts":NaN,"dur":1,"pid":1,"tid":1}',
    '{"name":"dot","cat":"c","ph":"X","ts":1.,"dur":1,"pid":1,"tid":1}',
    '{"name":"cut","cat":"c","ph":"X","ts":1,"dur',
    '{"name":"two","ph":"X","ts":1,"pid":1,"tid":1} {"name":"x","ph":"X","ts":1}',
    '{"name":"bad\xff","cat":"c","ph":"X","ts":1,"dur":1,"pid":1,"tid":1}',
]


def _write(path: Path, lines: list[str], sep: str = ",\n", tail: str = "\n]}") -> None:
    head = '{"displayTimeUnit":"ms","traceEvents":[\n'
    path.write_bytes((head + sep.join(lines) + tail).encode("utf-8", "surrogateescape"))


@pytest.mark.parametrize("line", GOOD)
def test_each_line_in_the_cores_shape_is_a_row(tmp_path, line, takes):
    r = _fastread.Reader(_fastread.Converter())
    text = ("[" + line + "]").encode()
    assert _fastread.lib.mxo_parse(r._r, _fastread.ffi.from_buffer(text), len(text)) == 0
    assert (r._r.n, r._r.n_runs) == (1, 0)
    _write(tmp_path / "t.json", [GOOD[0], line, GOOD[1]])
    _same(tmp_path / "t.json")


@pytest.mark.parametrize("line", HOSTILE + DAMAGE)
def test_each_hostile_line_is_left_to_the_pure_path(tmp_path, line):
    r = _fastread.Reader(_fastread.Converter())
    text = ("[" + line + "]").encode("utf-8", "surrogateescape")
    rc = _fastread.lib.mxo_parse(r._r, _fastread.ffi.from_buffer(text), len(text))
    assert rc == 0 and r._r.n_runs >= 1  # a run (rows at most where the text has some)
    _write(tmp_path / "t.json", [GOOD[0], line, GOOD[1]])
    _same(tmp_path / "t.json")


def test_times_are_the_pure_paths_rounding(tmp_path):
    """Decimal times of up to 3 fraction digits below 10**12 us: exact ns, as
    the pure path's rounding gives (a sample across magnitudes and digits)."""
    rng = random.Random(7)
    lines = []
    for i in range(3000):
        whole = rng.choice(
            [0, 1, 9, 338, 10**6, 2**31, 2**40 - 1, 10**12 - 1, rng.randrange(10**12)]
        )
        digits = rng.randrange(4)
        frac = "" if digits == 0 else "." + str(rng.randrange(10**digits)).zfill(digits)
        sign = "-" if rng.random() < 0.2 else ""
        dur = f"{rng.randrange(10 ** rng.randrange(1, 12))}.{rng.randrange(1000):03d}"
        lines.append(
            f'{{"name":"t{i % 7}","cat":"c","ph":"X","ts":{sign}{whole}{frac},'
            f'"dur":{dur},"pid":1,"tid":{i % 3}}}'
        )
    _write(tmp_path / "t.json", lines)
    got = _same(tmp_path / "t.json")
    threads = got["read_events"][0][0]
    assert sum(len(t[2]) for t in threads) == 3000


@pytest.mark.parametrize("seed", range(12))
def test_mixed_lines_in_small_blocks(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    pool = GOOD * 3 + HOSTILE + (DAMAGE if seed % 4 == 3 else [])
    lines = [rng.choice(pool) for _ in range(rng.randrange(20, 200))]
    # Out of order: a parent after its children, and long moves back.
    lines += [
        f'{{"name":"o","cat":"c","ph":"X","ts":{rng.randrange(500)},"dur":{rng.randrange(50)},'
        f'"pid":1,"tid":{rng.randrange(3)}}}'
        for _ in range(rng.randrange(50))
    ]
    rng.shuffle(lines)
    sep = rng.choice([",\n", ",\n\n", " ,\n", ",\r\n", ",  \n"])
    tail = rng.choice(["\n]}", '\n],"otherData":{}}', ","])  # "," : a cut file
    _write(tmp_path / "t.json", lines, sep, tail)
    monkeypatch.setattr(_scan, "BLOCK", rng.choice([64, 300, 4096, 1 << 20]))
    _same(tmp_path / "t.json")


def test_long_moves_back_sort_the_thread(tmp_path, takes):
    """A thread whose events come far out of order (past the 4096 events a
    move may cross): placed as Thread.put places them, then sorted whole."""
    lines = [
        f'{{"name":"e","cat":"c","ph":"X","ts":{t},"dur":{t % 5},"pid":1,"tid":1}}'
        for t in list(range(5000, 10000)) + list(range(5000)) + [7000] * 3
    ]
    _write(tmp_path / "t.json", lines)
    got = _same(tmp_path / "t.json")
    ts = got["read_events"][0][0][0][2]
    assert ts == sorted(ts) and len(ts) == 10003 and all(takes)


def test_without_the_module_the_pure_path_runs(tmp_path):
    """mxprof.trace._fastjson missing (no compiler at install): the reader
    runs the pure path and gives the same; MXPROF_PURE_READER=1 likewise."""
    path = tmp_path / "core.json"
    _record(path, 30)
    code = (
        "import sys, json; sys.modules['mxprof.trace._fastjson'] = None\n"
        "import mxprof\nfrom mxprof.trace import _fastread\n"
        "t = mxprof.load(sys.argv[1])\n"
        "print(json.dumps([_fastread.lib is None, _fastread.reader(None) is None,\n"
        "    [repr(r) for r in t.key_averages()], [repr(e) for e in t.events]]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MXPROF_PURE_READER", None)
    run = subprocess.run(
        [sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    missing, no_reader, rows, events = json.loads(run.stdout)
    assert missing and no_reader
    t = mxprof.load(path)
    assert rows == [repr(r) for r in t.key_averages()]
    assert events == [repr(e) for e in t.events]


def test_the_switch(monkeypatch):
    monkeypatch.setenv("MXPROF_PURE_READER", "1")
    assert _fastread.reader(_fastread.Converter()) is None
    monkeypatch.setenv("MXPROF_PURE_READER", "0")
    assert isinstance(_fastread.reader(_fastread.Converter()), _fastread.Reader)


def test_order_matches_thread_put():
    """mxo_order: the same order as Thread.put's insertion (ts, longer first,
    ties as added), for short and long moves."""
    from array import array

    from mxprof.trace._columns import NO_DUR, Keys, Thread

    rng = random.Random(3)
    for n, spread in ((50, 10), (3000, 100), (9000, 9000)):
        events = [
            (rng.randrange(spread), rng.choice([NO_DUR, 0, rng.randrange(20)])) for _ in range(n)
        ]
        one, batch = Thread(1, 1, Keys()), Thread(1, 1, Keys())
        for i, (ts, d) in enumerate(events):
            one.put(ts, None if d == NO_DUR else d, f"k{i % 5}", "c", "X", _fastread.NO_ARGS)
        half = n // 2
        for lo, hi in ((0, half), (half, n)):
            part = events[lo:hi]
            kinds = [batch.keys.of(f"k{i % 5}", "c", "X") for i in range(lo, hi)]
            batch.extend(
                array("q", [t for t, _ in part]).tobytes(),
                array("q", [d for _, d in part]).tobytes(),
                array("i", kinds).tobytes(),
                _fastread.order,
            )
        one.finish()
        batch.finish()
        assert (list(one.ts), list(one.dur), list(one.kind)) == (
            list(batch.ts),
            list(batch.dur),
            list(batch.kind),
        )


def test_a_block_left_to_the_pure_path_then_rows_of_its_keys(tmp_path, monkeypatch, takes):
    """A block the compiled way declines (a line like a row inside an event of
    many lines) whose rows made keys, then blocks taken that use those keys
    and new ones: every key keeps its index."""
    nested = HOSTILE[-1]
    assert "inner3" in nested
    lines = [GOOD[0], GOOD[1], nested] + [GOOD[2], GOOD[1], GOOD[0], GOOD[7]] * 30
    _write(tmp_path / "t.json", lines)
    # Blocks of about 50 lines: the event of many lines whole in the first.
    monkeypatch.setattr(_scan, "BLOCK", 4096)
    got = _same(tmp_path / "t.json")
    assert takes[0] is False and takes.count(True) >= 2
    names = got["read_events"][0][1][0]
    assert names.index("a") < names.index("b") < names.index("outer2") < names.index("p")
