"""Hostile input to the offline tools (issue 27, findings 2, 4 and 6).

Every offline command, given any file, ends with status 0 or 2, never a
traceback: bad input is one TraceFormatError naming the file. Gzip is read
as a stream with bounded lines, so a small file that decompresses to
gigabytes is refused early, and a real trace's gzip members are each read
once. ``repair`` refuses what is not a trace and leaves it as it was.
"""

import contextlib
import gzip
import io
import json
import os
import random
import re
import subprocess
import sys

import pytest

import mxprof
from mxprof import cli
from mxprof.errors import TraceFormatError
from mxprof.trace import _scan, model, read_raw
from mxprof.trace.perfetto import read_perfetto

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*argv):
    """mxprof's entry point in this process: (status, stderr). An exception
    escaping main (a traceback for the user) fails the test there."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = cli.main([os.fspath(a) for a in argv])
    return status, err.getvalue()


def commands(path, out, report=True):
    """Each offline command's arguments on one input file."""
    found = {
        "stats": ["stats", path],
        "merge": ["merge", path, path, "-o", f"{out}.merged.json"],
        "repair": ["repair", path, "-o", f"{out}.repaired.json"],
        "diff": ["diff", path, path],
        "ranks": ["ranks", path],
        "export": ["export", path, "--format", "collapsed", "-o", f"{out}.collapsed"],
        "hints": ["hints", path],
    }
    if report:
        found["report"] = ["report", path, "-o", f"{out}.html"]
    return found


def event_lines(events):
    """A trace in mxprof's one-event-per-line shape."""
    body = ",\n".join(json.dumps(e) for e in events)
    return ('{"displayTimeUnit":"ms","traceEvents":[\n' + body + "\n]}\n").encode()


EVENT = {"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}
NESTED = b'{"ph":"X","name":"a","ts":1,"dur":1,"pid":1,"tid":1,"args":' + b'{"a":' * 100_000
NESTED += b"1" + b"}" * 100_000 + b"}"
BIG_INT = b'{"ph":"X","name":"a","ts":' + b"9" * 5000 + b',"dur":1,"pid":1,"tid":1}'
HOSTILE = {
    "nested.json": b'{"traceEvents":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
    "nested_lines.json": b'{"traceEvents":[\n' + NESTED + b"\n]}\n",
    "big_int.json": b"[" + BIG_INT + b"]",
    "big_int_lines.json": b'{"traceEvents":[\n' + BIG_INT + b"\n]}\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_nesting_and_huge_integers_are_format_errors_from_every_command(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(HOSTILE[name])
    # (Within the recursion limit, which another test may have raised, the
    # nested arrays are events that are not objects: a TraceFormatError too.)
    with pytest.raises(TraceFormatError, match=re.escape(f"{path}: ")):
        mxprof.load(path).key_averages()
    for command, argv in commands(path, tmp_path / "out").items():
        status, err = run(*argv)
        assert status == 2 and str(path) in err, (command, err)


def test_short_malformed_perfetto_files_are_format_errors(tmp_path):
    whole = tmp_path / "whole.pftrace"
    mxprof.set_config(filename=os.fspath(whole), profile_api=False)
    mxprof.set_state("run")
    with mxprof.record_function("step"):
        pass
    mxprof.set_state("stop")
    mxprof.dump()
    data = whole.read_bytes()
    hostile = [
        b"\n\x02\x58\x01",  # a track event (field 11) written as a number
        b"\n\x03\xe0\x03\x01",  # a track descriptor (field 60) written as a number
        b"\n\x04\x32\x02\x08\x01",  # a clock snapshot whose clock is a number
        # an instant whose annotation's double (field 5) is bytes
        b"\n\x0e\x40\x05\x5a\x0a\x22\x06\x52\x01\x61\x2a\x01\x00\x48\x03",
    ]
    for i, body in enumerate(hostile):
        path = tmp_path / f"bad{i}.pftrace"
        path.write_bytes(body)
        for command, argv in commands(path, tmp_path / "out", report=False).items():
            status, err = run(*argv)
            assert status == 2 and str(path) in err, (command, body, err)
    for n in range(4, 12):  # the start of a real trace, then junk
        path = tmp_path / f"cut{n}.pftrace"
        path.write_bytes(data[:n] + b"\x0a\x03\x5a\x01\x07")
        status, err = run("stats", path)
        assert status in (0, 2), err
        assert status == 0 or str(path) in err


def random_message(rng, depth=0):
    """Protobuf fields of any number and wire type, messages nested in them."""
    out = bytearray()
    for _ in range(rng.randrange(1, 6)):
        field = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 22, 23, 30, 60, 66])
        wire = rng.choice([0, 1, 2, 5])
        key = field << 3 | wire
        while key >= 0x80:
            out.append(key & 0x7F | 0x80)
            key >>= 7
        out.append(key)
        if wire == 0:
            out += bytes([rng.randrange(0x80, 0x100) for _ in range(rng.randrange(3))])
            out.append(rng.randrange(0x80))
        elif wire == 1:
            out += rng.randbytes(8)
        elif wire == 5:
            out += rng.randbytes(4)
        else:
            inner = random_message(rng, depth + 1) if depth < 3 else rng.randbytes(3)
            inner = inner[:127]
            out += bytes([len(inner)]) + inner
    return bytes(out)


def test_well_framed_random_perfetto_packets_are_read_or_format_errors():
    """Finding 4: 57 % of such packets raised TypeError."""
    rng = random.Random(27)
    refused = 0
    for _ in range(3000):
        packets = b""
        for _ in range(rng.randrange(1, 4)):
            body = random_message(rng)[:127]
            packets += b"\x0a" + bytes([len(body)]) + body
        try:
            events, metadata, _ = read_perfetto(packets, "random.pftrace")
        except TraceFormatError as e:
            assert str(e).startswith("random.pftrace: not a Perfetto trace")
            refused += 1
            continue
        assert all(isinstance(e, dict) for e in events) and isinstance(metadata, dict)
        mxprof.trace.Trace.from_raw(events, metadata=metadata).key_averages()
    assert 0 < refused < 3000  # both ways were taken


@pytest.mark.parametrize("value", [1e308, -1e308, 10**30, "1e308"])
def test_times_out_of_range_are_no_time_in_every_command(tmp_path, value):
    """Finding 4: ts 1e308 raised OverflowError in merge, stats, diff, ranks, hints."""
    events = [
        {**EVENT, "name": "far", "ts": value},
        {**EVENT, "name": "long", "dur": value},
        {**EVENT, "name": "ok", "ts": 5},
    ]
    for path in (tmp_path / "lines.json", tmp_path / "one.json"):
        path.write_bytes(
            event_lines(events) if path.name == "lines.json" else json.dumps(events).encode()
        )
        rows = {r.name: r for r in mxprof.load(path).key_averages()}
        assert sorted(rows) == ["long", "ok"]  # 'far' has no time: not read
        assert rows["long"].max == 0 and rows["ok"].max == 1000
        for command, argv in commands(path, tmp_path / "out", report=False).items():
            status, err = run(*argv)
            assert status == (2 if command == "export" else 0), (command, err)
            assert command != "export" or "no stack samples" in err


def test_merge_takes_nan_infinity_and_object_pids(tmp_path):
    """Finding 4: merge raised TypeError on an object as pid (NaN, Infinity: distinct keys)."""
    text = b'[{"ph":"X","name":"a","ts":1,"dur":1,"pid":NaN,"tid":1},'
    text += b'{"ph":"X","name":"b","ts":2,"dur":1,"pid":Infinity,"tid":1},'
    text += b'{"ph":"X","name":"c","ts":3,"dur":1,"pid":{"x":1},"tid":1},'
    text += b'{"ph":"X","name":"d","ts":4,"dur":1,"pid":[1],"tid":1},'
    text += b'{"ph":"X","name":"e","ts":5,"dur":1,"pid":NaN,"tid":1}]'
    for name in ("one.json", "lines.json"):
        path = tmp_path / name
        if name == "lines.json":
            text = b'{"traceEvents":[\n' + text[1:-1].replace(b"},{", b"},\n{") + b"\n]}\n"
        path.write_bytes(text)
        out = tmp_path / f"merged-{name}"
        status, err = run("merge", path, path, "-o", out)
        assert status == 0, err
        events, _, _ = read_raw(out)
        ranges = [e for e in events if e.get("ph") == "X"]
        assert sorted(e["name"] for e in ranges) == sorted("abcdeabcde")
        pids = {e["name"]: e["pid"] for e in ranges[:5]}
        assert pids["a"] == pids["e"]  # NaN is one process, as the model reads it
        assert len({json.dumps(p) for p in pids.values()}) == 4


@pytest.mark.parametrize(
    "text",
    [
        b"\nhello world, some notes\nmore notes\n",
        b"\n" + b"notes about the weather today and other things to remember. " * 6 + b"\n",
        b"\n",
    ],
)
@pytest.mark.parametrize("name", ["notes.txt", "notes.pftrace", "notes.json"])
def test_repair_refuses_a_text_file_and_leaves_it(tmp_path, text, name):
    """Finding 6: a text starting with a newline was overwritten with an empty trace."""
    path = tmp_path / name
    path.write_bytes(text)
    os.chmod(path, 0o644)
    status, err = run("repair", path)
    assert status == 2 and str(path) in err, err
    assert path.read_bytes() == text and os.stat(path).st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == [name]  # no temporary file left either


def multi_member(text, cuts):
    """text gzip-compressed as one member per piece between the cuts, as the core flushes."""
    bounds = [0, *cuts, len(text)]
    return b"".join(gzip.compress(text[a:b], 1) for a, b in zip(bounds, bounds[1:]))


def test_each_gzip_member_is_read_once_and_a_big_gz_streams(tmp_path):
    """Finding 2: a member ending inside a long output left the last member
    read twice, so every big .json.gz fell back to reading the whole file."""
    events = [{**EVENT, "name": f"op{i % 7}", "ts": i} for i in range(120_000)]
    text = event_lines(events)
    assert len(text) > _scan.BLOCK  # the first member's output comes in several pieces
    path = tmp_path / "big.json.gz"
    path.write_bytes(multi_member(text, [len(text) - 300, len(text) - 100]))
    with open(path, "rb") as f:
        assert b"".join(_scan._text(f)) == text
    converted, metadata = model.read_lines(path, None)  # the line reader takes it
    assert metadata == {"displayTimeUnit": "ms"}
    assert sum(len(t) for t in converted.finish().values()) == 120_000
    assert sum(r.count for r in mxprof.load(path).key_averages()) == 120_000


BOMBS = """
import gzip, os, sys, tracemalloc, zlib
from mxprof.errors import TraceFormatError
from mxprof.trace import load, read_raw

def bomb(path, head, fill, size, tail):
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(c.compress(head))
        for _ in range(size >> 20):
            f.write(c.compress(fill * (1 << 20)))
        f.write(c.compress(tail) + c.flush())

folder = sys.argv[1]
cases = {
    "string": (b'{"traceEvents":[\\n{"ph":"X","name":"', b"a", b'","ts":1}\\n]}\\n'),
    "top": (b'{"x": "', b"a", b'"}'),
    "newlines": (b"", b"\\n", b""),
}
for name, (head, fill, tail) in cases.items():
    path = os.path.join(folder, name + ".json.gz")
    bomb(path, head, fill, 256 << 20, tail)
    for way, how in (("load", lambda p: load(p).key_averages()), ("read_raw", read_raw)):
        tracemalloc.start()
        try:
            how(path)
            outcome = "read"
        except TraceFormatError as e:
            outcome = str(e)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(name, way, os.path.getsize(path), peak, outcome, sep="\\t")
"""


def test_gzip_bombs_are_refused_within_a_memory_bound(tmp_path):
    """Finding 2: 1 MB that decompresses to 1 GiB took 4 GB. Now a line is at
    most MAX_LINE (64 MiB) and no reader holds a 256 MiB text whole."""
    proc = subprocess.run(
        [sys.executable, "-c", BOMBS, os.fspath(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [r[0] for r in rows] == ["string"] * 2 + ["top"] * 2 + ["newlines"] * 2
    for name, way, size, peak, outcome in rows:
        where = os.fspath(tmp_path / f"{name}.json.gz")
        assert int(size) < 2 << 20  # small files ...
        if (name, way) != ("newlines", "read_raw"):  # (the general reader holds a text whole)
            assert int(peak) < 200 << 20, (name, way, int(peak) >> 20)  # ... held far below
        if name == "newlines":
            assert outcome == f"{where}: the file is empty, not a trace"
        else:
            assert outcome.startswith(f"{where}: a line of more than 64 MiB at byte ")


def mutate(rng, data, other):
    """One seeded mutation of a trace's bytes."""
    how = rng.randrange(6)
    if how == 0 and data:  # bit flips
        out = bytearray(data)
        for _ in range(rng.randrange(1, 9)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out)
    if how == 1:  # truncation
        return data[: rng.randrange(len(data) + 1)]
    if how == 2 and data:  # a slice duplicated
        a = rng.randrange(len(data))
        b = rng.randrange(a, min(len(data), a + 200) + 1)
        return data[:b] + data[a:b] + data[b:]
    if how == 3:  # splicing two traces
        return data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]
    if how == 4:  # numeric extremes in place of a number
        extremes = [b"1e308", b"-1e308", b"NaN", b"Infinity", b"-0", b"1e-320", b"9" * 5000]
        digits = [i for i, c in enumerate(data) if 0x30 <= c <= 0x39]
        if digits:
            i = rng.choice(digits)
            return data[:i] + rng.choice(extremes) + data[i + 1 :]
    return data + rng.randbytes(rng.randrange(1, 16))  # junk after the end


def test_mutated_real_traces_end_in_status_0_or_2_from_every_command(tmp_path):
    """300 seeded mutations of traces mxprof recorded (JSON, .json.gz,
    .pftrace), each through one offline command by cli.main, in rotation."""
    originals = {}
    for suffix in (".json", ".json.gz", ".pftrace"):
        path = tmp_path / f"real{suffix}"
        mxprof.set_config(filename=os.fspath(path), profile_api=False)
        mxprof.set_state("run")
        for i in range(3):
            with mxprof.record_function(f"step {i}"), mxprof.record_function("inner"):
                pass
        mxprof.set_state("stop")
        mxprof.dump()
        originals[suffix] = path.read_bytes()
    text = gzip.decompress(originals[".json.gz"])
    rng = random.Random(2027)
    names = list(commands("x", "y", report=False))
    statuses = {0: 0, 2: 0}
    for case in range(300):
        suffix = rng.choice(list(originals))
        data = originals[suffix]
        if suffix == ".json.gz" and rng.random() < 0.5:  # mutate the text, then compress it
            data = gzip.compress(mutate(rng, text, originals[".json"]))
        else:
            data = mutate(rng, data, rng.choice(list(originals.values())))
        path = tmp_path / f"case{case}{suffix}"
        path.write_bytes(data)
        argv = commands(path, tmp_path / f"out{case}", report=False)[names[case % len(names)]]
        status, err = run(*argv)
        assert status in (0, 2), (case, argv, err)
        assert "Traceback" not in err
        statuses[status] += 1
        if status == 2:
            assert str(path) in err, (case, argv, err)
    assert statuses[0] > 30 and statuses[2] > 30  # both outcomes were exercised


def test_line_check_is_linear_and_names_the_offset():
    """The check looks at each byte once: pieces of newlines only, then a long line."""
    from mxprof.trace.reader import MAX_LINE, LineCheck

    check = LineCheck("x.json")
    for _ in range(64):
        check.add(b"\n" * (1 << 20))
    check.add(b"a" * (MAX_LINE // 2))
    with pytest.raises(TraceFormatError, match=rf"x.json: a line of more .* at byte {64 << 20}"):
        check.add(b"a" * (MAX_LINE // 2 + 1))


def test_bytes_that_are_not_utf8_in_a_line_trace_are_read_replaced(tmp_path):
    """Found by the mutation run: the line reader let msgspec's UnicodeDecodeError out."""
    path = tmp_path / "latin1.json"
    path.write_bytes(event_lines([EVENT, {**EVENT, "name": "b"}]).replace(b'"b"', b'"b\xdf"'))
    rows = {r.name: r.count for r in mxprof.load(path).key_averages()}
    assert rows == {"a": 1, "b\ufffd": 1}
    for command, argv in commands(path, tmp_path / "out", report=False).items():
        status, err = run(*argv)
        assert status == (2 if command == "export" else 0), (command, err)


@pytest.mark.parametrize("base", [b"1e308", b"Infinity", b"NaN", b"9" * 30])
def test_a_base_time_out_of_range_is_no_base_in_merge(tmp_path, base):
    """Found by the mutation run: merge raised OverflowError on baseTimeNanoseconds 1e308."""
    path = tmp_path / "base.json"
    path.write_bytes(
        b'{"baseTimeNanoseconds":'
        + base
        + b',"traceEvents":[\n'
        + json.dumps(EVENT).encode()
        + b"\n]}\n"
    )
    assert mxprof.load(path).base_time_ns is None
    status, err = run("merge", path, path, "-o", tmp_path / "merged.json")
    assert status == 0, err
    assert sum(e.get("ph") == "X" for e in read_raw(tmp_path / "merged.json")[0]) == 2


@pytest.mark.parametrize("args", [b'"python"', b"[1, 2]", b"7"])
def test_merge_takes_a_process_name_whose_args_are_not_an_object(tmp_path, args):
    """Found by the mutation run after the merge of main: dict('...') raised ValueError."""
    path = tmp_path / "names.json"
    meta = b'{"name":"process_name","ph":"M","pid":1,"tid":0,"args":' + args + b"}"
    path.write_bytes(b'{"traceEvents":[\n' + meta + b",\n" + json.dumps(EVENT).encode() + b"\n]}\n")
    status, err = run("merge", path, path, "-o", tmp_path / "merged.json")
    assert status == 0, err
    assert sum(e.get("ph") == "X" for e in read_raw(tmp_path / "merged.json")[0]) == 2
