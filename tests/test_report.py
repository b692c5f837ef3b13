"""mxprof report: the page's sections and numbers, bad input, and that it needs no network."""

import gzip
import json
import os
import pathlib
import re
import time
from html.parser import HTMLParser

import _bench
import plotly.offline  # a core dependency: the report is never skipped
import pytest

import mxprof
import mxprof.report
from mxprof import _testing
from mxprof.errors import OutputError, TraceFormatError, TraceReadError
from mxprof.report import _html, _sections, _series
from mxprof.report.diff import diff
from mxprof.report.hints import find_hints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Page(HTMLParser):
    """Tags with their attributes, the ranges table's cells, and script texts."""

    def __init__(self, text):
        super().__init__()
        self.tags, self.rows, self.scripts = [], [], []
        self._in_ranges = self._in_script = False
        self._row = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "table" and attrs.get("id") == "ranges":
            self._in_ranges = True
        elif tag == "tr" and self._in_ranges and "data-row" in attrs:
            self._row = []
            self.rows.append(self._row)
        elif tag == "td" and self._row is not None:
            self._row.append([attrs.get("data-v"), ""])
        elif tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_ranges, self._row = False, None
        elif tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data
        elif self._row is not None and self._row:
            self._row[-1][1] += data

    def ids(self):
        return {a["id"] for _, a in self.tags if "id" in a}

    def table(self):
        """Per row: name -> (category, count, total, self, avg, p50, p90, p99) from data-v."""
        out = {}
        for cells in self.rows:
            name, cat = cells[0][1], cells[1][1]
            out[name] = (cat, *(float(v) for v, _ in cells[2:9]))
        return out


def X(name, ts, dur, *, pid=1, tid=1, cat="train", **args):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid,
            "args": args}  # fmt: skip


def C(name, ts, value, *, pid=1, cat="train"):
    return {"name": name, "cat": cat, "ph": "C", "ts": ts, "pid": pid, "tid": 1,
            "args": {name: value}}  # fmt: skip


def training(steps=10, slow=6, pid=1):
    """steps frames of 10 ms: data 2 ms (20 ms in step slow), forward 5 ms; memory and a counter."""
    events, t = [], 0.0
    for i in range(steps):
        data = 20_000 if i == slow else 2_000
        dur = data + 5_000 + 1_000
        events.append(X("step", t, dur, pid=pid, cat="train,frame", frame=i))
        events.append(X("data", t + 500, data, pid=pid))
        events.append(X("forward", t + 500 + data, 5_000, pid=pid))
        events.append(X("matmul", t + 600 + data, 1_000, pid=pid))  # nested in forward
        events.append(C("loss", t + dur, 100 - i, pid=pid))
        used = (i + 1) << 20
        events.append(C("Memory: gpu/0", t + 700 + data, used, pid=pid, cat="Device Storage"))
        events.append(C("encoder:", t + 700 + data, used - (1 << 19), pid=pid, cat="Scope Storage"))
        events.append(C("decoder:", t + 700 + data, 1 << 19, pid=pid, cat="Scope Storage"))
        t += dur + 100
    return events


def write(path, events, **top):
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms", **top}))
    return path


def make_report(tmp_path, events, **top):
    trace = write(tmp_path / "t.json", events, **top)
    out = mxprof.report.report(trace, tmp_path / "r.html")
    assert out == str(tmp_path / "r.html")
    return Page((tmp_path / "r.html").read_text(encoding="utf-8")), trace


def test_the_ranges_table_holds_key_averages_numbers(tmp_path):
    page, trace = make_report(tmp_path, training())
    rows = page.table()
    assert list(rows) == ["step", "forward", "data", "matmul"]  # by total, largest first
    for r in mxprof.load(trace).key_averages():
        shown = rows[r.name]
        assert shown == (r.category, r.count, r.total, r.self, r.avg, r.p50, r.p90, r.p99)
    # By hand: data is 2 ms nine times and 20 ms once.
    assert rows["data"][1:3] == (10, 38_000_000)
    assert rows["data"][5:] == (2_000_000, 2_000_000, 20_000_000)
    assert rows["forward"][3] == 40_000_000  # self: 5 ms less the 1 ms matmul, 10 times
    assert {"sec-hints", "sec-summary", "sec-ranges", "sec-steps", "sec-counters",
            "sec-memory", "sec-timeline", "ranges", "histogram", "steps", "counter-0",
            "memory-devices", "memory-scopes"} <= page.ids()  # fmt: skip
    assert "processes" not in page.ids()  # one process: nothing to compare, and it says so
    assert "One process in the input: nothing to compare" in (tmp_path / "r.html").read_text()
    hist = json.loads(next(s for s in page.scripts if s.startswith('{"0"')))
    data_row = next(i for i, c in enumerate(page.rows) if c[0][1] == "data")
    assert sum(hist[str(data_row)]["counts"]) == 10
    assert hist[str(data_row)]["edges"][0] == 0.002 and hist[str(data_row)]["edges"][-1] == 0.02


def test_sections_find_steps_outliers_memory_peaks_and_counters(tmp_path):
    trace = write(tmp_path / "t.json", training(), otherData={"dropped_events": 3, "host": "h"})
    s = _sections.build([str(trace)], [mxprof.load(trace)])
    st = s.steps
    assert (st.name, st.count, st.group, st.processes) == ("step", 10, 1, 1)
    assert st.index == list(range(10))
    assert st.outliers == [(6, 26_000_000)]
    assert st.parts["data"][6] == 20_000_000 and st.parts["forward"][0] == 5_000_000
    assert st.parts["in no range"] == [1_000_000] * 10  # the step less its top-level ranges
    assert (st.in_no_range_ns, st.between_ns) == (10_000_000, 900_000)  # 100 us gaps
    assert "matmul" not in st.parts  # nested in forward: not top-level
    (peak,) = s.peaks
    assert (peak.device, peak.peak, peak.scope, peak.scope_bytes) == (
        "gpu/0", 10 << 20, "encoder:", (10 << 20) - (1 << 19)
    )  # fmt: skip
    assert [c.name for c in s.counters] == ["loss"] and s.counters[0].last == 91
    assert s.tallies["dropped_events"] == 3 and s.config["host"] == {str(trace): "h"}
    page = _html.page(s, "", "")
    assert "3 events were dropped" in page and "max_events" in page
    # The recording's settings are folded away: not in the way of the first screen.
    assert (
        '<details id="config"><summary>Recorded by: the trace\'s <code>otherData</code> (1 key)'
        in page
    )
    assert page.index('<details id="config">') < page.index('<table class="config">')


def test_several_processes_side_by_side(tmp_path):
    a = write(tmp_path / "a.json", training(pid=7), baseTimeNanoseconds=10**18)
    b = write(tmp_path / "b.json", training(slow=2, pid=7), baseTimeNanoseconds=10**18 + 5000)
    mxprof.report.report([a, b], tmp_path / "r.html")
    page = Page((tmp_path / "r.html").read_text(encoding="utf-8"))
    assert "sec-processes" in page.ids() and "processes" in page.ids()
    rows = page.table()
    assert rows["data"][1] == 20  # both files' ranges in one table
    s = _sections.build([str(a), str(b)], [mxprof.load(a), mxprof.load(b)])
    assert [p.pid for p in s.processes] == [7, 7]  # each file's own pid ...
    assert {e.pid for e in s.combined} == {7, "1:7"}  # ... kept apart when combined
    assert s.steps.count == 10 and s.steps.processes == 2  # one rank's steps, not both added
    assert s.steps.thread == "tid 1 of pid 7 (a.json)"
    assert [p.label for p in s.processes] == ["pid 7 (a.json)", "pid 7 (b.json)"]


def test_reads_kineto_viztracer_gzip_and_perfetto(tmp_path, clock):
    kineto = [X(f"ProfilerStep#{i}", i * 1000, 900, cat="cpu_op") for i in range(1, 5)]
    kineto += [X("aten::mm", i * 1000 + 10, 500, cat="cpu_op") for i in range(1, 5)]
    page, _ = make_report(tmp_path, kineto, schemaVersion=1)
    assert "4 steps of <code>ProfilerStep#</code>" in (tmp_path / "r.html").read_text()
    assert page.table()["aten::mm"][1] == 4

    viz = {"traceEvents": [X("f", 1, 5, cat="FEE"), X("g", 2, 1, cat="FEE")],
           "viztracer_metadata": {"version": "1.1.1"}}  # fmt: skip
    with gzip.open(tmp_path / "viz.json.gz", "wt") as f:
        json.dump(viz, f)
    mxprof.report.report(tmp_path / "viz.json.gz", tmp_path / "v.html")
    assert Page((tmp_path / "v.html").read_text()).table()["g"][1] == 1

    pf = tmp_path / "live.pftrace"
    _testing.start(pf)
    task = mxprof.Domain("d").new_task("work")
    for _ in range(3):
        with task:
            clock(1_000_000)
    mxprof.set_state("stop")
    mxprof.dump()
    mxprof.report.report(pf, tmp_path / "p.html")
    assert Page((tmp_path / "p.html").read_text()).table()["work"][1:3] == (3, 3_000_000)


def test_the_page_fetches_nothing(tmp_path):
    make_report(tmp_path, training())
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    page = Page(text)
    for tag, attrs in page.tags:
        assert tag not in ("link", "iframe", "img", "object", "embed"), (tag, attrs)
        for key in ("src", "href", "srcset", "action", "data"):
            assert key not in attrs or attrs[key].startswith(("#", "data:")), (tag, attrs)
    styles = "".join(s for s in page.scripts if "Plotly.newPlot" in s)
    assert "url(" not in text.split("</style>")[0] and "@import" not in text.split("</style>")[0]
    assert text.count(plotly.offline.get_plotlyjs()) == 1  # inlined once, not per figure
    assert "Plotly.newPlot" in styles


def test_long_series_are_downsampled_and_the_page_stays_small(tmp_path):
    events = training(steps=5000)
    events += [
        C("queue", 10 * k, k % 1000 + (50_000 if k == 77_777 else 0)) for k in range(100_000)
    ]
    page, trace = make_report(tmp_path, events)
    size = os.path.getsize(tmp_path / "r.html") - len(plotly.offline.get_plotlyjs())
    assert size < 1_500_000
    s = _sections.build([str(trace)], [mxprof.load(trace)])
    (queue,) = [c for c in s.counters if c.name == "queue"]
    assert queue.samples == 100_000 and len(queue.values) <= _series.POINTS + 2
    assert max(queue.values) == 50_000 + 777  # the one spike survives
    assert s.steps.count == 5000 and len(s.steps.index) == 1000 and s.steps.group == 5
    assert s.steps.outliers[0] == (6, 26_000_000)  # still named, though its bar is a mean


def test_downsample_keeps_extremes_and_ends():
    xs = list(range(10_000))
    ys = [(-1) ** k * k for k in xs]
    dx, dy = _series.downsample(xs, ys, limit=100)
    assert len(dx) <= 102 and dx[0] == 0 and dx[-1] == 9_999
    assert max(dy) == max(ys) and min(dy) == min(ys)
    assert dx == sorted(dx)
    assert _series.downsample([1, 2], [3, 4]) == ([1, 2], [3, 4])


def test_only_counters_still_makes_a_page(tmp_path):
    page, _ = make_report(tmp_path, [C("loss", t, 10 - t) for t in range(10)])
    text = (tmp_path / "r.html").read_text()
    assert "The input holds no ranges" in text and "No steps" in text
    assert "counter-0" in page.ids() and page.rows == []


def bad_inputs(tmp_path):
    (tmp_path / "notes.txt").write_text("hello, not a trace\n")
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    (tmp_path / "blank.json").write_text("")
    return {
        "missing.json": (TraceReadError, "cannot read"),
        "notes.txt": (TraceFormatError, "not JSON"),
        "empty.json": (TraceFormatError, "holds no events"),
        "blank.json": (TraceFormatError, "empty"),
    }


def test_bad_inputs_raise_naming_the_file_and_write_nothing(tmp_path):
    for name, (error, words) in bad_inputs(tmp_path).items():
        with pytest.raises(error, match=words) as info:
            mxprof.report.report(tmp_path / name, tmp_path / "r.html")
        assert name in str(info.value)
        assert not (tmp_path / "r.html").exists()
        proc = _testing.cli("report", tmp_path / name, "-o", tmp_path / "r.html", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("mxprof report: ") and name in proc.stderr
        assert not (tmp_path / "r.html").exists()


def test_unwritable_outputs_fail_before_reading_and_leave_nothing(tmp_path, monkeypatch):
    trace = write(tmp_path / "t.json", training())
    cases = {
        tmp_path / "no-such-dir" / "r.html": "no such directory",
        tmp_path: "is a directory",
    }
    for output, words in cases.items():
        with pytest.raises(OutputError, match=words) as info:
            mxprof.report.report(trace, output)
        assert info.value.filename == str(output)
        proc = _testing.cli("report", trace, "-o", output, cwd=tmp_path)
        assert proc.returncode == 2 and str(output) in proc.stderr, proc.stderr
    # A failure while the page is written leaves the old page whole and no temporary file.
    (tmp_path / "r.html").write_text("old page")

    def broken(*args):
        raise MemoryError("out of memory while rendering")

    monkeypatch.setattr(mxprof.report, "page", broken)
    with pytest.raises(MemoryError):
        mxprof.report.report(trace, tmp_path / "r.html")
    assert (tmp_path / "r.html").read_text() == "old page"
    assert sorted(os.listdir(tmp_path)) == ["r.html", "t.json"]


def test_usage_errors_exit_2(tmp_path):
    trace = write(tmp_path / "t.json", training())
    # (No -o is no usage error: the page goes beside the trace, tests/test_exit_status.py.)
    proc = _testing.cli("report", "-o", tmp_path / "r.html", cwd=tmp_path)
    assert proc.returncode == 2 and "usage: mxprof report" in proc.stderr
    proc = _testing.cli("report", trace, "-o", tmp_path / "r.html", cwd=tmp_path)
    assert proc.returncode == 0 and "written to" in proc.stderr
    assert (tmp_path / "r.html").stat().st_size > 1_000_000


def test_hints_come_first_with_their_evidence(tmp_path):
    _, trace = make_report(tmp_path, training())
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    hints = find_hints([mxprof.load(trace)])
    assert {h.rule for h in hints} >= {"data-loading", "memory-growth"}
    places = [text.index(_html.esc(h.title)) for h in hints]
    assert places == sorted(places)  # most severe first, as find_hints gives them
    assert text.index('id="sec-hints"') < min(places) < text.index('id="sec-summary"')
    for h in hints:
        assert _html.esc(h.suggestion) in text
        assert all(_html.esc(line) in text for line in h.evidence)


def test_baseline_puts_the_diff_in_the_page(tmp_path):
    base = write(tmp_path / "base.json", training(slow=99))
    new = write(tmp_path / "new.json", training() + [X("extra", 0, 10)])
    mxprof.report.report(new, tmp_path / "r.html", baseline=base)
    text = (tmp_path / "r.html").read_text()
    result = diff(str(base), str(new))
    assert result.only_new == ["extra"]
    assert text.index('id="sec-diff"') < text.index('id="sec-summary"')
    assert "<code>extra</code>" in text
    table = _html.esc(result.to_table())
    assert all(line in text for line in table.splitlines() if line.strip())


@pytest.mark.slow
def test_benchmark_quick_mode(tmp_path):
    stdout, doc = _bench.quick("report.py", tmp_path)
    assert doc["events"] > 0 and doc["html_bytes"] > 0
    assert "size" in stdout and "build" in stdout


def test_the_summary_shows_the_config_that_produced_the_trace(tmp_path):
    trace = tmp_path / "rec.json"
    _testing.start(trace, max_events=123_456, profile_memory=True)
    with mxprof.Domain("d").new_task("t"):
        pass
    _testing.finish(trace)
    s = _sections.build([str(trace)], [mxprof.load(trace)])
    assert s.config["max_events"] == {str(trace): 123_456}
    assert s.config["profile_memory"] == {str(trace): True}
    assert s.config["filename"] == {str(trace): str(trace)}
    page = _html.page(s, "", "")
    assert "<td>max_events</td><td>123456</td>" in page.replace(" ", "")


# ---- flame graphs of stack samples ----


def sampled(samples, ranges):
    """A Chrome JSON trace with stack samples as mxprof writes them: frames, stacks and
    ranges defined by metadata, each sample an instant (ts µs, stack, range or None)."""
    meta = lambda what, **args: {"name": what, "ph": "M", "pid": 1, "tid": 0, "args": args}  # noqa: E731
    frames, nodes, events = {}, {}, []
    for function in ("main", "train", "forward", "load", "wait"):
        frames[function] = len(frames) + 1
        events.append(meta("mxprof_frame", id=frames[function], function=function,
                           file=f"{function}.py", line=len(frames)))  # fmt: skip
    for k, (name, cat, ts, dur) in enumerate(ranges):
        events.append(X(name, ts, dur, cat=cat))
        events.append(meta("mxprof_range", id=k, name=name, cat=cat))
    for ts, stack, rid in samples:
        parent = 0
        for depth in range(len(stack)):
            path = tuple(stack[: depth + 1])
            if path not in nodes:
                nodes[path] = len(nodes) + 1
                events.append(meta("mxprof_stack", id=nodes[path], parent=parent,
                                   frame=frames[stack[depth]]))  # fmt: skip
            parent = nodes[path]
        args = {"stack": parent} if rid is None else {"stack": parent, "range": rid}
        events.append({"name": stack[-1], "cat": "mxprof.sample", "ph": "i", "s": "t",
                       "ts": ts, "pid": 1, "tid": 1, "args": args})  # fmt: skip
    return events


def flame_paths(flames, tree):
    """A flame graph of the page's data as {call path: samples}."""
    paths = []
    for f, p in zip(tree["frame"], tree["parent"]):
        name = flames["frames"][f][0]
        paths.append((*paths[p], name) if p >= 0 else (name,))
    assert len(set(paths)) == len(paths)
    return dict(zip(paths, tree["value"]))


def page_flames(page):
    return json.loads(next(s for s in page.scripts if s.startswith('{"frames"')))


def test_flame_graphs_hold_the_samples_of_the_program_and_of_each_range(tmp_path):
    ranges = [("phase_a", "d", 0, 1000), ("phase_b", "d", 1000, 1000)]
    samples = (
        [(10 + i, ["main", "train", "forward"], 0) for i in range(6)]
        + [(20 + i, ["main", "train", "load"], 0) for i in range(3)]
        + [(1010 + i, ["main", "load", "wait"], 1) for i in range(4)]
        + [(1020, ["main", "load"], 1)]
        + [(3000 + i, ["main"], None) for i in range(2)]  # in no range
    )
    page, _ = make_report(tmp_path, sampled(samples, ranges))
    assert {"sec-samples", "flame-program", "flame-range"} <= page.ids()
    flames = page_flames(page)
    assert flames["program"]["total"] == 16
    assert flame_paths(flames, flames["program"]) == {
        ("main",): 16,
        ("main", "train"): 9,
        ("main", "train", "forward"): 6,
        ("main", "train", "load"): 3,
        ("main", "load"): 5,
        ("main", "load", "wait"): 4,
    }
    assert ["main", "main.py", 1] in flames["frames"]
    # Per range, keyed by the ranges table's row (the one the page's script shows).
    row = {cells[0][1]: str(i) for i, cells in enumerate(page.rows)}
    a, b = flames["ranges"][row["phase_a"]], flames["ranges"][row["phase_b"]]
    assert (a["total"], b["total"]) == (9, 5)
    assert flame_paths(flames, a) == {
        ("main",): 9, ("main", "train"): 9, ("main", "train", "forward"): 6,
        ("main", "train", "load"): 3,
    }  # fmt: skip
    assert flame_paths(flames, b) == {("main",): 5, ("main", "load"): 5,
                                      ("main", "load", "wait"): 4}  # fmt: skip
    # The page's script draws them as plotly icicles, root at the bottom.
    script = page.scripts[-1]
    assert 'type: "icicle"' in script and 'flip: "y"' in script
    assert "window.mxprofFlame(row.getAttribute" in script


def test_the_profilers_own_ranges_are_not_shown_and_their_samples_are_in_no_range(tmp_path):
    # An old `mxprof run` wrapper around everything, the writer's flush, and the user's phase.
    ranges = [("run app.py", "mxprof", 0, 5000), ("flush", "mxprof", 100, 400),
              ("phase", "d", 1000, 1000)]  # fmt: skip
    samples = (
        [(150 + i, ["main", "wait"], 1) for i in range(3)]  # in the flush
        + [(1010 + i, ["main", "train", "forward"], 2) for i in range(4)]  # in the phase
        + [(3000 + i, ["main", "load"], 0) for i in range(2)]  # in the wrapper only
    )
    page, trace = make_report(tmp_path, sampled(samples, ranges))
    assert list(page.table()) == ["phase"]
    flames = page_flames(page)
    assert flames["program"]["total"] == 9  # every sample is the program's
    (key,) = flames["ranges"]  # one range flame graph: the phase's
    assert flames["ranges"][key]["total"] == 4
    assert flame_paths(flames, flames["ranges"][key]) == {
        ("main",): 4, ("main", "train"): 4, ("main", "train", "forward"): 4
    }  # fmt: skip
    s = _sections.build([str(trace)], [mxprof.load(trace)])
    assert [r.name for r in s.rows] == ["phase"] and set(s.processes[0].totals) == {"phase"}
    assert {e.name for e in mxprof.load(trace)} >= {"flush", "run app.py"}  # the file keeps them


def test_flame_graphs_keep_the_heaviest_nodes_a_parent_before_its_children(monkeypatch):
    monkeypatch.setattr(_sections, "FLAME_NODES", 4)
    frame = lambda name: (name, "f.py", 1)  # noqa: E731
    stacks = {
        (frame("main"), frame("a"), frame("a1")): 5,
        (frame("main"), frame("a"), frame("a2")): 1,
        (frame("main"), frame("b"), frame("b1")): 3,
        (frame("main"), frame("c")): 2,
    }
    index = {}
    f = _sections._flame(stacks, 4, index)
    names = {v: k[0] for k, v in index.items()}
    kept = [(names[fr], p, v) for fr, p, v in zip(f.frame, f.parent, f.value)]
    assert kept == [("main", -1, 11), ("a", 0, 6), ("a1", 1, 5), ("b", 0, 3)]
    assert (f.total, f.dropped) == (11, 3)


def test_no_samples_the_section_says_so(tmp_path):
    page, _ = make_report(tmp_path, training())
    assert "sec-samples" in page.ids() and "flame-program" not in page.ids()
    assert not any(s.startswith('{"frames"') for s in page.scripts)
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "No stack samples in the input" in text


def spin_in_phase(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_recorded_trace_with_samples_has_its_functions_in_the_flame_graphs(tmp_path):
    path = tmp_path / "t.json"
    mxprof.set_config(filename=str(path), sample_rate=1000)
    mxprof.set_state("run")
    with mxprof.Domain("d").new_task("phase"):
        spin_in_phase(0.2)
    mxprof.set_state("stop")
    mxprof.dump()
    trace = mxprof.load(path)
    counts = trace.samples.counts()
    assert counts  # the sampler ran
    out = mxprof.report.report(path, tmp_path / "r.html")
    with open(out, encoding="utf-8") as f:
        page = Page(f.read())
    flames = page_flames(page)
    assert flames["program"]["total"] == sum(counts.values())
    row = next(str(i) for i, cells in enumerate(page.rows) if cells[0][1] == "phase")
    phase = flame_paths(flames, flames["ranges"][row])
    in_phase = sum(n for (key, _), n in counts.items() if key == ("d", "phase"))
    assert flames["ranges"][row]["total"] == in_phase > 0
    spinning = sum(  # inclusive: spin_in_phase on the stack
        n for (key, stack), n in counts.items()
        if key == ("d", "phase") and any(f[0] == "spin_in_phase" for f in stack)
    )  # fmt: skip
    assert spinning > 0
    assert max(v for p, v in phase.items() if p[-1] == "spin_in_phase") == spinning


def test_the_report_comes_with_the_default_install():
    """plotly is a core dependency: `pip install mxprof` writes the page, no extra needed."""
    text = pathlib.Path(ROOT, "pyproject.toml").read_text(encoding="utf-8")
    core = re.search(r"^dependencies = \[(.*?)\]", text, re.M | re.S).group(1)
    assert '"plotly>=5"' in core
    assert 'report = ["plotly>=5"]' in text  # the old extra still installs
    # No "needs plotly" path is left: nothing to catch, nothing to tell the user.
    assert not hasattr(mxprof.report, "ReportUnavailable")
    cli = pathlib.Path(ROOT, "mxprof", "cli.py").read_text(encoding="utf-8")
    assert "plotly" not in cli


def figure(text, div_id):
    """The data of the figure plotly.io drew into div_id, from the page's text."""
    call = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*', text)
    data, _ = json.JSONDecoder().raw_decode(text, call.end())
    return data


def test_single_value_plots_draw(tmp_path):
    """One step, one loss sample, one memory point: each still draws (a marker,
    a histogram bin with a width) rather than a line through one point."""
    page, trace = make_report(tmp_path, training(steps=1))
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    s = _sections.build([str(trace)], [mxprof.load(trace)])
    (loss,) = s.counters
    assert (loss.samples, loss.values) == (1, [100.0])
    drawn = figure(text, "counter-0")
    assert drawn[0]["mode"] == "markers" and drawn[0]["y"] == [100.0]
    assert drawn[0]["x"] == [loss.times[0] / 1e9]
    (device,) = figure(text, "memory-devices")
    assert device["mode"] == "markers" and device["y"] == [float(1 << 20)]
    scopes = figure(text, "memory-scopes")
    assert sorted(p["y"][0] for p in scopes) == [1 << 19, 1 << 19]
    assert all(p["mode"] == "markers" for p in scopes)
    # The one step's duration histogram: one bin around its 8 ms, with a width.
    step = next(i for i, r in enumerate(s.rows) if r.name == "step")
    h = s.histograms[step]
    assert h.counts == [1] and h.edges[0] < 8_000_000 < h.edges[1]
    assert h.edges == [8_000_000 * 0.95, 8_000_000 * 1.05]
    # Longer series stay lines.
    two = _sections.build([str(trace)], [mxprof.load(make_report(tmp_path, training(2))[1])])
    assert _html._line(two.counters[0])["mode"] == "lines"


def recorded_training(path, steps):
    """A trace as mxprof's core writes it: steps as frames holding 8 short ranges
    (two levels deep) and a counter sample: 10 events a step, and the counter's
    first value."""
    _testing.start(path)
    train = mxprof.Domain("train")
    step = train.new_frame("step")
    loss = train.new_counter("loss", 0)
    outer, inner = train.new_task("forward"), train.new_task("layer")
    for i in range(steps):
        with step:
            for _ in range(2):
                with outer:
                    for _ in range(3):
                        with inner:
                            pass
            loss.set_value(i)
    _testing.finish(path)


def test_the_loaded_events_cost_few_bytes_each(tmp_path):
    """Item 8 of issue 22: what the report holds per event, measured by tracemalloc
    (deterministic: no timing). Every event's phase is one shared string (msgspec
    made one per event: 50 bytes), a short range's length one int per value, and the
    nesting behind key_averages is two int64 arrays (lists of ints took up to 72
    bytes an event)."""
    import tracemalloc
    from array import array

    from mxprof.trace.model import read_events

    path = tmp_path / "t.json"
    recorded_training(path, 20_000)
    tracemalloc.start()
    try:
        trace = read_events(path)
        rows = trace.key_averages()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(trace) == 200_001 and {r.name: r.count for r in rows}["layer"] == 120_000
    assert len({id(e.ph) for e in trace}) == 2  # "X" and "C", each one string
    parents, selfs = trace._parts()
    assert isinstance(parents, array) and isinstance(selfs, array)
    # An Event is 80 bytes, its ts 32, its place in the list 8 (its dur is shared);
    # the durations behind the statistics 8, the nesting 16, the args of steps and
    # counters (a fifth of these events) 35: about 187. Before: 278 (a ph string
    # and a dur int per event, the nesting in lists of ints).
    assert held / len(trace) < 200, held / len(trace)


def test_samples_alone_make_a_page(tmp_path):
    """An uninstrumented script under `mxprof run` writes samples and no ranges:
    its page is the flame graph, not an error that the trace holds no events."""
    samples = [(10 + i, ["main", "train", "forward"], None) for i in range(5)]
    samples += [(20 + i, ["main", "wait"], None) for i in range(2)]
    page, trace = make_report(tmp_path, sampled(samples, []))
    assert len(mxprof.load(trace)) == 0
    flames = page_flames(page)
    assert flame_paths(flames, flames["program"]) == {
        ("main",): 7, ("main", "train"): 5, ("main", "train", "forward"): 5,
        ("main", "wait"): 2,
    }  # fmt: skip
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "The input holds no ranges" in text and "No steps" in text


def test_the_summary_shows_only_the_tallies_that_are_not_zero(tmp_path):
    """The first screen is for the run: zero tallies are one box, the others each one."""
    facts = re.compile(r'<div class="v">([^<]*)</div><div class="k">([^<]*)</div>')
    page, _ = make_report(tmp_path, training(), otherData={"dropped_events": 0, "cut_ranges": 0})
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    shown = {k: v for v, k in facts.findall(text)}
    assert shown["drops and misuse tallies: every one zero"] == "0"
    assert "cut ranges" not in shown and "unpaired begins/ends (left out)" not in shown
    make_report(tmp_path, training(), otherData={"dropped_events": 4, "cut_ranges": 0})
    shown = {k: v for v, k in facts.findall((tmp_path / "r.html").read_text(encoding="utf-8"))}
    assert shown["dropped events"] == "4" and "cut ranges" not in shown
    assert "drops and misuse tallies: every one zero" not in shown
