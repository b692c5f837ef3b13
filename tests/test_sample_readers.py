"""Stack samples where a recorded profile is read: the summary and its table,
mxprof stats, the profiler's own ranges left out, and the exports."""

import json
import time

import mxprof
from mxprof import _testing
from mxprof._render import is_own
from mxprof.trace.samples import Sample, Samples, render_table, settings, summary

MAIN = ("<module>", "app.py", 1)
STEP = ("step", "app.py", 10)
LOAD = ("load", "app.py", 20)
WAITING = ("<waiting>", "", 0)


def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# Each spins in its own body, so that it holds its samples' innermost frame.
def hot_a(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def hot_b(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def own_and_work(path, own_s=0.08, work_s=0.08):
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


def record(path, body, rate=1000):
    """A trace with samples, as tests/test_sampling.py records one."""
    mxprof.set_config(filename=str(path), aggregate_stats=True, sample_rate=rate)
    mxprof.set_state("run")
    try:
        body()
    finally:
        mxprof.set_state("stop")  # joins the sampler: its counts are final
    mxprof.dump()
    return path


def dumps_samples():
    doc = json.loads(mxprof.dumps(format="json"))
    block = doc["Samples"]
    block.pop("Rate")
    return block


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
    assert list(live["Ranges"]) == ["app"] and live["Count"] >= 60
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
    assert "flush" not in out and "mxprof" not in out
    lines = out.splitlines()
    ranges = lines[3 : lines.index(lines[0], 3)]  # between the rules after the heads
    assert [ln.split()[0] for ln in ranges] == ["work"]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Samples ("))
    assert lines[start].startswith(f"Samples (1000 Hz wall, {len(trace.samples)} samples;")
    program = {ln.split()[0]: ln.split() for ln in lines[start + 5 : start + 7]}
    assert set(program) == {"hot_a", "hot_b"}  # the innermost frames: most self samples
    for name in ("hot_a", "hot_b"):
        assert int(program[name][2]) == int(program[name][4]) == inclusive(trace, name) >= 40
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
    assert doc["Samples"].pop("Mode") == "wall"  # the file's config; dumps() has the rate only
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
