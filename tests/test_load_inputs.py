"""mxprof.load on every file mxprof writes (Perfetto protobuf too) and on paths it cannot read."""

import errno
import os
import threading

import pytest

import mxprof
from mxprof.errors import TraceFormatError, TraceReadError
from mxprof.trace import load, read_raw
from mxprof.trace.perfetto import packets

PERFETTO = ("t.pftrace", "t.perfetto-trace")


def scenario(clock):
    """Nested tasks on two threads, frames, an event, counters, markers of every scope,
    a range stopped on another thread (async) and memory events."""
    from mxprof import memory

    d = mxprof.Domain("dom")
    outer, inner = d.new_task("outer"), d.new_task("inner")
    step, ev = d.new_frame("step"), mxprof.Event("ev")
    ctr, mk = d.new_counter("ctr"), d.new_marker("mk")
    hop = d.new_task("hop")

    def worker():
        with outer:
            clock(250)
            with inner:
                clock(1_500)
            mk.mark("thread")
        hop.stop()

    with outer:
        clock(1_000)
        with inner:
            clock(2_000)
            ctr.set_value(5)
        for _ in range(2):
            with step:
                clock(700)
        ev.start()
        clock(300)
        ev.stop()
        for scope in ("global", "process", "thread", "task", "marker"):
            mk.mark(scope)
            clock(10)
        ctr.increment(-9)
        hop.start()
        t = threading.Thread(target=worker, name="worker")
        t.start()
        t.join()
        clock(100)
    with mxprof.scope("enc"):
        h = memory.record_alloc(4096, "gpu:0", tag="w")
        clock(10)
    memory.record_free(h)


def record(path, clock):
    mxprof.set_config(filename=os.fspath(path), profile_api=False, memory_events=True)
    mxprof.set_state("run")
    scenario(clock)
    mxprof.set_state("stop")
    mxprof.dump()


def comparable(trace):
    """What both formats carry alike: per-thread events by thread name, and the rest.

    Perfetto puts counters, global and process instants and async ranges on
    tracks of no thread (tid 0 here) and counter tracks carry no category.
    """
    names = trace.thread_names
    out = []
    for e in trace:
        thread = names.get((e.pid, e.tid))
        if e.ph == "C" or (e.ph == "i" and e.args.get("scope") in ("global", "process")):
            thread = None
        if e.ph == "X" and e.name == "hop":
            thread = None
        category = "" if e.ph == "C" else e.category
        out.append((thread, e.name, category, e.ph, e.ts, e.dur, sorted(e.args.items())))
    return sorted(out, key=repr)


@pytest.mark.parametrize("name", PERFETTO)
def test_a_perfetto_trace_loads_as_its_json_twin(tmp_path, clock, name):
    record(tmp_path / "t.json", clock)
    record(tmp_path / name, clock)
    js, pf = load(tmp_path / "t.json"), load(tmp_path / name)
    assert comparable(pf) == comparable(js)
    assert len(pf) == len(js) == 22
    assert sorted(pf.thread_names.values()) == ["MainThread", "worker"]
    assert pf.process_names == {os.getpid(): js.process_names[os.getpid()]}
    assert pf.base_time_ns is not None and not pf.truncated and pf.unmatched == 0
    # Self times differ only where the async range sits: JSON puts it on a
    # thread (inside its ranges), Perfetto on a track of its own.
    assert [(r.name, r.count, r.total, r.min, r.max, r.p50) for r in pf.key_averages()] == [
        (r.name, r.count, r.total, r.min, r.max, r.p50) for r in js.key_averages()
    ]
    assert {r.name: r.self for r in pf.key_averages()}["inner"] == 3_500
    (hop,) = [e for e in pf if e.name == "hop"]
    assert (hop.ts, hop.dur) == (4_750, 1_750)
    assert [e.args["ctr"] for e in pf if e.name == "ctr"] == [5, -4]


def test_a_perfetto_trace_cut_after_any_packet_loads_what_came_before(tmp_path, clock):
    record(tmp_path / "t.pftrace", clock)
    data = (tmp_path / "t.pftrace").read_bytes()
    blocks, cut = packets(data)
    assert not cut and len(blocks) > 20
    whole = load(tmp_path / "t.pftrace")
    ends, pos = [], 0
    for block in blocks:
        pos += 1 + _varint_len(len(block)) + len(block)
        ends.append(pos)
    assert ends[-1] == len(data)
    counts = []
    for k, end in enumerate(ends):
        for extra in (0, 1, 2):  # at the packet's end, and cut inside the next one
            part = tmp_path / f"cut{k}_{extra}.pftrace"
            part.write_bytes(data[: min(end + extra, len(data))])
            trace = load(part)
            assert trace.truncated == (extra > 0 and end < len(data))
            counts.append(len(trace))
    assert counts == sorted(counts) and counts[-1] == len(whole)


def _varint_len(n):
    length = 1
    while n >= 0x80:
        n >>= 7
        length += 1
    return length


def test_a_damaged_perfetto_trace_is_a_format_error_naming_the_file(tmp_path, clock):
    record(tmp_path / "t.pftrace", clock)
    data = (tmp_path / "t.pftrace").read_bytes()
    bad = tmp_path / "bad.pftrace"
    bad.write_bytes(data[:200] + b"\xff" * 8 + data[200:])
    with pytest.raises(TraceFormatError, match="bad.pftrace: not a Perfetto trace"):
        load(bad)


def test_merge_reads_perfetto_inputs(tmp_path, clock):
    from mxprof.trace.merge import merge

    record(tmp_path / "a.pftrace", clock)
    summary = merge([tmp_path / "a.pftrace"], tmp_path / "m.json")
    merged = load(tmp_path / "m.json")
    assert summary["events"] > 0
    assert sorted((e.name, e.ts, e.dur) for e in merged if e.dur is not None) == sorted(
        (e.name, e.ts, e.dur) for e in load(tmp_path / "a.pftrace") if e.dur is not None
    )


def bad_paths(tmp_path):
    (tmp_path / "dir").mkdir()
    return {
        "missing": (tmp_path / "nope.json", errno.ENOENT),
        "directory": (tmp_path / "dir", errno.EISDIR),
        "NUL byte": (f"{tmp_path}/a\0b.json", errno.EINVAL),
        "lone surrogate": (f"{tmp_path}/a\ud800b.json", errno.EINVAL),
        "too long": (f"{tmp_path}/{'x' * 300}.json", errno.ENAMETOOLONG),
    }


def test_every_unreadable_path_is_one_documented_error_naming_it(tmp_path):
    for what, (path, code) in bad_paths(tmp_path).items():
        with pytest.raises(TraceReadError) as info:
            load(path)
        err = info.value
        assert isinstance(err, TraceFormatError) and isinstance(err, OSError), what
        assert err.errno == code and err.filename == os.fspath(path), what
        message = str(err)
        message.encode("utf-8")  # printable as it is
        assert "cannot read" in message, what
        assert (
            os.path.basename(os.fspath(path)).encode("unicode_escape").decode()[:20]
            in (message.encode("utf-8").decode("unicode_escape") if "\\" in message else message)
            or repr(os.fspath(path)) in message
        ), what


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root reads files whatever their permissions, so no file is unreadable",
)
def test_an_unreadable_file_is_a_read_error(tmp_path):
    path = tmp_path / "secret.json"
    path.write_text('{"traceEvents": []}')
    path.chmod(0)
    with pytest.raises(TraceReadError, match="secret.json: cannot read") as info:
        load(path)
    assert info.value.errno == errno.EACCES


def test_empty_and_garbage_files_are_format_errors_naming_them(tmp_path):
    for name, content, problem in [
        ("empty.json", b"", "empty"),
        ("garbage.json", b"\x00\x01garbage", "not JSON"),
        ("empty.pftrace", b"", "empty"),
        ("garbage.pftrace", b"\n\x05garbage", "not a Perfetto trace"),
    ]:
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(TraceFormatError) as info:
            load(path)
        assert not isinstance(info.value, TraceReadError)
        assert str(path) in str(info.value) and problem in str(info.value), name


def test_read_raw_gives_perfetto_events_as_chrome_dicts(tmp_path, clock):
    record(tmp_path / "t.pftrace", clock)
    events, metadata, truncated = read_raw(tmp_path / "t.pftrace")
    assert not truncated and isinstance(metadata["baseTimeNanoseconds"], int)
    phases = {e["ph"] for e in events}
    assert phases == {"M", "B", "E", "b", "e", "i", "C"}


@pytest.mark.parametrize("suffix", ["json.gz", "pftrace", "perfetto-trace"])
def test_merge_writes_the_format_its_output_suffix_names(tmp_path, clock, suffix):
    from mxprof.trace.merge import merge

    record(tmp_path / "a.json", clock)
    record(tmp_path / "b.pftrace", clock)
    inputs = [tmp_path / "a.json", tmp_path / "b.pftrace"]
    merge(inputs, tmp_path / "m.json")
    merge(inputs, tmp_path / f"m.{suffix}")
    magic = b"\x1f\x8b" if suffix == "json.gz" else b"\n"  # gzip; a packet's tag
    assert (tmp_path / f"m.{suffix}").read_bytes()[: len(magic)] == magic
    js, other = load(tmp_path / "m.json"), load(tmp_path / f"m.{suffix}")
    assert other.base_time_ns == js.base_time_ns and not other.truncated
    assert sorted(other.process_names.values()) == sorted(js.process_names.values())
    assert sorted(other.thread_names.values()) == sorted(js.thread_names.values())
    if suffix == "json.gz":
        assert list(other) == list(js) and other.metadata == js.metadata
        return
    # Perfetto has no track for a counter's category nor a thread for global,
    # process and async events: compare what it carries.
    assert comparable(other) == comparable(js)
    assert [(r.name, r.count, r.total, r.max) for r in other.key_averages()] == [
        (r.name, r.count, r.total, r.max) for r in js.key_averages()
    ]
