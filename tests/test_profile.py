"""record_function, schedule and profile: torch.profiler's workflow on the core."""

import gzip
import json
import os

import pytest

import mxprof
from mxprof import ProfilerAction as A
from mxprof import _testing
from mxprof._session import SESSION

MS = 1_000_000


def names(path, ph="X"):
    return [e["name"] for e in _testing.events(_testing.load_trace(path), ph)]


def test_record_function_is_interned_and_works_every_way(trace_file, clock):
    rf = mxprof.record_function
    assert rf("a") is rf("a") and rf("a") is not rf("b")
    assert mxprof.range is rf

    @rf("decorated")
    def work():
        clock(2 * MS)

    mxprof.set_config(filename=trace_file, profile_api=False)
    mxprof.set_state("run")
    with rf("block"):
        clock(MS)
        work()
    mxprof.dump()
    trace = _testing.load_trace(trace_file)
    (block,) = _testing.events(trace, "X", "block")
    (dec,) = _testing.events(trace, "X", "decorated")
    assert (block["cat"], block["dur"], dec["cat"], dec["dur"]) == (
        "user_annotation",
        3000.0,
        "user_annotation",
        2000.0,
    )
    with pytest.raises(mxprof.ConfigError):
        rf("")


def actions(s, n):
    return [s(i) for i in range(n)]


def test_schedule_matches_torch_semantics():
    N, W, R, S = A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE
    assert actions(mxprof.schedule(wait=1, warmup=1, active=2), 8) == [N, W, R, S] * 2
    assert actions(mxprof.schedule(wait=0, warmup=0, active=1), 3) == [S, S, S]
    assert actions(mxprof.schedule(wait=2, warmup=0, active=2, repeat=1), 7) == [
        N,
        N,
        R,
        S,
        N,
        N,
        N,
    ]
    assert actions(mxprof.schedule(wait=1, warmup=1, active=1, skip_first=2), 7) == [
        N, N, N, W, S, N, W,
    ]  # fmt: skip
    assert mxprof.schedule(1, 1, 3, 1, 0)(4) == S  # positional arguments too


@pytest.mark.parametrize(
    "kw",
    [
        {"wait": -1, "warmup": 0, "active": 1},
        {"wait": 0, "warmup": 0, "active": 0},
        {"wait": 0, "warmup": 1.5, "active": 1},
        {"wait": 0, "warmup": 0, "active": 1, "repeat": -2},
        {"wait": True, "warmup": 0, "active": 1},
    ],
)
def test_schedule_rejects_bad_counts(kw):
    with pytest.raises(mxprof.ConfigError, match="schedule"):
        mxprof.schedule(**kw)


def run_loop(prof, steps, clock, body_ms=1):
    user = mxprof.record_function("user_work")
    for i in range(steps):
        with user:
            clock(body_ms * MS)
        mxprof.Domain("loop").new_marker(f"step {i}").mark()
        prof.step()


def test_wait_warmup_active_cycles(tmp_path, clock):
    base = str(tmp_path / "train.json")
    seen = []

    def ready(prof):
        rows = {r.name: r for r in prof.key_averages()}
        seen.append((prof.step_num, rows["user_work"].count, sorted(prof.trace_files)))

    sched = mxprof.schedule(wait=1, warmup=1, active=2, repeat=2)
    with mxprof.profile(schedule=sched, on_trace_ready=ready, filename=base) as prof:
        run_loop(prof, 10, clock)
    files = [str(tmp_path / "train-cycle0.json"), str(tmp_path / "train-cycle1.json")]
    assert prof.trace_files == files
    assert [s[:2] for s in seen] == [(3, 2), (7, 2)]
    # Only the active steps are in each file: 2,3 then 6,7.
    for path, steps in zip(files, ((2, 3), (6, 7))):
        got = names(path)
        assert sorted(n for n in got if n.startswith("ProfilerStep#")) == [
            f"ProfilerStep#{s}" for s in steps
        ]
        assert got.count("user_work") == 2
        assert sorted(names(path, "i")) == [f"step {s}" for s in steps]
    assert not os.path.exists(base)
    rows = {r.name: r for r in prof.key_averages()}  # the last cycle's, after exit
    assert rows["user_work"].count == 2 and rows["user_work"].total == 2 * MS
    assert rows["ProfilerStep#7"].count == 1


def test_cycle_files_keep_a_two_part_ending(tmp_path, clock):
    sched = mxprof.schedule(wait=0, warmup=0, active=1, repeat=2)
    with mxprof.profile(schedule=sched, filename=str(tmp_path / "train.json.gz")) as prof:
        run_loop(prof, 2, clock)
    assert prof.trace_files == [str(tmp_path / f"train-cycle{n}.json.gz") for n in (0, 1)]
    for n, path in enumerate(prof.trace_files):
        with gzip.open(path, "rt") as f:
            got = json.load(f)
        steps = [e["name"] for e in got["traceEvents"] if e["name"].startswith("ProfilerStep#")]
        assert steps == [f"ProfilerStep#{n}"]


def test_user_ranges_nest_inside_steps(trace_file, clock):
    with mxprof.profile(filename=trace_file) as prof:
        run_loop(prof, 3, clock)
    trace = _testing.load_trace(trace_file)
    steps = sorted(_testing.events(trace, "X"), key=lambda e: e["ts"])
    steps = [e for e in steps if e["name"].startswith("ProfilerStep#")]
    work = [e for e in _testing.events(trace, "X", "user_work")]
    # The step still open at stop() (#3, empty) is recorded too, as torch does.
    assert [s["name"] for s in steps] == [f"ProfilerStep#{i}" for i in range(4)]
    assert steps[3]["dur"] == 0
    for s, w in zip(steps, sorted(work, key=lambda e: e["ts"])):
        assert s["ts"] <= w["ts"] and w["ts"] + w["dur"] <= s["ts"] + s["dur"]
    assert prof.trace_files == [trace_file]
    rows = {r.name: r for r in prof.key_averages()}
    assert rows["ProfilerStep#1"].self == 0  # all of it inside user_work


def test_start_stop_without_with_and_export(tmp_path, clock):
    prof = mxprof.profile(
        schedule=mxprof.schedule(wait=0, warmup=1, active=1), filename=str(tmp_path / "p.json")
    )
    with pytest.raises(mxprof.StateError):
        prof.step()
    with pytest.raises(mxprof.StateError, match="no trace"):
        prof.export_chrome_trace(tmp_path / "copy.json")
    prof.start()
    with pytest.raises(mxprof.StateError, match="already running"):
        prof.start()
    run_loop(prof, 4, clock)
    prof.stop()
    prof.stop()  # a second stop does nothing
    assert len(prof.trace_files) == 2
    prof.export_chrome_trace(tmp_path / "copy.json")
    assert names(tmp_path / "copy.json") == names(prof.trace_files[-1])
    assert "ProfilerStep#3" in names(tmp_path / "copy.json")


def test_key_averages_table(trace_file, clock):
    d = mxprof.Domain("d")
    slow, fast = d.new_task("slow"), d.new_task("fast")
    with mxprof.profile(filename=trace_file) as prof:
        for i in range(5):
            with slow:
                clock((10 + i) * MS)
                with fast:
                    clock(1 * MS)
            prof.step()
    rows = {r.name: r for r in prof.key_averages()}
    s = rows["slow"]
    assert (s.count, s.total, s.self, s.min, s.max, s.avg) == (
        5,
        65 * MS,
        60 * MS,
        11 * MS,
        15 * MS,
        13 * MS,
    )
    assert (s.p50, s.p90, s.p99) == pytest.approx((13 * MS, 15 * MS, 15 * MS), rel=0.01)
    assert s.category == "d"
    table = prof.key_averages().table(sort_by="self", row_limit=2)
    body = [ln.split()[0] for ln in table.splitlines()[3:-1]]
    assert body == ["slow", "fast"]
    assert "65.000ms" in table and "60.000ms" in table
    assert prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=2) == table
    assert len(prof.key_averages().table(row_limit=None).splitlines()) == 4 + len(rows)
    with pytest.raises(mxprof.ConfigError, match="sort_by"):
        prof.key_averages().table(sort_by="nope")


def test_stop_during_warmup_writes_nothing(tmp_path, clock):
    path = str(tmp_path / "w.json")
    with mxprof.profile(
        schedule=mxprof.schedule(wait=1, warmup=5, active=1), filename=path
    ) as prof:
        run_loop(prof, 3, clock)  # ends in warmup
    assert prof.trace_files == []
    assert not os.path.exists(str(tmp_path / "w-cycle0.json"))
    assert prof.key_averages() == []


def test_config_is_restored(tmp_path, clock):
    mxprof.set_config(filename="mine.json", aggregate_stats=False)
    with mxprof.profile(filename=str(tmp_path / "p.json")) as prof:
        run_loop(prof, 2, clock)
    assert SESSION.config.filename == "mine.json"
    assert SESSION.config.aggregate_stats is False
    assert {r.name for r in prof.key_averages()} >= {"user_work", "ProfilerStep#1"}


def test_bad_arguments():
    with pytest.raises(TypeError):
        mxprof.profile(schedule=3)
    with pytest.raises(TypeError):
        mxprof.profile(on_trace_ready="x")
    with pytest.raises(mxprof.ConfigError):
        mxprof.profile(filename="")
    prof = mxprof.profile(schedule=lambda step: "record")
    with pytest.raises(TypeError, match="ProfilerAction"):
        prof.start()


def test_key_averages_table_aligns_wide_and_control_characters():
    from mxprof._render import width
    from mxprof.averages import KeyAverages, Row

    rows = KeyAverages(
        [
            Row("数据加载", "pipeline", 2, 4e6, 4e6, 1e6, 3e6),
            Row("line\nbreak", "cat\t1", 1, 1e6, 1e6, 1e6, 1e6),
            Row("plain", "pipeline", 1, 2e6, 2e6, 2e6, 2e6),
        ]
    )
    lines = rows.table().splitlines()
    body = lines[3:-1]
    assert [line.split()[0] for line in body] == ["数据加载", "plain", "line\\nbreak"]
    assert "cat\\t1" in body[2]
    assert len({width(line) for line in lines}) == 1  # every line as wide on screen
