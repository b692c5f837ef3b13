"""mxprof diff: two profiles name by name, flagged beyond the threshold and the noise."""

import importlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

import pytest

import mxprof
from mxprof import _testing
from mxprof._render import width
from mxprof.errors import ConfigError, TraceFormatError
from mxprof.report.diff import STATS, DiffError, diff, typical_shift
from mxprof.trace import Trace

# By its full name: mxprof.report may bind the name diff to the function.
diff_module = importlib.import_module("mxprof.report.diff")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAYS = {
    "script": [shutil.which("mxprof") or "mxprof"],
    "module": [sys.executable, "-m", "mxprof"],
}


@pytest.fixture(params=sorted(WAYS))
def cli(request, tmp_path):
    def run(*args, check=None):
        proc = subprocess.run(
            [*WAYS[request.param], *map(str, args)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check is not None:
            assert proc.returncode == check, proc.stdout + proc.stderr
        return proc

    return run


def write_trace(path, durations, category="app"):
    """A Chrome trace with one range per duration (ns), back to back on one thread."""
    events, ts = [], 0
    for name, values in durations.items():
        for d in values:
            events.append(
                {"name": name, "cat": category, "ph": "X", "ts": ts / 1e3, "dur": d / 1e3,
                 "pid": 1, "tid": 1}
            )  # fmt: skip
            ts += d + 1000
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def lognormal(seed, n, median_ns=1_000_000, sigma=0.3, scale=1.0):
    """n durations spread like real step times: median 1 ms, about 30 % spread."""
    rng = random.Random(seed)
    return [round(scale * median_ns * math.exp(rng.gauss(0, sigma))) for _ in range(n)]


def record(path, durations):
    """A real mxprof trace: each name's ranges of exactly these durations (fake clock)."""
    domain = mxprof.Domain("d")
    tasks = {name: domain.new_task(name) for name in durations}
    with _testing.fake_clock() as clock:
        _testing.start(path)
        for name, values in durations.items():
            for d in values:
                tasks[name].start()
                clock(d)
                tasks[name].stop()
                clock(500)
        _testing.finish(path)
    _testing.reset()
    return path


# -- the numbers ----------------------------------------------------------------


def test_numbers_side_by_side_are_each_traces_key_averages(tmp_path):
    base = record(tmp_path / "base.json", {"step": [4000, 1000, 3000, 2000], "load": [700, 900]})
    new = record(tmp_path / "new.json", {"step": [1500, 5000, 2500], "load": [800]})
    d = diff(base, new)
    rows = {r.name: r for r in d.rows}
    assert set(rows) == {"step", "load"} and d.only_base == d.only_new == []
    for side, path in (("base", base), ("new", new)):
        for want in mxprof.load(path).key_averages():
            got = getattr(rows[want.name], side)
            assert (got.count, got.total, got.avg, got.p50, got.p99) == (
                want.count, want.total, want.avg, want.p50, want.p99
            )  # fmt: skip
    step = rows["step"]
    assert (step.base.count, step.base.total, step.base.p50, step.base.p99) == (
        4,
        10000,
        2000,
        4000,
    )
    assert (step.new.count, step.new.total, step.new.p50, step.new.p99) == (3, 9000, 2500, 5000)
    assert step.delta("count") == -1 and step.delta("total") == -1000
    assert step.delta("avg") == 500 and step.change_pct("avg") == pytest.approx(20.0)
    assert step.change_pct("p99") == pytest.approx(25.0) and step.direction == "slower"
    assert step.categories == ("d",)
    # too few events to cut into blocks: the 20 % is shown, never flagged
    assert not step.flagged and "too few events to judge" in step.why
    assert [r.name for r in d.rows] == ["step", "load"]  # largest change of total first


# -- the noise test -------------------------------------------------------------


def test_one_distribution_drawn_twice_is_not_flagged():
    """The interval misses the true shift (none) about 1 % of the time at 99 %:
    300 pairs drawn from one distribution (200 events a side), threshold 0,
    put it off zero in at most 6; at the default threshold none is flagged."""
    off_zero = 0
    for i in range(300):
        shift = typical_shift([lognormal(2 * i, 200)], [lognormal(2 * i + 1, 200)])
        off_zero += shift.low_pct > 0 or shift.high_pct < 0
    assert off_zero <= 6  # 3 expected
    flagged = 0
    for i in range(30):
        base = Trace.from_raw(raw_events({"step": lognormal(100 + i, 200)}))
        new = Trace.from_raw(raw_events({"step": lognormal(200 + i, 200)}))
        flagged += diff(base, new).rows[0].flagged
    assert flagged == 0


def test_the_same_durations_with_noise_on_each_are_not_flagged():
    rng = random.Random(5)
    durations = lognormal(1, 300)
    jittered = [round(d * rng.uniform(0.95, 1.05)) for d in durations]
    d = diff(
        Trace.from_raw(raw_events({"step": durations})),
        Trace.from_raw(raw_events({"step": jittered})),
        threshold=0,
    )
    (row,) = d.rows
    assert row.shift.low_pct < 0 < row.shift.high_pct and not row.flagged
    assert d.regressions == d.improvements == []


def test_a_20_percent_shift_with_enough_events_is_flagged(tmp_path):
    """Durations spread by ~30 % (lognormal, sigma 0.3): a 20 % shift is
    flagged in at least 19 of 20 pairs at 300 events a side."""
    flagged = 0
    for seed in range(20):
        base = Trace.from_raw(raw_events({"step": lognormal(2 * seed, 300)}))
        new = Trace.from_raw(raw_events({"step": lognormal(2 * seed + 1, 300, scale=1.2)}))
        (row,) = diff(base, new).rows
        flagged += row.flagged
        assert 8 < row.shift.pct < 32 and row.shift.by == "blocks", (seed, row)
    assert flagged >= 19
    # Three names on one thread: its common shift is taken out (spread 10 %).
    base = write_trace(
        tmp_path / "base.json",
        {n: lognormal(i, 300, sigma=0.1) for i, n in enumerate(("step", "io", "save"))},
    )
    new = write_trace(
        tmp_path / "new.json",
        {
            n: lognormal(10 + i, 300, sigma=0.1, scale=1.2 if n == "step" else 1)
            for i, n in enumerate(("step", "io", "save"))
        },
    )
    d = diff(base, new)
    rows = {r.name: r for r in d.rows}
    step = rows["step"]
    assert step.flagged and step.gates and step.direction == "slower"
    assert step.shift.thread == "tid 1" and abs(step.shift.thread_pct) < 5
    assert 5 < step.shift.low_pct < step.shift.pct < step.shift.high_pct
    assert "at 99% clears 5%" in step.why
    assert not rows["io"].flagged
    assert [r.name for r in d.regressions] == ["step"] and d.improvements == []
    back = diff(new, base)  # the other way round: an improvement
    assert [r.name for r in back.improvements] == ["step"] and back.regressions == []


def test_outliers_that_move_the_average_are_not_a_change(tmp_path):
    """Two stalls of 100 ms among 200 steps of 1 ms double the average, yet
    the steps did not get slower: the typical shift stays small, not flagged."""
    durations = lognormal(8, 200)
    stalled = lognormal(9, 198) + [100_000_000, 100_000_000]
    d = diff(
        write_trace(tmp_path / "b.json", {"step": durations}),
        write_trace(tmp_path / "n.json", {"step": stalled}),
    )
    (row,) = d.rows
    assert row.change_pct("avg") > 50 and abs(row.shift.pct) < 5
    assert not row.flagged and "within 5%" in row.why
    assert d.to_table().splitlines()[5].split()[-1] != "SLOWER"


def test_a_p50_that_moved_little_is_not_flagged_whatever_the_mean():
    """The issue's case: P50 +1.5 %, the mean doubled by a few outliers."""
    base = lognormal(20, 400)
    new = [round(d * 1.015) for d in lognormal(21, 400)]
    for i in range(0, 400, 50):
        new[i] = 40_000_000
    (row,) = diff(
        Trace.from_raw(raw_events({"step": base})), Trace.from_raw(raw_events({"step": new}))
    ).rows
    assert row.change_pct("avg") > 50 and not row.flagged


def test_few_events_are_shown_but_never_judged():
    """Blocks of at least 4 events, at least 4 blocks a side: 3 against 3 is
    not judged however far apart; 16 against 16 is, and a doubling is flagged."""
    few = {"step": [1000, 1100, 1200]}
    slow = {"step": [2000, 2100, 2200]}
    (row,) = diff(Trace.from_raw(raw_events(few)), Trace.from_raw(raw_events(slow))).rows
    assert not row.flagged and row.change_pct("avg") > 80 and not row.shift.judged
    sixteen = Trace.from_raw(raw_events({"step": [10_000 + 100 * i for i in range(16)]}))
    doubled = Trace.from_raw(raw_events({"step": [20_000 + 200 * i for i in range(16)]}))
    (row,) = diff(sixteen, doubled).rows
    assert row.shift.units == (4, 4) and row.flagged


def test_the_minimum_change_keeps_tiny_ranges_out():
    """A range of 500 ns 30 % slower moves 150 ns: under the 1 us default."""
    base = Trace.from_raw(raw_events({"tiny": lognormal(30, 400, median_ns=500, sigma=0.05)}))
    new = Trace.from_raw(
        raw_events({"tiny": lognormal(31, 400, median_ns=500, scale=1.3, sigma=0.05)})
    )
    (row,) = diff(base, new).rows
    assert row.shift.low_pct > 5 and not row.flagged and "under the minimum change" in row.why
    (row,) = diff(base, new, min_change=100).rows
    assert row.flagged
    for bad in (-1, "5", True, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="min_change"):
            diff(base, new, min_change=bad)


def drifted_runs(seed, runs, scale=1.0, drift=0.04, n=1000):
    """Runs of one program, each at its own machine speed (lognormal, sigma
    drift: another job, another clock), the code scale times slower."""
    rng = random.Random(seed)
    return [
        Trace.from_raw(
            raw_events(
                {"step": lognormal(seed * 100 + r, n, scale=scale * math.exp(rng.gauss(0, drift)))}
            )
        )
        for r in range(runs)
    ]


def test_a_busier_machine_is_taken_out_of_a_threads_ranges():
    """One run a side, the new one on a machine 30 % slower for every range
    of the thread, and backward 20 % slower still: only backward is flagged,
    by about 20 %, and the thread's common shift is said."""
    names = ("forward", "backward", "update", "load")
    base = {n: lognormal(60 + i, 300) for i, n in enumerate(names)}
    new = {
        n: lognormal(70 + i, 300, scale=1.3 * (1.2 if n == "backward" else 1))
        for i, n in enumerate(names)
    }
    d = diff(Trace.from_raw(raw_events(base)), Trace.from_raw(raw_events(new)))
    rows = {r.name: r for r in d.rows}
    assert [r.name for r in d.regressions] == ["backward"]
    assert 12 < rows["backward"].shift.pct < 28 and rows["backward"].gates
    assert all(not rows[n].flagged for n in names if n != "backward")
    assert rows["forward"].shift.typical_new / rows["forward"].shift.typical_base > 1.2  # raw
    (common,) = d.threads.values()
    assert 25 < common < 36
    assert "as a whole +" in d.to_table()


def test_several_runs_a_side_put_the_machine_into_the_interval():
    """Machine speed that differs run to run by ~4 %: one run a side flags
    unchanged code now and then; eight runs a side take the runs' spread as
    the noise and flag none, yet still flag a 20 % slowdown."""
    single = sum(
        diff(drifted_runs(s, 1)[0], drifted_runs(s + 50, 1)[0]).rows[0].flagged for s in range(20)
    )
    assert single >= 1  # one run a side cannot tell a slower machine from slower code
    same = [diff(drifted_runs(s, 8), drifted_runs(s + 50, 8)).rows[0] for s in range(20)]
    assert sum(r.flagged for r in same) == 0
    assert all(r.shift.by == "runs" and r.shift.units == (8, 8) for r in same)
    slower = [diff(drifted_runs(s, 8), drifted_runs(s + 50, 8, 1.2)).rows[0] for s in range(20)]
    assert sum(r.flagged and r.direction == "slower" for r in slower) >= 19


def test_the_threshold_decides_what_is_big_enough():
    base = {"step": lognormal(11, 2000)}
    small = {"step": lognormal(12, 2000, scale=1.03)}  # 3 %: real, and clear of 0 at 2000
    t_base, t_small = (Trace.from_raw(raw_events(x)) for x in (base, small))
    (row,) = diff(t_base, t_small).rows
    assert row.shift.low_pct > 0 and not row.flagged and "within 5%" in row.why
    (row,) = diff(t_base, t_small, threshold=0.5).rows
    assert row.flagged and "clears 0.5%" in row.why
    shifted = Trace.from_raw(raw_events({"step": lognormal(13, 200, scale=1.2)}))
    (row,) = diff(t_base, shifted, threshold=25).rows
    assert not row.flagged and "does not clear 25%" in row.why  # 20 % drawn as 27 %
    assert diff(t_base, shifted, threshold=10).rows[0].flagged
    for bad in (-1, "5", True, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="threshold"):
            diff(t_base, shifted, threshold=bad)


def raw_events(durations):
    events, ts = [], 0.0
    for name, values in durations.items():
        for d in values:
            events.append({"name": name, "cat": "app", "ph": "X", "ts": ts, "dur": d / 1e3})
            ts += d / 1e3 + 1
    return events


# -- names, output --------------------------------------------------------------


def test_names_on_one_side_only_are_listed(tmp_path):
    base = write_trace(tmp_path / "base.json", {"step": [1000] * 3, "old_load": [5000, 7000]})
    new = write_trace(tmp_path / "new.json", {"step": [1000] * 3, "数据": [300]})
    d = diff(base, new)
    assert [r.name for r in d.rows] == ["step"]
    assert d.only_base == ["old_load"] and d.only_new == ["数据"]
    assert d.base_stats["old_load"].avg == 6000 and d.new_stats["数据"].count == 1
    table = d.to_table()
    assert f"only in {base}: old_load (2 x 6.000us)" in table
    assert f"only in {new}: 数据 (1 x 300ns)" in table
    doc = d.to_json()
    assert doc["only_base"] == [
        {"name": "old_load", "categories": ["app"], "count": 2, "total": 12000, "avg": 6000.0,
         "p50": 5000, "p99": 7000}
    ]  # fmt: skip
    assert [x["name"] for x in doc["only_new"]] == ["数据"]


def test_json_keys_are_the_documented_ones(tmp_path):
    base = write_trace(tmp_path / "base.json", {"step": lognormal(1, 50), "gone": [1]})
    new = write_trace(tmp_path / "new.json", {"step": lognormal(2, 50, scale=1.5)})
    doc = diff(base, new).to_json()
    json.dumps(doc, allow_nan=False)  # plain, finite JSON
    assert set(doc) == {
        "base", "new", "unit", "threshold_pct", "min_change_ns", "test", "runs", "truncated",
        "rows", "only_base", "only_new", "regressions", "improvements", "shares",
    }  # fmt: skip
    assert doc["shares"] is None  # no stack samples
    assert doc["base"] == [str(base)] and doc["new"] == [str(new)] and doc["unit"] == "ns"
    assert doc["test"] == {"name": "typical-shift",
                           "estimate": "geometric mean of block medians",
                           "interval": "student-t", "confidence": 0.99,
                           "blocks": 32, "per_block": 4}  # fmt: skip
    assert doc["runs"] == {"base": 1, "new": 1} and doc["min_change_ns"] == 1000
    assert doc["truncated"] == {"base": False, "new": False} and doc["threshold_pct"] == 5.0
    (row,) = doc["rows"]
    assert set(row) == {
        "name", "categories", "base", "new", "delta", "change_pct", "shift", "direction",
        "flagged", "gates", "why",
    }  # fmt: skip
    assert set(row["shift"]) == {
        "typical_base", "typical_new", "pct", "low_pct", "high_pct", "units", "by", "thread",
        "thread_pct",
    }  # fmt: skip
    assert row["shift"]["units"] == {"base": 12, "new": 12} and row["shift"]["by"] == "blocks"
    assert row["shift"]["low_pct"] < row["shift"]["pct"] < row["shift"]["high_pct"]
    for key in ("base", "new", "delta", "change_pct"):
        assert list(row[key]) == list(STATS)
    assert row["delta"]["total"] == row["new"]["total"] - row["base"]["total"]
    assert row["change_pct"]["avg"] == pytest.approx(
        100 * (row["new"]["avg"] / row["base"]["avg"] - 1)
    )
    # One run a side and one name: compared raw, flagged, never a regression.
    assert row["flagged"] and row["direction"] == "slower" and not row["gates"]
    assert row["shift"]["thread"] is None and row["shift"]["thread_pct"] is None
    assert doc["regressions"] == [] and doc["improvements"] == []
    assert [x["name"] for x in doc["only_base"]] == ["gone"] and doc["only_new"] == []


def test_the_table_is_aligned(tmp_path):
    base = write_trace(tmp_path / "base.json", {"step": lognormal(1, 30), "数据加载": [1000] * 30})
    new = write_trace(
        tmp_path / "new.json", {"step": lognormal(2, 30, scale=2), "数据加载": [1000] * 30}
    )
    lines = diff(base, new).to_table().splitlines()
    assert lines[0].startswith(f"mxprof diff: {base} -> {new} (one run a side")
    rules = [i for i, ln in enumerate(lines) if ln and set(ln) == {"-"}]
    assert rules == [1, 4, 7]
    assert lines[3].split() == [
        "Name", "base", "new", "base", "new", "diff", "%", "base", "new", "diff", "%",
        "base", "new", "%", "base", "new", "%", "shift", "99%", "interval", "flag",
    ]  # fmt: skip
    assert lines[2].split() == ["Count", "Total", "Avg", "P50", "P99", "Typical"]
    assert len({width(ln) for ln in lines[1:8] if ln != lines[2]}) == 1  # rows fill the rule
    step = lines[5].split()
    # Two names, one run a side: compared raw, marked, never a regression.
    assert step[0] == "step" and step[1:3] == ["30", "30"] and step[-1] == "SLOWER*"
    assert lines[6].split()[0] == "数据加载" and lines[6].split()[-2:] == ["+0.0%", "+0.0%..+0.0%"]
    assert lines[-2].startswith("* compared raw (one run a side")
    assert lines[-1] == "0 slower, 0 faster: interval beyond 5% (2 compared)"


def test_several_traces_a_side_pool_their_ranges(tmp_path):
    a1 = write_trace(tmp_path / "a1.json", {"step": [1000, 2000]})
    a2 = write_trace(tmp_path / "a2.json", {"step": [3000], "io": [10]})
    b = write_trace(tmp_path / "b.json", {"step": [4000]})
    d = diff([a1, a2], mxprof.load(b))
    assert d.base == [str(a1), str(a2)] and d.new == [str(b)]
    assert d.base_stats["step"].count == 3 and d.base_stats["step"].total == 6000
    assert d.only_base == ["io"]


# -- bad input ------------------------------------------------------------------


def test_inputs_that_cannot_be_compared(tmp_path):
    good = write_trace(tmp_path / "good.json", {"step": [1000]})
    other = write_trace(tmp_path / "other.json", {"load": [1000], "save": [5]})
    with pytest.raises(
        DiffError,
        match=r"no range name in common between .*good\.json \(1 names\)"
        r" and .*other\.json \(2 names\)",
    ):
        diff(good, other)
    counters = tmp_path / "counters.json"
    counters.write_text(json.dumps([{"ph": "C", "name": "c", "ts": 1, "args": {"c": 1}}]))
    with pytest.raises(DiffError, match=r"counters\.json: no ranges to compare"):
        diff(good, counters)
    (tmp_path / "text.json").write_text("hello")
    with pytest.raises(TraceFormatError, match=r"text\.json.*not JSON"):
        diff(tmp_path / "text.json", good)
    with pytest.raises(TraceFormatError, match="nope.json"):
        diff(good, tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="new: no trace given"):
        diff(good, [])


def test_cli_exit_status_gates_on_flagged_regressions(cli, tmp_path):
    def spread(seed, scale=1.0):
        return lognormal(seed, 200, sigma=0.1, scale=scale)

    write_trace(tmp_path / "base.json", {"step": spread(1), "io": spread(3), "save": spread(7)})
    slower = {"step": spread(2, 1.3), "io": spread(4, 0.7), "save": spread(8)}
    write_trace(tmp_path / "new.json", slower)
    write_trace(
        tmp_path / "faster.json", {"step": spread(5, 0.7), "io": spread(6), "save": spread(9)}
    )
    proc = cli("diff", "base.json", "new.json", check=0)
    assert "1 slower, 1 faster" in proc.stdout and proc.stderr == ""
    proc = cli("diff", "base.json", "new.json", "--fail-on-regression", check=1)
    assert "mxprof diff: 1 regression(s): step" in proc.stderr
    doc = json.loads(cli("diff", "--format", "json", "base.json", "new.json", check=0).stdout)
    assert doc["regressions"] == ["step"] and doc["improvements"] == ["io"]
    # only an improvement, or a regression under the threshold: nothing to fail on
    proc = cli("diff", "base.json", "faster.json", "--fail-on-regression", check=0)
    assert "0 slower, 1 faster" in proc.stdout
    proc = cli(
        "diff", "base.json", "new.json", "--fail-on-regression", "--threshold", "50", check=0
    )
    assert "0 slower, 0 faster: interval beyond 50%" in proc.stdout


def test_cli_bad_input_is_exit_status_2_naming_the_file(cli, tmp_path):
    write_trace(tmp_path / "a.json", {"step": [1000]})
    write_trace(tmp_path / "b.json", {"load": [1000]})
    (tmp_path / "text.json").write_text("hello")
    (tmp_path / "obj.json").write_text('{"a": 1}')
    errors = {
        ("a.json", "missing.json"): "missing.json: cannot read: No such file",
        ("text.json", "a.json"): "text.json",
        ("a.json", "obj.json"): "not a trace",
        ("a.json", "b.json"): "no range name in common between a.json (1 names) and b.json",
    }
    for args, message in errors.items():
        proc = cli("diff", *args, "--fail-on-regression", check=2)
        assert proc.stderr.startswith("mxprof diff: ") and message in proc.stderr, proc.stderr
        assert proc.stdout == ""
    assert (
        "must be a finite number >= 0"
        in cli("diff", "a.json", "a.json", "--threshold", "-1", check=2).stderr
    )
    assert "invalid choice" in cli("diff", "a.json", "a.json", "--format", "xml", check=2).stderr
    assert "give BASE NEW, or BASE... -- NEW..." in cli("diff", "a.json", check=2).stderr
    assert "no trace after --" in cli("diff", "a.json", "--", check=2).stderr
    assert "not a number" in cli("diff", "a.json", "a.json", "--min-change", "x", check=2).stderr


def test_cli_several_runs_a_side_after_a_double_dash(cli, tmp_path):
    for i in range(4):
        write_trace(tmp_path / f"a{i}.json", {"step": lognormal(40 + i, 100)})
        write_trace(tmp_path / f"b{i}.json", {"step": lognormal(50 + i, 100, scale=1.5)})
    # Options come before the --: what follows it is the new side's files.
    proc = cli("diff", "--format", "json", "--fail-on-regression",
               *(f"a{i}.json" for i in range(4)), "--",
               *(f"b{i}.json" for i in range(4)), check=1)  # fmt: skip
    doc = json.loads(proc.stdout)
    assert doc["runs"] == {"base": 4, "new": 4} and doc["regressions"] == ["step"]
    (row,) = doc["rows"]
    assert row["shift"]["by"] == "runs" and row["shift"]["units"] == {"base": 4, "new": 4}
    assert row["base"]["count"] == 400  # every run's events, for the numbers
    table = cli("diff", "--min-change", "0.5ms", "a0.json", "a1.json", "--", "b0.json",
                check=0).stdout  # fmt: skip
    assert "2 run(s) against 1: the runs' spread" in table and "500.000us" in table


def test_cli_says_when_a_side_was_cut_short(tmp_path):
    # The core's file (valid after every write: a cut is a killed process);
    # another writer's cut file is an error (tests/test_exit_status.py).
    path = record(tmp_path / "a.json", {"step": [1000] * 40})
    data = path.read_bytes()
    (tmp_path / "cut.json").write_bytes(data[: len(data) // 2])
    proc = _testing.cli("diff", "a.json", "cut.json", "--format", "json", cwd=tmp_path, check=True)
    assert "cut.json was cut short" in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["truncated"] == {"base": False, "new": True}
    assert 0 < doc["rows"][0]["new"]["count"] < 40


# -- the examples ---------------------------------------------------------------


def run_example(name, tmp_path, *args):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_two_runs_of_the_quickstart_diff(tmp_path):
    run_example("quickstart.py", tmp_path, "one.json")
    run_example("quickstart.py", tmp_path, "two.json")
    proc = _testing.cli("diff", "one.json", "two.json", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["name"]: r for r in doc["rows"]}
    assert set(rows) == {"load_batch", "forward", "backward", "update", "step"}
    assert doc["only_base"] == doc["only_new"] == []
    for side, path in (("base", "one.json"), ("new", "two.json")):
        for want in mxprof.load(tmp_path / path).key_averages():
            got = rows[want.name][side]
            assert got["count"] == want.count == 120
            assert (got["total"], got["p50"], got["p99"]) == (want.total, want.p50, want.p99)
            assert got["avg"] == pytest.approx(want.avg)
    assert rows["step"]["categories"] == ["train,frame"]
    table = _testing.cli("diff", "one.json", "two.json", cwd=tmp_path, check=True).stdout
    assert [ln.split()[0] for ln in table.splitlines()[5:10]] == [r["name"] for r in doc["rows"]]


def test_two_runs_of_memory_scopes_diff(tmp_path):
    run_example("memory_scopes.py", tmp_path)
    os.rename(tmp_path / "memory_trace.json", tmp_path / "first.json")
    run_example("memory_scopes.py", tmp_path)
    proc = _testing.cli("diff", "first.json", "memory_trace.json", cwd=tmp_path, check=True)
    step = next(ln.split() for ln in proc.stdout.splitlines() if ln.startswith("step "))
    assert step[1:3] == ["5", "5"]  # its five steps, frames on both sides


# -- function shares of stack samples -------------------------------------------


# Each spins in its own body, so that it holds its samples' innermost frame.
def share_a(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def share_b(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def sampled_run(path, a_s, b_s, rounds=10):
    """A trace with stack samples: share_a for a_s and share_b for b_s seconds in
    all, inside the range app::work.  They take turns, so that a burst of load
    on the machine (which costs the sampler samples) hits both alike."""
    mxprof.set_config(filename=str(path), sample_rate=1000)
    work = mxprof.Domain("app").new_task("work")
    mxprof.set_state("run")
    try:
        with work:
            for _ in range(rounds):
                share_a(a_s / rounds)
                share_b(b_s / rounds)
    finally:
        mxprof.set_state("stop")
    mxprof.dump()
    _testing.reset()
    return path


def share_rows(d):
    return {r.function: r for r in d.shares.rows}


def test_two_runs_of_the_same_code_flag_no_share(tmp_path):
    # Long enough that what set_state("run") itself costs on a loaded machine (the
    # sampler sees it starting the writer's thread) stays a few points of the samples.
    base = sampled_run(tmp_path / "base.json", 0.4, 0.4)
    new = sampled_run(tmp_path / "new.json", 0.4, 0.4)
    d = diff(base, new)
    assert d.shares is not None and d.shares.base_samples > 0 < d.shares.new_samples
    rows = share_rows(d)
    for name in ("share_a", "share_b"):
        assert rows[name].file == "test_diff.py" and rows[name].inclusive.base > 0
    assert [r.label for r in d.shares.rows if r.flagged] == []
    assert d.shares.grew == d.shares.shrank == []


def test_a_planted_share_change_is_flagged_but_never_fails_the_gate(tmp_path, cli):
    base = sampled_run(tmp_path / "base.json", 0.1, 0.3)  # share_a about 25 %
    new = sampled_run(tmp_path / "new.json", 0.3, 0.1)  # about 75 %
    d = diff(base, new)
    rows = share_rows(d)
    a, b = rows["share_a"], rows["share_b"]
    # About 50 points on its own; less where threads other tests left blocked
    # are sampled too (wall mode samples every thread), never under 10.
    assert a.flagged and a.direction == "grew" and a.inclusive.delta_pts > 10
    assert b.flagged and b.direction == "shrank" and b.self.delta_pts < -10
    assert a.inclusive.low_pts > 5  # the interval clears the threshold
    assert d.shares.alpha_row == pytest.approx(0.01 / len(d.shares.rows))  # Bonferroni
    assert a.why.startswith("inclusive +") and "the interval clears 5 pts" in a.why
    # Counts are samples: each side's shares are its counts over its total.
    assert a.inclusive.base_pct == pytest.approx(100 * a.inclusive.base / d.shares.base_samples)
    assert [r.name for r in d.regressions] == []  # shares are relative: not regressions
    proc = cli("diff", base, new, "--fail-on-regression", check=0)
    lines = proc.stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Function shares"))
    shown = {ln.split()[0]: ln.split() for ln in lines[start + 5 :] if "(test_diff.py:" in ln}
    assert shown["share_a"][-1] == "GREW" and shown["share_b"][-1] == "SHRANK"
    assert shown["share_a"][2:4] == [str(a.inclusive.base), str(a.inclusive.new)]
    assert any(ln.startswith("1 grew, 1 shrank: interval beyond 5 points") for ln in lines)
    doc = json.loads(cli("diff", "--format", "json", base, new, check=0).stdout)
    shares = doc["shares"]
    assert set(shares) == {
        "base_samples", "new_samples", "unit", "threshold_pts", "test", "matched_by", "rows",
        "grew", "shrank",
    }  # fmt: skip
    assert shares["test"] == {"name": "two-proportion-interval", "alternative": "two-sided",
                              "alpha": 0.01, "correction": "bonferroni",
                              "alpha_per_function": d.shares.alpha_row}  # fmt: skip
    by_name = {r["function"]: r for r in shares["rows"]}
    assert by_name["share_a"]["inclusive"]["base"] == a.inclusive.base
    assert by_name["share_a"]["flagged"] and by_name["share_a"]["direction"] == "grew"
    assert [label.split(" (")[0] for label in shares["grew"]] == ["share_a"]
    assert doc["regressions"] == []
    # A higher threshold in points is a higher bar.
    assert not share_rows(diff(base, new, threshold=80))["share_a"].flagged


def test_shares_alone_when_no_range_name_is_on_both_sides(tmp_path):
    base = sampled_run(tmp_path / "base.json", 0.05, 0.05)
    events = json.loads(base.read_text())
    for e in events["traceEvents"]:
        if e.get("name") == "work" and e.get("ph") == "X":
            e["name"] = "other"
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(events))
    d = diff(base, renamed)
    assert d.rows == [] and d.only_base == ["work"] and d.only_new == ["other"]
    assert d.shares is not None and not any(r.flagged for r in d.shares.rows)
    table = d.to_table()
    assert "no range name on both sides; function shares only" in table
    assert "Function shares of stack samples" in table
    # Samples on one side only: the ranges decide, as before, and the table says why.
    plain = write_trace(tmp_path / "plain.json", {"work": [1000]})
    one = diff(base, plain)
    assert one.shares is None and one.sampled["new"] == 0 < one.sampled["base"]
    assert "function shares not compared: stack samples in base only" in one.to_table()
    with pytest.raises(DiffError, match="no range name in common"):
        diff(renamed, plain)


def test_the_profilers_own_ranges_are_not_compared(tmp_path):
    own = {"step": [1000] * 3}
    base = write_trace(tmp_path / "base.json", own)
    new = write_trace(tmp_path / "new.json", own)
    for path, flush in ((base, [10, 20]), (new, [5000, 9000])):
        doc = json.loads(path.read_text())
        doc["traceEvents"] += [
            {"name": "flush", "cat": "mxprof", "ph": "X", "ts": 10 + i, "dur": d / 1e3,
             "pid": 1, "tid": 2}
            for i, d in enumerate(flush)
        ] + [{"name": "run app.py", "cat": "mxprof", "ph": "X", "ts": 0, "dur": 100,
              "pid": 1, "tid": 1}]  # fmt: skip
        path.write_text(json.dumps(doc))
    d = diff(base, new)
    assert [r.name for r in d.rows] == ["step"] and d.only_base == d.only_new == []
    table = d.to_table()
    assert "flush" not in table and "run app.py" not in table
    only_own = write_trace(tmp_path / "own.json", {"flush": [1000]}, category="mxprof")
    with pytest.raises(DiffError, match=r"own\.json: no ranges to compare"):
        diff(base, only_own)
