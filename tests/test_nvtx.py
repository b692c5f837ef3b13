"""set_config(nvtx=True): recorded ranges and marks also go to NVTX.

No GPU or Nsight here: the test builds a tiny NVTX tool (tests/nvtx_tool.c,
NVTX v3's injection interface), runs a script with NVTX_INJECTION64_PATH
naming it, and compares what the tool saw with the trace mxprof wrote.
"""

import collections
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

import mxprof

HERE = os.path.dirname(os.path.abspath(__file__))
NVTX_INCLUDE = os.path.join(os.path.dirname(HERE), "native", "third_party", "nvtx3")

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, threading
    import mxprof

    trace, ids, nvtx = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    mxprof.set_config(filename=trace, nvtx=nvtx, aggregate_stats=True, continuous_dump=False)
    train, io = mxprof.Domain("train"), mxprof.Domain("io")
    step, fwd, load = train.new_task("step"), train.new_task("forward"), io.new_task("load")
    it, ckpt, evt = train.new_frame("iter"), train.new_marker("ckpt"), mxprof.Event("evt")
    a, b = train.new_task("a"), train.new_task("b")
    mxprof.set_state("run")
    for _ in range(2):
        with step:
            with load:
                pass
            with fwd:
                ckpt.mark("process")
                with evt:
                    pass
            with it:
                pass
    mxprof.pause()
    with fwd:  # not recorded: not emitted either
        ckpt.mark()
    mxprof.resume()
    a.start(); b.start(); a.stop(); b.stop()  # not innermost first

    def work():
        with step:
            ckpt.mark("thread")

    worker = threading.Thread(target=work, name="worker")
    worker.start(); worker.join()

    async def job():
        with load:
            await asyncio.sleep(0)

    async def main():
        await asyncio.gather(job(), job())

    asyncio.run(main())
    mxprof.set_state("stop")
    mxprof.dump()
    with open(ids, "w") as f:
        json.dump({"main": threading.main_thread().native_id, "worker": worker.native_id}, f)
    """
)


@pytest.fixture(scope="module")
def tool(tmp_path_factory):
    cc = (sysconfig.get_config_var("CC") or "gcc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) to build the NVTX test tool")
    if not os.path.isdir(NVTX_INCLUDE):
        pytest.skip("the NVTX headers (native/third_party/nvtx3) are not in this tree")
    so = str(tmp_path_factory.mktemp("nvtx") / "nvtx_tool.so")
    src = os.path.join(HERE, "nvtx_tool.c")
    argv = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-pthread", f"-I{NVTX_INCLUDE}"]
    subprocess.run([*argv, src, "-o", so], check=True, capture_output=True, text=True)
    return so


def run(tmp_path, tool, nvtx=True):
    """Run SCRIPT under the tool: (trace, thread ids, the tool's log lines)."""
    trace, ids, log = tmp_path / "t.json", tmp_path / "ids.json", tmp_path / "nvtx.log"
    env = dict(os.environ, NVTX_INJECTION64_PATH=tool, MXPROF_NVTX_LOG=str(log))
    # The mxprof this process imported (installed, or a built tree), never the
    # source tree's unbuilt mxprof/.
    found = os.path.dirname(os.path.dirname(os.path.abspath(mxprof.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (found, *sys.path) if p)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    argv = [sys.executable, str(script), str(trace), str(ids), "1" if nvtx else "0"]
    subprocess.run(argv, check=True, env=env, timeout=120, capture_output=True, text=True)
    lines = log.read_text().splitlines() if log.exists() else []
    entries = [line.split("\t") for line in lines]
    with open(trace) as f, open(ids) as g:
        return json.load(f), json.load(g), [(int(t), op, d, text) for t, op, d, text in entries]


def nvtx_ranges(entries, os_tid):
    """Replay one thread's pushes and pops (a stack per domain, as NVTX keeps
    them): (domain, name, depth) of every range, in push order."""
    stacks, out = collections.defaultdict(list), []
    for tid, op, domain, text in entries:
        if tid != os_tid:
            continue
        if op == "push":
            depth = sum(len(s) for s in stacks.values())
            out.append((domain, text, depth))
            stacks[domain].append(text)
        elif op == "pop":
            stacks[domain].pop()
    assert not any(stacks.values()), f"ranges left open in NVTX: {dict(stacks)}"
    return out


def trace_ranges(trace, tid, names):
    """The trace's complete events on tid named in names: (domain as NVTX
    has it, name as the test tool logs it -- a frame's index after '#' --,
    nesting depth), in start order."""
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == tid]
    xs = [e for e in xs if e["name"] in names]
    xs.sort(key=lambda e: (e["ts"], -e["dur"]))

    def depth(e):
        return sum(
            1
            for o in xs
            if o is not e and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]
        )

    def domain(cat):
        cat = cat.split(",")[0]
        return "-" if cat == "event" else cat  # Events: NVTX's default domain

    def name(e):
        return f"{e['name']}#{e['args']['frame']}" if "frame" in e.get("args", {}) else e["name"]

    return [(domain(e["cat"]), name(e), depth(e)) for e in xs]


def tid_of(trace, thread_name):
    (tid,) = {
        e["tid"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"] == thread_name
    }
    return tid


def test_ranges_marks_and_domains_match_the_trace(tmp_path, tool):
    trace, ids, entries = run(tmp_path, tool)
    main, worker = ids["main"], ids["worker"]

    # Domains created once each; every name registered once, in its domain.
    assert sorted(d for _, op, d, _ in entries if op == "domain") == ["io", "train"]
    strings = collections.Counter((d, text) for _, op, d, text in entries if op == "string")
    assert set(strings.values()) == {1}
    assert set(strings) == {
        ("train", "step"), ("io", "load"), ("train", "forward"), ("train", "ckpt"),
        ("-", "evt"), ("train", "iter"), ("train", "a"), ("train", "b"),
    }  # fmt: skip

    # Same-thread ranges: NVTX push/pop ranges with the trace's names, domains
    # and nesting (the paused range is in neither).
    synced = {"step", "load", "forward", "evt", "iter"}
    main_nvtx = [r for r in nvtx_ranges(entries, main) if r[1].split("#")[0] in synced]
    main_tid = tid_of(trace, "MainThread")
    assert main_nvtx == trace_ranges(trace, main_tid, synced)
    assert main_nvtx[:5] == [
        ("train", "step", 0), ("io", "load", 1), ("train", "forward", 1), ("-", "evt", 2),
        ("train", "iter#0", 1),  # a frame's index is its NVTX payload
    ]  # fmt: skip
    assert ("train", "iter#1", 1) in main_nvtx
    assert nvtx_ranges(entries, worker) == trace_ranges(trace, tid_of(trace, "worker"), synced)
    assert nvtx_ranges(entries, worker) == [("train", "step", 0)]

    # Marks: the recorded markers, on their threads.
    marks = [(t, d, text) for t, op, d, text in entries if op == "mark"]
    assert marks == [(main, "train", "ckpt")] * 2 + [(worker, "train", "ckpt")]
    recorded = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "ckpt"]
    assert len(recorded) == len(marks)

    # a.stop() before b's: NVTX ranges of a domain must nest, so b is closed
    # with a and reopened at once.
    ops = [(op, d, text) for t, op, d, text in entries if t == main and op in ("push", "pop")]
    i = ops.index(("push", "train", "a"))
    assert ops[i:] == [
        ("push", "train", "a"), ("push", "train", "b"), ("pop", "train", ""),
        ("pop", "train", ""), ("push", "train", "b"), ("pop", "train", ""),
    ]  # fmt: skip

    # asyncio tasks' ranges interleave on one thread: NVTX start/end ranges.
    starts = [text.split(" ", 1) for t, op, d, text in entries if op == "start" and d == "io"]
    ends = [text for t, op, d, text in entries if op == "end" and d == "io"]
    assert [name for _, name in starts] == ["load", "load"]
    assert sorted(ends) == sorted(rid for rid, _ in starts)
    task_loads = [
        e for e in trace["traceEvents"]
        if e["ph"] == "X" and e["name"] == "load" and e["tid"] != main_tid
    ]  # fmt: skip
    assert len(task_loads) == 2


def test_off_by_default_nothing_reaches_nvtx(tmp_path, tool):
    trace, _, entries = run(tmp_path, tool, nvtx=False)
    assert entries == []
    assert any(e["ph"] == "X" and e["name"] == "step" for e in trace["traceEvents"])


def test_the_key_is_a_bool():
    with pytest.raises(mxprof.ConfigError, match="nvtx must be a bool"):
        mxprof.set_config(nvtx="yes")
    mxprof.set_config(nvtx=1)
    mxprof.set_config(nvtx=False)
