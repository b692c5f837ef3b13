"""The input rule (hints' ``data-loading``) from everything a trace holds: an
input-bound loop is found with the wait in a range, with the wait in no range
while a loader thread is busy, and from stack samples alone; a fast loader is
not.  Then bad input: every section and hint says what is missing.  Traces
are JSON files in the form mxprof writes, built here (times in ms)."""

import json

import pytest

import mxprof
from mxprof.report.hints import find_hints, not_checked
from mxprof.trace import processes

PID = 100
MAIN, LOADER = 100, 101  # the main thread's tid is the pid, as on Linux
QUEUE = ("Queue.get", "/usr/lib/python3.12/queue.py", 171)
COND = ("Condition.wait", "/usr/lib/python3.12/threading.py", 355)
WAITING = ("<waiting>", "", 0)
LOOP = ("main", "/app/train.py", 10)
COMPUTE = ("forward", "/app/train.py", 30)
PRODUCE = ("produce", "/app/data.py", 5)


def X(name, ts, dur, *, cat="train", tid=MAIN, args=None):
    return {"name": name, "cat": cat, "ph": "X", "ts": ts * 1000, "dur": dur * 1000,
            "pid": PID, "tid": tid, "args": args or {}}  # fmt: skip


def frame(index, ts, dur):
    return X("step", ts, dur, cat="train,frame", args={"frame": index})


def meta(what, tid=0, **args):
    return {"name": what, "ph": "M", "pid": PID, "tid": tid, "args": args}


class Samples:
    """Stack samples as mxprof's JSON writer records them."""

    def __init__(self):
        self.frames, self.nodes, self.events = {}, {}, []

    def add(self, ts, tid, stack):
        parent = 0
        for depth, fr in enumerate(stack):
            if fr not in self.frames:
                self.frames[fr] = len(self.frames) + 1
                self.events.append(meta("mxprof_frame", id=self.frames[fr], function=fr[0],
                                        file=fr[1], line=fr[2]))  # fmt: skip
            path = tuple(stack[: depth + 1])
            if path not in self.nodes:
                self.nodes[path] = len(self.nodes) + 1
                self.events.append(meta("mxprof_stack", id=self.nodes[path], parent=parent,
                                        frame=self.frames[fr]))  # fmt: skip
            parent = self.nodes[path]
        self.events.append({"name": stack[-1][0], "cat": "mxprof.sample", "ph": "i", "s": "t",
                            "ts": ts * 1000, "pid": PID, "tid": tid,
                            "args": {"stack": parent}})  # fmt: skip


def save(tmp_path, events, name="t.json"):
    names = [meta("process_name", name="python"), meta("thread_name", MAIN, name="MainThread"),
             meta("thread_name", LOADER, name="data-loader")]  # fmt: skip
    doc = {"displayTimeUnit": "ms", "baseTimeNanoseconds": 1_795_000_000_000_000_000,
           "traceEvents": names + events,
           "otherData": {"mxprof_version": mxprof.__version__, "pid": PID}}  # fmt: skip
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return mxprof.load(path)


def loop(wait_ms, *, wait_range=None, steps=10, compute=4):
    """Steps of wait + compute on the main thread; the loader makes each batch
    in 'load_batch' on its own thread, ending as the main thread's wait ends."""
    events, t = [], 0
    for k in range(steps):
        d = wait_ms + compute
        events.append(frame(k, t, d))
        if wait_range:
            events.append(X(wait_range, t, wait_ms))
        events.append(X("forward", t + wait_ms, compute))
        events.append(X("load_batch", t, wait_ms + 1 if wait_ms else 1, cat="data", tid=LOADER))
        t += d
    return events


def rule(found, name="data-loading"):
    got = [h for h in found if h.rule == name]
    return got[0] if got else None


def test_an_input_bound_loop_with_the_wait_in_a_range(tmp_path):
    hint = rule(find_hints([save(tmp_path, loop(12, wait_range="get_batch"))]))
    assert (hint.severity, hint.title) == ("high", "Data loading takes 75 % of step time")
    assert "get_batch" in hint.subjects


def test_an_input_bound_loop_with_the_wait_in_no_range(tmp_path):
    """The issue's loop: queue.get outside any range, a slow loader in
    'load_batch' meanwhile: 75 % of each step in no range, the loader busy."""
    trace = save(tmp_path, loop(12))
    (p,) = processes.processes(trace)
    assert list(p.steps.in_no_range) == [12 * 1_000_000] * 10
    hint = rule(find_hints([trace]))
    assert hint.title == "The loop waits for its input 75 % of step time"
    assert hint.severity == "high"
    assert hint.evidence[0] == (
        "thread 'MainThread' (tid 100) is in no range for 120.000ms of 160.000ms step time "
        "(75 %); thread 'data-loader' (tid 101) is loading during 120.000ms of it (75 % of "
        "step time): the loop waits for it"
    )
    assert hint.subjects == ("load_batch",)


def test_a_fast_loader_is_no_input_hint(tmp_path):
    """The loader is done before the loop asks: 0.2 ms of each 4.2 ms step in
    no range, and the loader works while the loop computes."""
    events, t = [], 0
    for k in range(10):
        events += [frame(k, t, 4.2), X("forward", t + 0.2, 4),
                   X("load_batch", t + 1, 1, cat="data", tid=LOADER)]  # fmt: skip
        t += 4.2
    assert rule(find_hints([save(tmp_path, events)])) is None


def sampled_run(wait_share, n=100):
    """No range at all: the main thread's samples, wait_share of them in
    Queue.get (blocked under Condition.wait), the loader's all producing."""
    s = Samples()
    waits = round(n * wait_share)
    for k in range(n):
        stack = [LOOP, QUEUE, COND, WAITING] if k % n < waits else [LOOP, COMPUTE]
        s.add(k, MAIN, stack)
        s.add(k, LOADER, [PRODUCE])
    return s.events


def test_an_input_bound_loop_from_samples_alone(tmp_path):
    """48 % of the main thread's samples in Queue.get: the input hint, with
    the waiting frames and the producer (no range in the trace)."""
    hint = rule(find_hints([save(tmp_path, sampled_run(0.48))]))
    assert hint.title == "The loop waits for its input 48 % of wall time"
    assert hint.severity == "high"
    assert hint.evidence[0].startswith(
        "48 of 100 stack samples of thread 'MainThread' (tid 100) (48 %) are in a call "
        "waiting for input"
    )
    assert hint.evidence[1] == "  Queue.get > <waiting>: 48 samples"
    assert hint.evidence[2] == (
        "  producer: thread 'data-loader' (tid 101) was running in 100 of its 100 samples "
        "then (100 %), most in produce (data.py:5)"
    )
    assert hint.subjects == ("Queue.get",)


def test_a_short_wait_in_samples_is_no_input_hint(tmp_path):
    assert rule(find_hints([save(tmp_path, sampled_run(0.1))])) is None
    few = sampled_run(0.9, n=10)  # 10 samples: too few to tell
    assert rule(find_hints([save(tmp_path, few, "few.json")])) is None


def test_samples_inside_steps_count_against_step_time(tmp_path):
    s = Samples()
    for k in range(100):
        s.add(k, MAIN, [LOOP, QUEUE, COND, WAITING] if k % 2 else [LOOP, COMPUTE])
    events = [frame(k, 10 * k, 10) for k in range(10)] + s.events
    hint = rule(find_hints([save(tmp_path, events)]))
    assert hint.title == "The loop waits for its input 50 % of step time"


# ---- bad input: every section and hint says what is missing ----


@pytest.fixture
def page(tmp_path):
    pytest.importorskip("plotly")
    import mxprof.report

    def build(events, name="t.json"):
        save(tmp_path, events, name)
        out = tmp_path / (name + ".html")
        mxprof.report.report([tmp_path / name], out)
        return out.read_text()

    return build


def test_only_counters(page, tmp_path):
    counters = [{"name": "q", "cat": "c", "ph": "C", "ts": k, "pid": PID, "tid": MAIN,
                 "args": {"q": k}} for k in range(5)]  # fmt: skip
    text = page(counters)
    assert "No steps: no frame" in text
    assert "The input holds no ranges" in text
    assert "No stack samples in the input" in text
    assert "One process in the input: nothing to compare" in text
    assert find_hints([mxprof.load(tmp_path / "t.json")]) == []
    # No hints is not "nothing to find": the page says what could not be checked.
    assert "Not checked:<ul><li>no ranges: no rule about time could look at the run" in text
    assert "<li>no stack samples: waits outside ranges judged" in text


def test_what_the_hints_could_not_check(tmp_path):
    sampled = save(tmp_path, sampled_run(0.1))
    assert not_checked([sampled]) == [
        "no ranges: no rule about time could look at the run",
        "one process with ranges: no straggler to compare",
        "no memory counters (profile_memory): memory-peak and memory-growth not run",
        "no process memory samples (memory_steps): memory-leak not run",
    ]
    stepped = save(tmp_path, loop(1), "steps.json")
    assert not_checked([stepped])[0].startswith("no stack samples")
    assert not any(m.startswith("no steps") for m in not_checked([stepped]))


def test_one_step(page, tmp_path):
    text = page([frame(0, 0, 10), X("forward", 1, 5)])
    assert "1 steps of <code>step</code>" in text
    assert "One step: no median to compare it with, so no outliers." in text
    assert "5.000ms inside the steps" in text
    assert rule(find_hints([mxprof.load(tmp_path / "t.json")]), "step-variance") is None


def test_a_process_with_no_events(page, tmp_path):
    """A pid named in the metadata that recorded nothing: listed, wall 0,
    no division by zero anywhere."""
    events = [frame(0, 0, 10), {"name": "process_name", "ph": "M", "pid": 999, "tid": 0,
                                "args": {"name": "idle"}}]  # fmt: skip
    text = page(events)
    procs = processes.processes(mxprof.load(tmp_path / "t.json"))
    assert [(p.label, p.wall, p.events) for p in procs] == [("pid 100", 10_000_000, 1),
                                                          ("pid 999", 0, 0)]  # fmt: skip
    assert "<td>pid 999</td><td>idle</td>" in text
    assert rule(find_hints([mxprof.load(tmp_path / "t.json")]), "idle-gap") is None


def test_samples_name_what_the_time_in_no_range_of_a_slow_step_was(tmp_path):
    """Step 6 takes 30 ms, 22 ms of it in no range: the step-variance hint
    says so and what the main thread's samples were doing then."""
    s = Samples()
    events, t = [], 0
    for k in range(10):
        d = 30 if k == 6 else 10
        events += [frame(k, t, d), X("forward", t, 8)]
        if k == 6:
            for i in range(20):
                s.add(t + 9 + i, MAIN, [LOOP, ("collect", "/usr/lib/python3.12/gc.py", 1)])
        t += d
    hint = rule(find_hints([save(tmp_path, events + s.events)]), "step-variance")
    assert hint.evidence[2:] == (
        "  step 6: time in no range inside the step took 22.000ms against a median of "
        "2.000ms per step (+20.000ms)",
        "    its 20 stack samples: collect (gc.py:1) 100 %",
    )
