"""The mxprof command, called as a console script and as python -m mxprof."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import mxprof
from mxprof import _testing

WAYS = {
    "script": [shutil.which("mxprof") or "mxprof"],
    "module": [sys.executable, "-m", "mxprof"],
}


@pytest.fixture(params=sorted(WAYS))
def cli(request, tmp_path):
    def run(*args, check=None):
        proc = subprocess.run(
            [*WAYS[request.param], *map(str, args)],
            cwd=tmp_path,  # not the repository root: its mxprof/ has no compiled core
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check is not None:
            assert proc.returncode == check, proc.stdout + proc.stderr
        return proc

    return run


SCRIPT = """
import sys
import mxprof
d = mxprof.Domain("app")
work = d.new_task("work")
for i in range(int(sys.argv[1])):
    with work:
        sum(range(1000))
print("args", sys.argv[1:])
sys.exit(int(sys.argv[2]))
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


PLAIN = """
import time


def spin():
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        pass


spin()
"""


def test_run_profiles_a_script_and_keeps_its_exit_status(cli, tmp_path):
    write(tmp_path, "app.py", SCRIPT)
    proc = cli("run", "-o", "app.json", "--sort", "count", "app.py", "5", "3", check=3)
    assert proc.stdout == "args ['5', '3']\n"  # the script's stdout is its own
    assert "trace written to app.json" in proc.stderr
    row = next(ln for ln in proc.stderr.splitlines() if ln.startswith("work "))
    assert row.split()[1:3] == ["app", "5"]  # category, count
    trace = _testing.load_trace(tmp_path / "app.json")
    assert len(_testing.events(trace, "X", "work")) == 5
    # The command records no range of its own around the script.
    assert "run app.py" not in {e["name"] for e in _testing.events(trace, "X")}


def table_rows(stderr):
    """The names in the rows of the statistics table `mxprof run` printed."""
    lines = stderr.splitlines()
    rules = [i for i, ln in enumerate(lines) if ln and set(ln) == {"-"}]
    assert len(rules) == 3, stderr  # above the header, below it, below the rows
    assert lines[rules[0] + 1].split()[:3] == ["Name", "Category", "Count"]
    return [ln.split()[0] for ln in lines[rules[1] + 1 : rules[2]]]


TWENTY = """
import mxprof
from mxprof import _testing
d = mxprof.Domain("app")
tasks = [d.new_task(f"t{i:02}") for i in range(20)]
with _testing.fake_clock() as advance:
    for i, task in enumerate(tasks):
        with task:
            advance((i + 1) * 100_000_000_000)   # t00: 100 s ... t19: 2000 s
"""


def test_run_prints_the_top_15_rows_by_total_without_a_flag(cli, tmp_path):
    write(tmp_path, "app.py", TWENTY)
    proc = cli("run", "app.py", check=0)
    assert "mxprof: statistics (top 15 of 20 by total)" in proc.stderr
    assert table_rows(proc.stderr) == [f"t{i:02}" for i in range(19, 4, -1)]
    proc = cli("run", "--top", "3", "--sort", "count", "app.py", check=0)
    assert table_rows(proc.stderr) == ["t00", "t01", "t02"]  # all count 1: ties by name


def test_run_no_stats_prints_no_table_and_keeps_none(cli, tmp_path):
    write(tmp_path, "app.py", SCRIPT)
    proc = cli("run", "--no-stats", "app.py", "2", "0", check=0)
    assert "statistics" not in proc.stderr and "Count" not in proc.stderr
    assert len(_testing.events(_testing.load_trace(tmp_path / "profile.json"), "X", "work")) == 2


def test_run_says_so_when_the_script_turned_statistics_off(cli, tmp_path):
    write(
        tmp_path,
        "off.py",
        """
        import mxprof
        mxprof.set_config(aggregate_stats=False)
        with mxprof.Domain("app").new_task("work"):
            pass
    """,
    )
    proc = cli("run", "off.py", check=0)
    assert "mxprof: no statistics to show" in proc.stderr
    assert "Count" not in proc.stderr


OWN_FILES = """
import mxprof
work = mxprof.Domain("app").new_task("work")
mxprof.set_config(filename="own.json")
with work:
    pass
mxprof.set_config(filename="own2.json")
with work:
    pass
with work:
    pass
mxprof.dump(finished=True)   # still running: what follows goes to own2-1.json
for _ in range(3):
    with work:
        pass
"""


def test_run_names_the_files_the_script_wrote(cli, tmp_path):
    write(tmp_path, "own.py", OWN_FILES)
    proc = cli("run", "-o", "cli.json", "own.py", check=0)
    written = [
        ln.removeprefix("mxprof: trace written to ")
        for ln in proc.stderr.splitlines()
        if ln.startswith("mxprof: trace written to ")
    ]
    # cli.json is where the run began (the core completes it at the switch, with
    # no event of the script); each of the others holds the script's events
    assert written == [
        "cli.json (no ranges: not in the report)",
        "own.json",
        "own2.json",
        "own2-1.json",
    ]
    written[0] = "cli.json"
    works = {
        name: len(_testing.events(_testing.load_trace(tmp_path / name), "X", "work"))
        for name in written
    }
    assert works == {"cli.json": 0, "own.json": 1, "own2.json": 2, "own2-1.json": 3}
    assert not (tmp_path / "profile.json").exists()


def test_run_says_when_no_trace_was_written(cli, tmp_path):
    write(tmp_path, "app.py", SCRIPT)
    proc = cli("run", "-o", "no/such/dir/t.json", "app.py", "1", "0", check=0)
    assert "cannot write trace file 'no/such/dir/t.json'" in proc.stderr
    assert "mxprof: no trace file written" in proc.stderr
    assert "trace written to" not in proc.stderr


def test_version(cli):
    from mxprof._version import __version__

    proc = cli("--version", check=0)
    assert proc.stdout == f"mxprof {__version__}\n"


def test_run_a_failing_script_still_writes_the_trace(cli, tmp_path):
    write(
        tmp_path,
        "bad.py",
        """
        import mxprof
        t = mxprof.Domain("d").new_task("before_error")
        t.start(); t.stop()
        raise ValueError("boom")
    """,
    )
    proc = cli("run", "bad.py", check=1)
    assert "ValueError: boom" in proc.stderr
    trace = _testing.load_trace(tmp_path / "profile.json")
    assert _testing.events(trace, "X", "before_error")


def test_run_errors(cli, tmp_path):
    proc = cli("run", "missing.py", check=2)
    assert "no such script" in proc.stderr and "missing.py" in proc.stderr
    proc = cli("run", "--period", "0", "x.py", check=2)
    assert "must be > 0" in proc.stderr
    proc = cli("run", "--sort", "median", "x.py", check=2)
    assert "median" in proc.stderr
    proc = cli("frobnicate", check=2)
    assert "invalid choice" in proc.stderr


def record_trace(tmp_path, name="t.json"):
    """A trace and its dumps() JSON, from a run with known nesting."""
    write(
        tmp_path,
        "rec.py",
        f"""
        import json, mxprof
        from mxprof import _testing
        mxprof.set_config(filename={name!r}, aggregate_stats=True, profile_api=False)
        d = mxprof.Domain("d")
        outer, inner = d.new_task("outer"), d.new_task("inner")
        with _testing.fake_clock() as clock:
            mxprof.set_state("run")
            for i in range(1, 21):
                with outer:
                    clock(i * 1000)
                    with inner:
                        clock(i * 500)
            mxprof.set_state("stop")
            mxprof.dump()
            print(mxprof.dumps(format="json"))  # inside: fake ticks are fake-clock ns
    """,
    )
    proc = subprocess.run([sys.executable, "rec.py"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / name, json.loads(proc.stdout)


def test_stats_json_matches_the_runs_dumps(cli, tmp_path):
    path, dumps = record_trace(tmp_path)
    proc = cli("stats", path, "--format", "json", "--sort", "self", check=0)
    doc = json.loads(proc.stdout)
    assert doc["unit"] == "ns" and doc["truncated"] is False
    rows = {r["name"]: r for r in doc["rows"]}
    for name in ("outer", "inner"):
        want = dumps["Time"]["d"][name]
        got = rows[name]
        assert got["count"] == want["Count"]
        for key in ("Total", "Min", "Max", "Avg", "Self"):
            assert got[key.lower()] == pytest.approx(want[key] * 1e6, abs=1), (name, key)
        for key in ("P50", "P90", "P99"):
            assert got[key.lower()] == pytest.approx(want[key] * 1e6, rel=0.01), (name, key)
    # Self: outer 315 us - 105 us of inner = 210 us; inner 105 us.
    assert [r["name"] for r in doc["rows"]] == ["outer", "inner"]
    assert rows["outer"]["self"] == 210_000 and rows["inner"]["self"] == 105_000


def test_stats_table_and_top(cli, tmp_path):
    path, _ = record_trace(tmp_path)
    proc = cli("stats", path, "--top", "1", check=0)
    lines = proc.stdout.splitlines()
    assert lines[1].split()[:2] == ["Name", "Category"]
    assert [ln.split()[0] for ln in lines[3:-1]] == ["outer"]  # by total
    assert "315.000us" in proc.stdout and "210.000us" in proc.stdout  # total, self


def test_stats_of_a_cut_file_says_so(cli, tmp_path):
    path, _ = record_trace(tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    proc = cli("stats", cut, "--format", "json", check=0)
    assert "cut short" in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["truncated"] is True and 0 < sum(r["count"] for r in doc["rows"]) < 40


def test_stats_errors(cli, tmp_path):
    missing = cli("stats", "nope.json", check=2).stderr
    assert "nope.json" in missing and "No such file" in missing
    (tmp_path / "text.json").write_text("hello")
    assert "not JSON" in cli("stats", "text.json", check=2).stderr
    (tmp_path / "obj.json").write_text('{"a": 1}')
    assert "not a trace" in cli("stats", "obj.json", check=2).stderr
    assert "invalid choice" in cli("stats", "obj.json", "--format", "xml", check=2).stderr
    assert "must be >= 0" in cli("stats", "obj.json", "--top", "-1", check=2).stderr


def test_stats_reads_a_torch_trace(cli, tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "torch.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with torch.profiler.record_function("my_block"):
                torch.ones(8).sum()
    prof.export_chrome_trace(str(path))
    doc = json.loads(cli("stats", path, "--format", "json", check=0).stdout)
    rows = {r["name"]: r for r in doc["rows"]}
    assert rows["my_block"]["count"] == 3
    assert rows["my_block"]["self"] < rows["my_block"]["total"]  # aten ops nested inside


def run_and_record(tmp_path, name, delay_s):
    write(
        tmp_path,
        f"{name}.py",
        f"""
        import time, mxprof
        mxprof.set_config(filename="{name}.json", profile_api=False)
        time.sleep({delay_s})
        mxprof.set_state("run")
        t = mxprof.Domain("{name}").new_task("job")
        with t:
            time.sleep(0.01)
        mxprof.dump()
    """,
    )
    proc = subprocess.run(
        [sys.executable, f"{name}.py"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return tmp_path / f"{name}.json"


def test_merge_puts_traces_on_one_timeline(cli, tmp_path):
    a = run_and_record(tmp_path, "first", 0)
    b = run_and_record(tmp_path, "second", 0.2)
    proc = cli("merge", a, b, "-o", "merged.json", check=0)
    assert "events written to merged.json" in proc.stderr
    ta, tb = _testing.load_trace(a), _testing.load_trace(b)
    merged = _testing.load_trace(tmp_path / "merged.json")
    assert merged["baseTimeNanoseconds"] == min(
        ta["baseTimeNanoseconds"], tb["baseTimeNanoseconds"]
    )
    jobs = {e["cat"]: e for e in _testing.events(merged, "X", "job")}
    assert set(jobs) == {"first", "second"}
    assert jobs["first"]["pid"] != jobs["second"]["pid"]  # one process track per input
    # Wall-clock alignment: the gap between the jobs is the gap between the runs.
    wall = {
        "first": ta["baseTimeNanoseconds"] / 1e3 + _testing.events(ta, "X", "job")[0]["ts"],
        "second": tb["baseTimeNanoseconds"] / 1e3 + _testing.events(tb, "X", "job")[0]["ts"],
    }
    gap = jobs["second"]["ts"] - jobs["first"]["ts"]
    assert gap == pytest.approx(wall["second"] - wall["first"], abs=1)
    assert gap > 150_000  # the second run started 0.2 s later
    names = {e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    assert any("first.json" in n for n in names) and any("second.json" in n for n in names)


def test_merge_renumbers_shared_pids(cli, tmp_path):
    a = run_and_record(tmp_path, "one", 0)
    copy = tmp_path / "copy.json"
    shutil.copy(a, copy)  # same pid twice
    cli("merge", a, copy, "-o", "m.json", check=0)
    merged = _testing.load_trace(tmp_path / "m.json")
    assert len({e["pid"] for e in _testing.events(merged, "X", "job")}) == 2


def test_merge_errors(cli, tmp_path):
    assert "no such file" in cli("merge", "a.json", "-o", "m.json", check=2).stderr
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert "not a trace" in cli("merge", "bad.json", "-o", "m.json", check=2).stderr
    assert "required" in cli("merge", "bad.json", check=2).stderr


# `mxprof run` writes the HTML report through mxprof.report.report(paths, output);
# these runs replace it with a stub that records its calls (or fails).
WITH_STUB = """
import json, sys
import mxprof.cli
calls = []
def stub(paths, output, *, baseline=None):
    calls.append([list(paths), output, baseline])
    if MODE == "fail":
        raise RuntimeError("the report could not be built")
    with open(output, "w") as f:
        f.write("<html></html>")
    return output
mxprof.cli.report = stub
try:
    code = mxprof.cli.main(sys.argv[1:])
finally:
    with open("calls.json", "w") as f:
        json.dump(calls, f)
sys.exit(code)
"""


def run_with_stub(tmp_path, mode, *args):
    """`mxprof run *args` with mxprof.report.report stubbed; (process, stub calls)."""
    write(tmp_path, "runner.py", f"MODE = {mode!r}\n{WITH_STUB}")
    proc = subprocess.run(
        [sys.executable, "runner.py", "run", *map(str, args)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    with open(tmp_path / "calls.json", encoding="utf-8") as f:
        return proc, json.load(f)


def test_run_writes_the_report_beside_the_trace(tmp_path):
    write(tmp_path, "app.py", SCRIPT)
    (tmp_path / "out").mkdir()
    proc, calls = run_with_stub(tmp_path, "ok", "-o", "out/app.json", "app.py", "4", "3")
    assert proc.returncode == 3, proc.stderr
    assert calls == [[["out/app.json"], "out/app.report.html", None]]
    lines = proc.stderr.splitlines()
    assert lines.index("mxprof: report written to out/app.report.html") == (
        lines.index("mxprof: trace written to out/app.json") + 1
    )
    assert (tmp_path / "out" / "app.report.html").read_text() == "<html></html>"
    assert table_rows(proc.stderr) == ["work"]  # the table still follows


def test_run_reports_every_trace_file_with_events_named_after_the_first(tmp_path):
    """The -o file holds no event when the script chose its own file first:
    a report of it failed ("the trace holds no events") and hid the others."""
    write(tmp_path, "own.py", OWN_FILES)
    proc, calls = run_with_stub(tmp_path, "ok", "-o", "cli.json.gz", "own.py")
    assert proc.returncode == 0, proc.stderr
    assert calls == [[["own.json", "own2.json", "own2-1.json"], "own.report.html", None]]
    assert "mxprof: report written to own.report.html" in proc.stderr.splitlines()


def test_run_of_a_script_nobody_instrumented_reports_its_samples(cli, tmp_path):
    """Samples alone make the page: the file was left out as "no events"."""
    write(tmp_path, "plain.py", PLAIN)
    proc = cli("run", "--sample", "500", "plain.py", check=0)
    assert "mxprof: report written to profile.report.html" in proc.stderr, proc.stderr
    assert "not in the report" not in proc.stderr
    page = (tmp_path / "profile.report.html").read_text(encoding="utf-8")
    assert 'id="flames"' in page and "spin" in page


def test_run_no_report_writes_none(tmp_path):
    write(tmp_path, "app.py", SCRIPT)
    proc, calls = run_with_stub(tmp_path, "ok", "--no-report", "app.py", "2", "0")
    assert proc.returncode == 0 and calls == []
    assert "report" not in proc.stderr and not (tmp_path / "profile.report.html").exists()
    assert "trace written to profile.json" in proc.stderr


def test_run_a_failed_report_keeps_the_scripts_exit_status(tmp_path):
    write(tmp_path, "app.py", SCRIPT)
    proc, calls = run_with_stub(tmp_path, "fail", "app.py", "2", "5")
    assert proc.returncode == 5 and len(calls) == 1
    assert (
        "mxprof run: report not written: RuntimeError: the report could not be built" in proc.stderr
    )
    assert "report written to" not in proc.stderr
    assert _testing.count(tmp_path / "profile.json", "work") == 2
    assert table_rows(proc.stderr) == ["work"]


def test_run_writes_no_report_without_a_trace(tmp_path):
    write(tmp_path, "app.py", SCRIPT)
    proc, calls = run_with_stub(tmp_path, "ok", "-o", "no/such/dir/t.json", "app.py", "1", "0")
    assert proc.returncode == 0 and calls == []
    assert "mxprof: no trace file written" in proc.stderr


def test_run_no_report_through_the_command(cli, tmp_path):
    write(tmp_path, "app.py", SCRIPT)
    proc = cli("run", "--no-report", "--no-stats", "app.py", "1", "0", check=0)
    assert proc.stderr == "mxprof: trace written to profile.json\n"
    assert sorted(os.listdir(tmp_path)) == ["app.py", "profile.json"]


def test_run_writes_the_real_report_with_the_runs_ranges(cli, tmp_path):
    write(tmp_path, "app.py", SCRIPT)
    proc = cli("run", "--no-stats", "-o", "app.json", "app.py", "2", "0", check=0)
    assert "mxprof: report written to app.report.html" in proc.stderr.splitlines()
    page = (tmp_path / "app.report.html").read_text(encoding="utf-8")
    # The user's ranges; the profiler's own (the flush) are not in the report's table.
    names = {r.name for r in mxprof.load(tmp_path / "app.json").key_averages().without_own()}
    assert names and all(f">{name}<" in page for name in names)


def test_report_path():
    from mxprof.cli import report_path

    assert [
        report_path(p)
        for p in ("profile.json", "runs/a.b.json.gz", "t.pftrace", "t.perfetto-trace", "t.trace")
    ] == [
        "profile.report.html",
        "runs/a.b.report.html",
        "t.report.html",
        "t.report.html",
        "t.trace.report.html",
    ]


FLUSHING = """
import os, time
import mxprof
mxprof.set_config(filename="own.json", dump_period=0.01)
work = mxprof.Domain("app").new_task("work")
give_up = time.monotonic() + 20
while not os.path.exists("own.json") and time.monotonic() < give_up:
    with work:
        time.sleep(0.002)
for _ in range(20):  # a few more background writes: each times itself as "flush"
    with work:
        time.sleep(0.005)
"""


def test_run_of_a_script_with_its_own_file_reports_its_ranges_without_the_writers(tmp_path):
    pytest.importorskip("plotly")
    write(tmp_path, "flushing.py", FLUSHING)
    proc = _testing.cli("run", "flushing.py", cwd=tmp_path, check=True)
    lines = proc.stderr.splitlines()
    assert "mxprof: trace written to profile.json (no ranges: not in the report)" in lines
    assert "mxprof: report written to own.report.html" in lines
    own = {(r.name, r.category) for r in mxprof.load(tmp_path / "own.json").key_averages()}
    assert ("flush", "mxprof") in own  # the writer's ranges are in the file ...
    page = (tmp_path / "own.report.html").read_text(encoding="utf-8")
    assert ">work<" in page and ">flush<" not in page  # ... not in what users read
    assert table_rows(proc.stderr) == ["work"]


def test_stats_builds_no_process_model_where_the_trace_has_no_memory_or_dataloader(
    tmp_path, monkeypatch, capsys
):
    # The model reads every event again: stats of a plain trace must not pay for it.
    import mxprof.cli
    from mxprof.trace import model

    path, _ = record_trace(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("the process model was built")

    monkeypatch.setattr(mxprof.cli, "job", refuse)
    monkeypatch.setattr(mxprof.cli, "memory_summary", refuse)
    read_again = []
    real = model.read_lines
    monkeypatch.setattr(model, "read_lines", lambda *a: read_again.append(1) or real(*a))
    assert mxprof.cli.main(["stats", str(path)]) == 0
    assert "outer" in capsys.readouterr().out
    assert len(read_again) == 1  # the file read once, for the statistics
