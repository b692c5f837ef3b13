"""Stack samples where a recorded profile is read: the summary and its table,
mxprof stats, the profiler's own ranges left out, and the exports."""

import json
import threading
import time

import pytest
from _samples import dumps_samples, record

import mxprof
from mxprof import _testing
from mxprof._render import is_own
from mxprof.trace import Trace
from mxprof.trace.export import ExportError, export, to_collapsed, to_speedscope
from mxprof.trace.samples import Sample, Samples, render_table, settings, summary

MAIN = ("<module>", "app.py", 1)
STEP = ("step", "app.py", 10)
LOAD = ("load", "app.py", 20)
WAITING = ("<waiting>", "", 0)


# Each spins in its own body, so that it holds its samples' innermost frame.
def hot_a(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def hot_b(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def own_and_work(path, own_s=0.15, work_s=0.15):
    """A trace where hot_a runs in an own range (as the writer's flush would)
    and hot_b in the user's range app::work."""
    own = mxprof.Domain("mxprof").new_task("flush")
    work = mxprof.Domain("app").new_task("work")

    def body():
        with own:
            hot_a(own_s)
        with work:
            hot_b(work_s)

    return record(path, body)


def names(block):
    return {f["Function"]: f for f in block["Functions"]}


# -- the rule and the summary ----------------------------------------------------


def test_the_profilers_own_ranges_are_its_domain_but_not_the_overflow_object():
    assert is_own("mxprof", "flush") and is_own("mxprof", "run app.py")
    assert not is_own("mxprof", "<overflow>")  # users' ranges past the registry's capacity
    assert not is_own("app", "flush") and not is_own("mxprof,frame", "x")
    assert not is_own("mxprof.sample", "f")


def test_samples_in_an_own_range_count_in_no_range():
    counts = {
        (("mxprof", "flush"), (MAIN, LOAD)): 4,
        (("app", "train"), (MAIN, STEP)): 6,
        (None, (MAIN, WAITING)): 2,
    }
    got = summary(counts)
    assert got["Count"] == 12
    assert list(got["Ranges"]) == ["app"]  # no "mxprof" block
    assert got["Ranges"]["app"]["train"]["Count"] == 6
    program = names({"Functions": got["Program"]})
    assert program["load"]["Self"] == 4 and program["<waiting>"]["Self"] == 2
    # A loaded trace's counts say the same: the file keeps the range.
    loaded = Samples(
        [Sample(1, 1, i, (MAIN, LOAD), ("mxprof", "flush")) for i in range(3)]
        + [Sample(1, 1, 9, (MAIN, STEP), ("app", "train"))]
    )
    assert loaded.samples[0].range == ("mxprof", "flush")
    assert set(loaded.counts()) == {(None, (MAIN, LOAD)), (("app", "train"), (MAIN, STEP))}
    assert loaded.summary()["Ranges"] == summary(loaded.counts())["Ranges"]


def test_the_table_lists_self_and_inclusive_counts_and_shares():
    counts = {(("app", "train"), (MAIN, STEP)): 3, (None, (MAIN, LOAD)): 1}
    lines = render_table({**summary(counts), "Rate": 250.0, "Mode": "cpu"}, top=5)
    assert lines[0] == "Samples (250 Hz cpu, 4 samples; top 5 functions per range)"
    assert lines[2].split() == ["Name", "Self", "Self", "%", "Inclusive", "Inclusive", "%"]
    assert lines[4] == "<program> (4 samples)"
    rows = {ln.split()[0]: ln.split()[2:] for ln in lines[5:8]}  # the program's
    assert [ln.split()[0] for ln in lines[5:8]] == ["step", "load", "<module>"]  # by self
    assert rows["<module>"] == ["0", "0.00", "4", "100.00"]
    assert rows["load"] == ["1", "25.00", "1", "25.00"]
    assert "app::train (3 samples)" in lines
    assert lines[-1] == ""
    # No rate known (a Perfetto or merged file): the title leaves it out.
    assert render_table(summary(counts))[0] == "Samples (4 samples; top 10 functions per range)"


def test_settings_come_from_the_recorded_configuration():
    def meta(**config):
        return {"otherData": {"config": config}}

    assert settings(meta(sample_rate=99.5)) == {"Rate": 99.5, "Mode": "wall"}
    assert settings(meta(sample_rate=1000, sample_mode="cpu")) == {"Rate": 1000.0, "Mode": "cpu"}
    assert settings(meta(sample_rate=0)) == {"Rate": None}
    assert settings({}) == settings({"otherData": []}) == {"Rate": None}


def test_live_and_loaded_summaries_leave_own_ranges_out_alike(tmp_path):
    path = own_and_work(tmp_path / "t.json")
    live = dumps_samples()
    assert list(live["Ranges"]) == ["app"] and live["Count"] > 0
    loaded = mxprof.load(path)
    assert loaded.samples.summary() == live
    assert "hot_a" in names({"Functions": loaded.samples.summary(top=1000)["Program"]})
    assert ("mxprof", "flush") in {s.range for s in loaded.samples.samples}  # the file keeps it
    # dumps()'s table of ranges keeps MXNet's layout: the own range is listed there.
    assert "flush" in mxprof.dumps()


# -- mxprof stats -----------------------------------------------------------------


def inclusive(trace, function):
    return sum(any(f[0] == function for f in s.stack) for s in trace.samples.samples)


def test_stats_prints_the_sampled_functions_and_no_own_range(tmp_path):
    path = own_and_work(tmp_path / "t.json")
    trace = mxprof.load(path)
    out = _testing.cli("stats", path, cwd=tmp_path, check=True).stdout
    assert "mxprof::" not in out  # no block of an own range (functions may say flush)
    lines = out.splitlines()
    ranges = lines[3 : lines.index(lines[0], 3)]  # between the rules after the heads
    assert [ln.split()[0] for ln in ranges] == ["work"]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Samples ("))
    assert lines[start].startswith(f"Samples (1000 Hz wall, {len(trace.samples)} samples;")
    # The program's rows, up to the next block (threads left blocked by earlier
    # tests may add <waiting> rows: every thread is sampled in wall mode).
    rows = lines[start + 5 :]
    rows = rows[: next(i for i, ln in enumerate(rows) if not ln.startswith("  "))]
    program = {ln.split()[0]: ln.split() for ln in rows}
    assert {"hot_a", "hot_b"} <= set(program)  # the innermost frames: most self samples
    for name in ("hot_a", "hot_b"):
        # Counts, not shares: self == inclusive, as many as the trace's samples in it.
        assert int(program[name][2]) == int(program[name][4]) == inclusive(trace, name) > 0
    # hot_a ran in the own range: its samples are in no range, so app::work is the only block.
    blocks = [ln.split(" (")[0] for ln in lines[start + 4 :] if ln and not ln.startswith(" ")]
    assert blocks == ["<program>", "app::work"]
    work = lines[lines.index(next(ln for ln in lines if ln.startswith("app::work"))) + 1]
    assert work.split()[0] == "hot_b"


def test_stats_json_has_the_samples_block_dumps_has(tmp_path):
    path = own_and_work(tmp_path / "t.json")
    live = json.loads(mxprof.dumps(format="json"))["Samples"]
    proc = _testing.cli("stats", "--format", "json", path, cwd=tmp_path, check=True)
    doc = json.loads(proc.stdout)
    assert [r["name"] for r in doc["rows"]] == ["work"]
    assert doc["Samples"]["Mode"] == "wall"
    assert doc["Samples"] == live
    top = json.loads(
        _testing.cli("stats", "--format", "json", "--top", "1", path, cwd=tmp_path).stdout
    )
    assert len(top["Samples"]["Program"]) == 1 and top["Samples"]["Program"][0]["Self"] > 0


def test_stats_of_a_trace_without_samples_has_no_samples_block(tmp_path):
    path = tmp_path / "t.json"
    _testing.start(path)
    with mxprof.Domain("app").new_task("work"):
        pass
    _testing.finish(path)
    out = _testing.cli("stats", path, cwd=tmp_path, check=True).stdout
    assert "work" in out and "Samples" not in out
    doc = json.loads(_testing.cli("stats", "--format", "json", path, cwd=tmp_path).stdout)
    assert "Samples" not in doc


# -- mxprof export ----------------------------------------------------------------


def two_threads(path):
    """Samples on two threads: MainThread in hot_a, "worker" in hot_b."""

    def body():
        worker = threading.Thread(target=hot_b, args=(0.1,), name="worker")
        worker.start()
        hot_a(0.1)
        worker.join()

    return record(path, body)


def per_thread(trace):
    found = {}
    for s in sorted(trace.samples.samples, key=lambda s: s.ts):
        found.setdefault(trace.thread_names[(s.pid, s.tid)], []).append(s.stack)
    return found


def check_speedscope(doc):
    """The file format's shape (speedscope's file-format-spec), checked by hand."""
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = doc["shared"]["frames"]
    assert all(isinstance(f["name"], str) and set(f) <= {"name", "file", "line"} for f in frames)
    assert isinstance(doc["name"], str) and doc["exporter"].startswith("mxprof ")
    assert 0 <= doc["activeProfileIndex"] < len(doc["profiles"])
    for p in doc["profiles"]:
        assert set(p) == {"type", "name", "unit", "startValue", "endValue", "samples", "weights"}
        assert p["type"] == "sampled" and len(p["samples"]) == len(p["weights"])
        assert all(0 <= i < len(frames) for stack in p["samples"] for i in stack)
        assert p["startValue"] == 0 and p["endValue"] == pytest.approx(sum(p["weights"]))


def test_speedscope_has_a_sampled_profile_per_thread_weighing_the_sample_period(tmp_path):
    path = two_threads(tmp_path / "t.json")
    trace = mxprof.load(path)
    out = tmp_path / "t.speedscope.json"
    proc = _testing.cli("export", "--format", "speedscope", path, "-o", out, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert f"{len(trace.samples)} samples of " in proc.stderr and str(out) in proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    check_speedscope(doc)
    frames = doc["shared"]["frames"]
    want = per_thread(trace)
    got = {}
    for p in doc["profiles"]:
        assert p["unit"] == "seconds" and set(p["weights"]) == {0.001}  # 1 / 1000 Hz
        thread = p["name"].split(" (pid ")[0]
        got[thread] = [tuple(frames[i]["name"] for i in stack) for stack in p["samples"]]
        assert p["endValue"] == pytest.approx(len(want[thread]) / 1000)
    assert got == {t: [tuple(f[0] for f in st) for st in stacks] for t, stacks in want.items()}
    assert any(st[-1] == "hot_b" for st in got["worker"])  # outermost first, innermost last
    busiest = max(doc["profiles"], key=lambda p: len(p["samples"]))
    assert len(doc["profiles"][doc["activeProfileIndex"]]["samples"]) == len(busiest["samples"])
    assert {"name": "hot_a", "file": __file__, "line": hot_a.__code__.co_firstlineno} in frames


def test_speedscope_weights_are_counts_when_the_rate_is_unknown(tmp_path):
    path = record(tmp_path / "t.pftrace", lambda: hot_a(0.05))  # Perfetto: no config in it
    trace = mxprof.load(path)
    doc = to_speedscope(trace)
    check_speedscope(doc)
    (profile,) = [p for p in doc["profiles"] if p["name"].startswith("MainThread")]
    assert profile["unit"] == "none" and set(profile["weights"]) == {1}
    assert sum(len(p["samples"]) for p in doc["profiles"]) == len(trace.samples)


def test_collapsed_lines_count_every_sample_once(tmp_path):
    path = two_threads(tmp_path / "t.json")
    trace = mxprof.load(path)
    out = tmp_path / "t.folded"
    _testing.cli("export", "--format", "collapsed", path, "-o", out, cwd=tmp_path, check=True)
    lines = out.read_text(encoding="utf-8").splitlines()
    counts = {ln.rpartition(" ")[0]: int(ln.rpartition(" ")[2]) for ln in lines}
    assert len(counts) == len(lines)  # one line per distinct stack
    assert len(lines) == len({s.stack for s in trace.samples.samples})
    assert sum(counts.values()) == len(trace.samples)
    a = f"hot_a ({__file__}:{hot_a.__code__.co_firstlineno})"
    assert sum(n for stack, n in counts.items() if stack.endswith(a)) == sum(
        s.stack[-1][0] == "hot_a" for s in trace.samples.samples
    )
    # One root frame per thread with --threads, to stdout with -o -.
    proc = _testing.cli(
        "export", "--format", "collapsed", "--threads", path, "-o", "-", cwd=tmp_path, check=True
    )
    by_thread = {}
    for ln in proc.stdout.splitlines():
        stack, _, n = ln.rpartition(" ")
        thread = stack.split(";")[0].split(" (pid ")[0]
        by_thread[thread] = by_thread.get(thread, 0) + int(n)
    assert by_thread == {t: len(stacks) for t, stacks in per_thread(trace).items()}


def test_collapsed_keeps_waiting_as_the_leaf_and_folds_names_safely():
    trace = Trace([], thread_names={(1, 1): "MainThread", (1, 2): "io"})
    odd = ("weird;name", "/a b/c.py", 3)
    trace.samples = Samples(
        [Sample(1, 1, i, (MAIN, STEP), ("app", "train")) for i in range(3)]
        + [Sample(1, 2, i, (MAIN, LOAD, WAITING), None) for i in range(2)]
        + [Sample(1, 2, 9, (MAIN, odd), ("mxprof", "flush"))]
    )
    assert to_collapsed(trace).splitlines() == [
        "<module> (app.py:1);load (app.py:20);<waiting> 2",
        "<module> (app.py:1);step (app.py:10) 3",
        "<module> (app.py:1);weird:name (/a b/c.py:3) 1",
    ]
    threaded = to_collapsed(trace, threads=True).splitlines()
    assert threaded[0] == "MainThread (pid 1 tid 1);<module> (app.py:1);step (app.py:10) 3"
    assert sum(int(ln.rpartition(" ")[2]) for ln in threaded) == 6


def test_export_errors_are_status_2_and_write_nothing(tmp_path):
    plain = tmp_path / "plain.json"
    _testing.start(plain)
    with mxprof.Domain("app").new_task("work"):
        pass
    _testing.finish(plain)
    out = tmp_path / "out.txt"
    cases = {
        ("--format", "collapsed", plain): "plain.json: no stack samples to export",
        ("--format", "speedscope", "missing.json"): "missing.json: cannot read",
        ("--format", "flame", plain): "invalid choice: 'flame'",
        ("--format", "speedscope", "--threads", plain): "--threads is for --format collapsed",
    }
    for args, message in cases.items():
        proc = _testing.cli("export", *args, "-o", out, cwd=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 or "usage:" in proc.stderr
        assert not out.exists()
    assert "required" in _testing.cli("export", plain, "-o", out, cwd=tmp_path).stderr
    with pytest.raises(ExportError, match="no stack samples"):
        export(plain, out, "collapsed")
    with pytest.raises(ValueError, match="format must be one of speedscope, collapsed"):
        export(plain, out, "parquet")
    sampled = record(tmp_path / "s.json", lambda: hot_a(0.1))
    proc = _testing.cli("export", "--format", "collapsed", sampled, "-o", tmp_path, cwd=tmp_path)
    assert proc.returncode == 2 and "cannot write" in proc.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".mxprof-export-")] == []
