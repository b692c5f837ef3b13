"""A flight recorder snapshot in the report: the trigger at the top and on the plots.

(A real job's merged snapshot in the report: tests/test_flight_job.py.)
"""

import datetime
import json
import os
import pathlib
import re

from test_report import Page, X, training, write

import mxprof
import mxprof.report
from mxprof.report import _sections
from mxprof.trace.snapshot import trigger_of

# Step 6 of training() is the slow one: 8.1 ms steps before it, so it starts at
# 6 x 8.1 ms and lasts 26 ms; the trigger falls 10 ms into it.
TRIGGER_US = 6 * 8_100 + 10_000


def job_snapshot(tmp_path, **changes):
    info = {
        "reason": "watchdog",
        "job": True,
        "triggered_by": {"process": "worker 1 (h, pid 11)", "role": "worker", "rank": 1},
        "trigger_us": TRIGGER_US,
        "trigger_wall_ns": 1_795_000_000_123_000_000,
        "window_seconds": 30.0,
        "after_seconds": 0.0,
        "start_us": 0.0,
        "end_us": TRIGGER_US,
        "requested_start_us": TRIGGER_US - 30e6,
        "shortened_by_cap": True,
        "suppressed_triggers": 2,
        "ranks": [
            {"process": "worker 0 (h, pid 10)", "range": "allreduce", "open_for_seconds": 31.5},
            {"process": "worker 1 (h, pid 11)", "range": "forward", "open_for_seconds": 32.25},
        ],
        "missing": [
            {
                "process": "worker 3 (h, pid 13)",
                "role": "worker",
                "rank": 3,
                "why": "no answer within 3 s (frozen, hung or overloaded)",
                "failed": True,
                "last_file": None,
            },
        ],  # fmt: skip
        "stuck": [
            {
                "process": "worker 1 (h, pid 11)",
                "range": "forward",
                "open_for_seconds": 32.25,
                "others_in": "allreduce",
            },
        ],  # fmt: skip
        "details": {"thread": "MainThread", "stack": ["train.py:42 in step"]},
        **changes,
    }
    return write(tmp_path / "job.flight1-job_watchdog.json", training(),
                 otherData={"flight_recorder": info})  # fmt: skip


def visible_text(html):
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_trigger_is_at_the_top_of_the_page_with_its_facts(tmp_path):
    path = job_snapshot(tmp_path)
    out = mxprof.report.report(path, tmp_path / "r.html")
    html = pathlib.Path(out).read_text(encoding="utf-8")
    text = visible_text(html)
    assert html.index('id="sec-trigger"') < html.index('id="sec-hints"')  # at the top
    assert "This is a job-wide flight recorder snapshot" in text
    assert "Trigger: watchdog on worker 1 (h, pid 11)" in text
    assert f"at {(TRIGGER_US - 0) / 1e6:.3f} s from the start" in text
    stamp = datetime.datetime.fromtimestamp(1_795_000_000.123, datetime.timezone.utc)
    assert f"({stamp:%Y-%m-%d %H:%M:%S}.123 UTC)" in text  # the wall-clock time
    assert "in step 6" in text
    assert "Window: 30 s before the trigger, shortened by the byte cap" in text
    assert "0.0586 s kept" in text  # start_us 0 to the trigger
    assert "2 earlier trigger(s) were held back" in text
    assert "worker 3 (h, pid 13): no answer within 3 s" in text
    assert (
        "Stands out: worker 1 (h, pid 11) is in forward for 32.2 s, while the others are in "
        "allreduce" in text
    )
    assert "train.py:42 in step" in text  # the details, folded
    assert "dashed red line on the step chart (step 6), the counter plots, the memory plots" in text


def test_the_trigger_is_a_line_on_the_step_chart_and_the_time_plots(tmp_path):
    path = job_snapshot(tmp_path)
    s = _sections.build([str(path)], [mxprof.load(path)])
    (t,) = s.triggers
    assert t.step == 6 and t.at_ns == TRIGGER_US * 1000  # the page starts at the first step
    page = Page(_html_page(s))
    layouts = {}
    for script in page.scripts:
        m = re.search(r'Plotly\.newPlot\(\s*"([^"]+)",\s*(\[.*\]),\s*(\{.*\}),\s*\{"displaylogo"',
                      script, re.S)  # fmt: skip
        if m:
            layouts[m.group(1)] = json.loads(m.group(3))
    steps_line = [sh for sh in layouts["steps"]["shapes"] if sh["type"] == "line"]
    assert [(sh["x0"], sh["x1"]) for sh in steps_line] == [(6, 6)]
    for plot in ("counter-0", "memory-devices", "memory-scopes"):
        (line,) = layouts[plot]["shapes"]
        assert line["x0"] == line["x1"] == TRIGGER_US / 1e6
    assert layouts["steps"]["annotations"][0]["text"] == "trigger: watchdog"


def _html_page(s):
    from mxprof.report import _html

    return _html.page(s, "", "")


def test_a_snapshot_of_one_process_opens_like_any_trace(tmp_path):
    trace = tmp_path / "train.json"
    mxprof.set_config(filename=str(trace), flight_recorder=5, flight_recorder_interval=0)
    mxprof.set_state("run")
    step = mxprof.Domain("train").new_task("step")
    for _ in range(3):
        with step:
            pass
    path = mxprof.trigger("loss is NaN", details={"loss": "nan"})
    mxprof.set_state("stop")
    assert os.path.basename(path) == "train.flight1-loss_is_NaN.json"
    t = trigger_of(mxprof.load(path))
    assert (t.reason, t.by, t.job, t.shortened_by_cap) == (
        "loss is NaN", f"pid {os.getpid()}", False, False
    )  # fmt: skip
    text = visible_text(pathlib.Path(mxprof.report.report(path, tmp_path / "r.html")).read_text())
    assert "This is a flight recorder snapshot" in text and "job-wide" not in text
    assert f"Trigger: loss is NaN on pid {os.getpid()}" in text
    assert "Window: 5 s before the trigger, not shortened" in text
    assert "Missing processes" not in text  # one process: no job to miss any of


def test_a_malformed_trigger_is_no_trigger_and_wrong_fields_are_left_out(tmp_path):
    path = job_snapshot(tmp_path, trigger_us="soon")
    assert trigger_of(mxprof.load(path)) is None
    assert (
        "sec-trigger"
        not in pathlib.Path(mxprof.report.report(path, tmp_path / "r.html")).read_text()
    )
    path = job_snapshot(
        tmp_path, missing=[5, {"process": 3}], ranks="x", stuck=[{}], window_seconds=float("nan")
    )  # JSON has no NaN: written as NaN by json.dumps, read back as nan
    t = trigger_of(mxprof.load(path))
    assert (t.missing, t.ranks, t.stuck, t.window_seconds) == ([], [], [], None)
    assert t.reason == "watchdog" and t.at_ns == TRIGGER_US * 1000
    assert trigger_of(mxprof.load(write(tmp_path / "plain.json", training()))) is None


def test_the_hints_say_it_is_a_snapshot_and_who_stands_out(tmp_path):
    from mxprof.report.hints import find_hints

    (h,) = [
        h for h in find_hints(mxprof.load(job_snapshot(tmp_path))) if h.rule == "flight-recorder"
    ]
    assert (h.severity, h.title) == (
        "high",
        "This is a job-wide flight recorder snapshot of 'watchdog'",
    )
    assert h.evidence == (
        f"triggered on worker 1 (h, pid 11) at {TRIGGER_US / 1e6:.3f} s of the file's time axis",
        "window: 30 s before the trigger, shortened by the byte cap",
        "stands out: worker 1 (h, pid 11) is in forward for 32.2 s, while the others are in "
        "allreduce",
        "missing: worker 3 (h, pid 13): no answer within 3 s (frozen, hung or overloaded)",
    )
    assert h.subjects == ("worker 1 (h, pid 11)",)
    (h,) = [
        h
        for h in find_hints(mxprof.load(job_snapshot(tmp_path, stuck=[])))
        if h.rule == "flight-recorder"
    ]
    assert h.severity == "medium"  # a process is missing
    plain = write(tmp_path / "plain.json", training())
    assert not [h for h in find_hints(mxprof.load(plain)) if h.rule == "flight-recorder"]


def test_read_window_finds_each_threads_innermost_range_open_at_the_trigger(tmp_path):
    from mxprof.trace.snapshot import headline, read_window

    cut = {"cut_short": True}
    events = [
        {"name": "thread_name", "ph": "M", "pid": 7, "tid": 1, "args": {"name": "thread 7"}},
        {"name": "thread_name", "ph": "M", "pid": 7, "tid": 2, "args": {"name": "loader"}},
        X("epoch", 0, 1000, pid=7, tid=1, **cut),
        X("allreduce", 100, 900, pid=7, tid=1, **cut),  # innermost at the trigger
        X("done", 150, 50, pid=7, tid=1),  # ended before it: not open
        X("after", 600, 400, pid=7, tid=1, **cut),  # begun after the trigger
        X("wait_queue", 50, 950, pid=7, tid=2, **cut),
    ]
    info = {"reason": "watchdog", "trigger_us": 500}
    path = write(tmp_path / "w.json", events, otherData={"flight_recorder": info})
    own, opened = read_window(str(path))
    assert own == info
    assert opened == [
        {"thread": "loader", "tid": 2, "range": "wait_queue", "category": "train",
         "open_for_seconds": 0.00045},
        {"thread": "thread 7", "tid": 1, "range": "allreduce", "category": "train",
         "open_for_seconds": 0.0004},
    ]  # fmt: skip
    assert headline(opened, 7)["range"] == "allreduce"  # the main thread's, not the longest
    assert headline(opened, 8)["range"] == "wait_queue"  # no main thread: the longest
    (tmp_path / "cut.json").write_text('{"traceEvents": [{"na')
    assert read_window(str(tmp_path / "cut.json")) == ({}, [])
    assert read_window(str(tmp_path / "absent.json")) == ({}, [])
