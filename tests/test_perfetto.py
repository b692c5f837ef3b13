"""The Perfetto protobuf trace (.perfetto-trace, .pftrace): what is recorded, decoded back."""

import os
import resource
import signal
import threading

import pytest

import mxprof
from mxprof import _testing

pytest.importorskip("google.protobuf", reason="decoding Perfetto traces needs protobuf")
pb2 = pytest.importorskip(
    "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
    reason="decoding Perfetto traces needs the perfetto package's trace protos",
)

BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4
MONOTONIC, REALTIME, BOOTTIME = 3, 1, 6
DELTA = 64  # the thread sequences' incremental clock
SCOPES = ("global", "process", "thread", "task", "marker")
GLOBAL_TRACK = 0  # the implicit trace-global track: needs no descriptor


def start(path):
    mxprof.set_config(filename=os.fspath(path), profile_api=False)
    mxprof.set_state("run")


def finish():
    mxprof.set_state("stop")
    mxprof.dump()


def parse(data):
    trace = pb2.Trace()
    trace.ParseFromString(data)
    return trace


def packet_ends(data):
    """Offsets just after each top-level packet (tag 0x0A, varint length, bytes)."""
    ends, pos = [], 0
    while pos < len(data):
        assert data[pos] == 0x0A
        pos += 1
        size = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        pos += size
        ends.append(pos)
    assert pos == len(data)
    return ends


class Decoded:
    """A trace read the way a consumer does, checking the rules on the way.

    The process's packets (its clock snapshot, its track, samples) are on one
    sequence with absolute MONOTONIC timestamps; each thread's events on a
    sequence of their own, each batch of them after a packet that clears the
    sequence's state and sets its defaults (the thread's track, the
    incremental clock CLOCK_DELTA) and a clock snapshot that starts that
    clock: events carry neither a track (unless another) nor a clock id.
    """

    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        self.trace = parse(self.data)
        self.names, self.cats = {}, {}  # iid -> text, over every sequence
        self.tracks = {}  # uuid -> every descriptor of it, in file order
        self.events = []
        self.base = None
        self.seqs = {}  # sequence id -> its state
        for p in self.trace.packet:
            seq = self.seqs.setdefault(
                p.trusted_packet_sequence_id,
                {"cleared": False, "names": {}, "cats": {}, "track": None, "clock": None},
            )
            if p.sequence_flags & 1:
                seq.update(cleared=True, names={}, cats={}, track=None, clock=None)
            if p.sequence_flags & 2:
                assert seq["cleared"], "a packet needs incremental state before it was cleared"
            if p.HasField("trace_packet_defaults"):
                assert p.sequence_flags & 1, "defaults come with a clear"
                d = p.trace_packet_defaults
                seq.update(clock=d.timestamp_clock_id, track=d.track_event_defaults.track_uuid)
            if p.HasField("clock_snapshot"):
                snap = p.clock_snapshot
                clocks = {c.clock_id: c.timestamp for c in snap.clocks}
                if snap.HasField("primary_trace_clock"):
                    assert self.base is None, "one trace clock snapshot per file"
                    assert snap.primary_trace_clock == MONOTONIC
                    assert set(clocks) == {MONOTONIC, REALTIME, BOOTTIME}
                    self.base = clocks[MONOTONIC]
                else:  # a thread sequence's incremental clock, from the base
                    assert set(clocks) == {DELTA, MONOTONIC}
                    assert [c.is_incremental for c in snap.clocks] == [True, False]
                    assert clocks[DELTA] == clocks[MONOTONIC] == self.base
                    seq["now"] = clocks[DELTA]
            if p.HasField("interned_data"):
                assert p.sequence_flags == 2
                for table, key, entries in (
                    (self.names, "names", p.interned_data.event_names),
                    (self.cats, "cats", p.interned_data.event_categories),
                ):
                    for e in entries:
                        assert e.iid and e.iid not in seq[key], "interned once per clear"
                        seq[key][e.iid] = table[e.iid] = e.name
            if p.HasField("track_descriptor"):
                self.tracks.setdefault(p.track_descriptor.uuid, []).append(p.track_descriptor)
            if p.HasField("track_event"):
                self.event(p, seq)
        assert 0 not in self.seqs
        self.process = [u for u, ds in self.tracks.items() if ds[0].HasField("process")]
        assert len(self.process) == 1

    def event(self, p, seq):
        te = p.track_event
        assert not p.HasField("timestamp_clock_id"), "the sequence's default clock"
        assert seq["clock"] == DELTA and "now" in seq
        seq["now"] += p.timestamp
        track = te.track_uuid if te.HasField("track_uuid") else seq["track"]
        if te.HasField("track_uuid"):
            assert te.track_uuid != seq["track"], "the default track is not named"
        described = track == GLOBAL_TRACK or track in self.tracks
        assert described, "a track is described before its events"
        named = te.type in (BEGIN, INSTANT)
        assert named == bool(te.name_iid) == (p.sequence_flags == 2)
        if named:
            assert te.name_iid in seq["names"] and list(te.category_iids) == [te.name_iid]
        args = {
            a.name: a.string_value
            if a.HasField("string_value")
            else a.int_value
            if a.HasField("int_value")
            else a.uint_value
            for a in te.debug_annotations
        }
        self.events.append(
            {
                "type": te.type,
                "ts": seq["now"] - self.base,
                "track": track,
                "name": seq["names"].get(te.name_iid),
                "cat": seq["cats"].get(te.name_iid),
                "args": args,
                "value": te.counter_value,
            }
        )

    def thread_name(self, uuid):
        return self.tracks[uuid][-1].thread.thread_name

    def slices(self, depth=False):
        """(thread, name, cat, ts, dur, args[, depth]): a stack per track pairs begins and ends."""
        stacks, last, out = {}, {}, []
        for e in self.events:
            if e["type"] not in (BEGIN, END):
                continue
            assert e["ts"] >= last.get(e["track"], 0), "file order is time order per thread"
            last[e["track"]] = e["ts"]
            stack = stacks.setdefault(e["track"], [])
            if e["type"] == BEGIN:
                stack.append(e)
                continue
            b = stack.pop()
            thread = self.thread_name(e["track"])
            s = (thread, b["name"], b["cat"], b["ts"], e["ts"] - b["ts"], b["args"])
            out.append((*s, len(stack)) if depth else s)
        assert all(not s for s in stacks.values()), "every begin has its end"
        return sorted(out, key=repr)

    def counters(self):
        return [
            (self.tracks[e["track"]][-1].name, e["ts"], e["value"])
            for e in self.events
            if e["type"] == COUNTER
        ]

    def instants(self):
        out = []
        for e in self.events:
            if e["type"] == INSTANT:
                if e["track"] == GLOBAL_TRACK:
                    where = "global"
                elif e["track"] in self.process:
                    where = "process"
                else:
                    where = self.thread_name(e["track"])
                out.append((where, e["name"], e["cat"], e["ts"], e["args"]["scope"]))
        return sorted(out, key=repr)


def chrome(path):
    """The same shapes, from a Chrome JSON trace of the same scenario."""
    trace = _testing.load_trace(path)
    threads = {e["tid"]: e["args"]["name"] for e in _testing.events(trace, "M", "thread_name")}

    def ns(us):
        return round(us * 1000)

    slices = sorted(
        (
            (threads[e["tid"]], e["name"], e["cat"], ns(e["ts"]), ns(e["dur"]), e.get("args", {}))
            for e in _testing.events(trace, "X")
        ),
        key=repr,
    )
    counters = [(e["name"], ns(e["ts"]), e["args"][e["name"]]) for e in _testing.events(trace, "C")]
    instants = sorted(
        (
            (
                {"g": "global", "p": "process"}.get(e["s"]) or threads[e["tid"]],
                e["name"],
                e["cat"],
                ns(e["ts"]),
                e["args"]["scope"],
            )
            for e in _testing.events(trace, "i")
        ),
        key=repr,
    )
    return slices, counters, instants


def scenario(clock):
    """Tasks nested on two threads, frames, an event, counters, markers of every scope."""
    d = mxprof.Domain("dom")
    outer, inner = d.new_task("outer"), d.new_task("inner")
    step = d.new_frame("step")
    ev = mxprof.Event("ev")
    ctr = d.new_counter("ctr")
    mk = d.new_marker("mk")

    def worker():
        with outer:
            clock(250)
            with inner:
                clock(1_500)
            mk.mark("thread")

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
        for scope in SCOPES:
            mk.mark(scope)
            clock(10)
        ctr.increment(3)
        t = threading.Thread(target=worker, name="worker")
        t.start()
        t.join()
        clock(100)


def test_every_event_round_trips_like_chrome_json(tmp_path, clock):
    start(tmp_path / "t.json")
    scenario(clock)
    finish()
    expected = chrome(tmp_path / "t.json")
    start(tmp_path / "t.perfetto-trace")
    scenario(clock)
    finish()
    got = Decoded(tmp_path / "t.perfetto-trace")
    assert (got.slices(), got.counters(), got.instants()) == expected
    main = threading.current_thread().name
    assert got.slices() == sorted(
        [
            (main, "outer", "dom", 0, 6_600, {}),
            (main, "inner", "dom", 1_000, 2_000, {}),
            (main, "step", "dom,frame", 3_000, 700, {"frame": 0}),
            (main, "step", "dom,frame", 3_700, 700, {"frame": 1}),
            (main, "ev", "event", 4_400, 300, {}),
            ("worker", "outer", "dom", 4_750, 1_750, {}),
            ("worker", "inner", "dom", 5_000, 1_500, {}),
        ],
        key=repr,
    )
    assert got.counters() == [("ctr", 3_000, 5), ("ctr", 4_750, 8)]
    assert [i[0] for i in sorted(got.instants(), key=lambda i: i[3])] == [
        "global",
        "process",
        main,
        main,
        main,
        "worker",
    ]


def test_counter_and_marker_tracks(tmp_path, clock):
    d = mxprof.Domain("mem")
    a, b = d.new_counter("a"), d.new_counter("b")
    mk = d.new_marker("m")
    start(tmp_path / "t.perfetto-trace")
    for v in (1, -2, 2**62):
        a.set_value(v)
        clock(10)
    b.set_value(7)
    for scope in SCOPES:
        mk.mark(scope)
    finish()
    got = Decoded(tmp_path / "t.perfetto-trace")
    (proc,) = got.process
    counter_tracks = {u: ds for u, ds in got.tracks.items() if ds[0].HasField("counter")}
    assert sorted(ds[0].name for ds in counter_tracks.values()) == ["a", "b"]
    assert all(len(ds) == 1 and ds[0].parent_uuid == proc for ds in counter_tracks.values())
    assert got.counters() == [("a", 0, 1), ("a", 10, -2), ("a", 20, 2**62), ("b", 30, 7)]
    thread_tracks = [u for u, ds in got.tracks.items() if ds[0].HasField("thread")]
    (thread,) = thread_tracks
    desc = got.tracks[thread][0]
    assert desc.parent_uuid == proc and desc.thread.pid == os.getpid() and desc.thread.tid > 0
    assert got.tracks[proc][0].process.pid == os.getpid()
    marks = [e for e in got.events if e["type"] == INSTANT]
    assert [(e["args"]["scope"], e["track"]) for e in marks] == [
        ("global", GLOBAL_TRACK),
        ("process", proc),
        ("thread", thread),
        ("task", thread),
        ("marker", thread),
    ]
    assert {(e["name"], e["cat"], e["ts"]) for e in marks} == {("m", "mem", 30)}
    assert GLOBAL_TRACK not in got.tracks  # nothing describes the implicit global track


def test_odd_and_long_names_round_trip(tmp_path, clock):
    names = ['say "hi"\\', "two\nlines\t", "emoji 🚀🧪", "x" * 10_000, "🦀" * 10_000]
    domain = mxprof.Domain('dom "ain"\n' + "é" * 5_000)
    tasks = [domain.new_task(n) for n in names]
    mk = domain.new_marker("ß\u2028")
    start(tmp_path / "t.perfetto-trace")
    for t in tasks:
        with t:
            clock(5)
    mk.mark("thread")
    finish()
    got = Decoded(tmp_path / "t.perfetto-trace")
    assert [s[1:5] for s in sorted(got.slices(), key=lambda s: s[3])] == [
        (n, domain.name, 5 * i, 5) for i, n in enumerate(names)
    ]
    assert [(i[1], i[2]) for i in got.instants()] == [("ß\u2028", domain.name)]


def test_thread_names_and_a_rename_before_a_later_flush(tmp_path, clock):
    task = mxprof.Domain("d").new_task("t")
    me = threading.current_thread()
    old = me.name
    try:
        me.name = "first"
        start(tmp_path / "t.perfetto-trace")
        with task:
            clock(1)
        mxprof.dump(finished=False)
        me.name = "second"
        with task:
            clock(1)
        mxprof.dump(finished=False)
        with task:  # same name: no new descriptor
            clock(1)
        finish()
    finally:
        me.name = old
    got = Decoded(tmp_path / "t.perfetto-trace")
    (thread,) = [u for u, ds in got.tracks.items() if ds[0].HasField("thread")]
    assert [d.thread.thread_name for d in got.tracks[thread]] == ["first", "second"]
    assert [s[0] for s in got.slices()] == ["second"] * 3


def test_flushes_append_and_each_leaves_a_valid_file(tmp_path, clock):
    d = mxprof.Domain("d")
    tasks = [d.new_task(f"t{i}") for i in range(3)]
    ctr = d.new_counter("c")
    path = tmp_path / "t.pftrace"
    start(path)
    files = []
    for batch in range(3):
        for t in tasks[: batch + 1]:
            with t:
                clock(10)
                ctr.increment()
        mxprof.dump(finished=False)
        got = Decoded(path)
        assert len(got.slices()) == sum(range(1, batch + 2))
        assert [c[2] for c in got.counters()] == list(range(1, len(got.slices()) + 1))
        files.append(got.data)
    finish()
    got = Decoded(path)
    files.append(got.data)
    assert all(b.startswith(a) and len(a) < len(b) for a, b in zip(files, files[1:-1]))
    assert files[-1] == files[-2]  # nothing new to write
    # Interned again by each flush's batch of the thread (its sequence starts afresh).
    assert sorted(got.names.values()) == ["t0", "t1", "t2"]
    assert [len(ds) for ds in got.tracks.values()] == [1, 1, 1]  # process, thread, counter


def test_a_cut_after_any_packet_holds_exactly_the_packets_before_it(tmp_path, clock):
    start(tmp_path / "t.perfetto-trace")
    scenario(clock)
    finish()
    with open(tmp_path / "t.perfetto-trace", "rb") as f:
        data = f.read()
    full = list(parse(data).packet)
    ends = packet_ends(data)
    assert len(ends) == len(full) > 20
    for k, end in enumerate(ends, 1):
        assert list(parse(data[:end]).packet) == full[:k]


def test_a_failed_flush_then_a_good_path_writes_everything_once(tmp_path, clock):
    task = mxprof.Domain("d").new_task("t")
    bad = tmp_path / "missing" / "t.perfetto-trace"
    good = tmp_path / "good.perfetto-trace"
    start(bad)
    for _ in range(3):
        with task:
            clock(10)
    with pytest.raises(mxprof.OutputError):
        mxprof.dump(finished=False)
    with task:
        clock(10)
    with pytest.warns(RuntimeWarning, match="could not write"):
        mxprof.set_config(filename=os.fspath(good))
    finish()
    got = Decoded(good)
    assert [s[3:5] for s in got.slices()] == [(0, 10), (10, 10), (20, 10), (30, 10)]
    assert not bad.exists()


def test_a_flush_cut_short_is_undone_and_its_names_interned_again(tmp_path, clock):
    d = mxprof.Domain("d")
    # A first flush large enough that the output pytest captures meanwhile stays below the limit.
    first, later = d.new_task("first" + "x" * 100_000), d.new_task("later" + "x" * 4_000)
    path = tmp_path / "t.perfetto-trace"
    start(path)
    with first:
        clock(10)
    mxprof.dump(finished=False)
    size = os.path.getsize(path)
    for _ in range(100):
        with later:
            clock(10)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 1_000, limits[1]))
        with pytest.raises(mxprof.OutputError):
            mxprof.dump(finished=False)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert os.path.getsize(path) == size  # cut back to the last complete flush
    assert [s[1] for s in Decoded(path).slices()] == [first.name]
    finish()
    got = Decoded(path)
    assert sorted(got.names.values()) == [first.name, later.name]
    assert [s[1] for s in sorted(got.slices(), key=lambda s: s[3])] == [first.name] + [
        later.name
    ] * 100


def test_begins_and_ends_nest_in_file_order(tmp_path, clock):
    d = mxprof.Domain("d")
    a, b, c, z = (d.new_task(n) for n in "abcz")

    def body():
        with a:  # children at its very start and end, zero-length ranges everywhere
            with b:
                with z:
                    pass
                with c:
                    clock(5)
            with z:
                pass
            with b:
                clock(5)
                with c:
                    pass
                with z, z:
                    pass
        with z:
            pass
        with a, b, c:
            clock(3)
        with a:
            pass

    def run(path):
        start(path)
        body()
        t = threading.Thread(target=body, name="other")
        t.start()
        t.join()
        finish()

    run(tmp_path / "t.json")
    run(tmp_path / "t.perfetto-trace")
    expected = chrome(tmp_path / "t.json")[0]
    assert len(expected) == 2 * 14
    # Decoded.slices pairs begins and ends with a stack per track in file order.
    got = Decoded(tmp_path / "t.perfetto-trace")
    assert got.slices() == expected
    # Equal ranges nest as they were opened: the outer one begins first.
    same = [(s[1], s[6]) for s in got.slices(depth=True) if s[0] == "other" and s[4] == 3]
    assert sorted(same) == [("a", 0), ("b", 1), ("c", 2)]


def test_memory_counters_and_instants(tmp_path, clock):
    from mxprof import memory

    mxprof.set_config(memory_events=True)
    start(tmp_path / "m.perfetto-trace")
    with mxprof.scope("enc"):
        h = memory.record_alloc(4096, "gpu:0", tag="w")
        clock(10)
    memory.record_free(h)
    finish()
    got = Decoded(tmp_path / "m.perfetto-trace")
    assert got.counters() == [
        ("Memory: gpu/0", 0, 4096),
        ("enc:", 0, 4096),
        ("Memory: gpu/0", 10, 0),
        ("enc:", 10, 0),
    ]
    instants = [
        (e["name"], e["cat"], e["ts"], e["args"]) for e in got.events if e["type"] == INSTANT
    ]
    args = {"device": "gpu/0", "attribute": "enc:w", "bytes": 4096}
    assert instants == [
        ("alloc", "Device Storage", 0, args),
        ("free", "Device Storage", 10, args),
    ]
