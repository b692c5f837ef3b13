"""The offline tier: reading traces never starts the live profiler; the package
loads the live profiler at the first use of one of its names; percentiles of
one run, live and loaded, agree within the documented bound."""

import json
import math
import os
import random
import subprocess
import sys
import textwrap

import mxprof
from mxprof import _testing

# What reading a trace may import: the offline tier (and the command itself).
OFFLINE = {
    "mxprof",
    "mxprof._ctlclient",
    "mxprof._ctlwire",
    "mxprof._render",
    "mxprof._tallies",
    "mxprof._tracejson",
    "mxprof._version",
    "mxprof.averages",
    "mxprof.cli",
    "mxprof.errors",
    "mxprof.report",
    "mxprof.report.diff",
    "mxprof.report.hints",
    "mxprof.report.hints._common",
    "mxprof.report.hints.health",
    "mxprof.report.hints.dataloader",
    "mxprof.report.hints.loading",
    "mxprof.report.hints.memory",
    "mxprof.report.hints.ranks",
    "mxprof.report.hints.snapshot",
    "mxprof.report.hints.steps",
    "mxprof.report.ranks",
    "mxprof.report._collective",
    "mxprof.report._html",
    "mxprof.report._parallel",
    "mxprof.report._sections",
    "mxprof.report._series",
    "mxprof.report._shares",
    "mxprof.report.sql",
    "mxprof.report.view",
}

PUBLIC = [
    "ConfigError", "Counter", "DeviceUnavailable", "Domain", "Event", "Frame", "Marker",
    "OutputError", "ProfilerAction", "ProfilerError", "StateError", "Task", "TraceFormatError",
    "TraceReadError", "__version__", "current_scope", "diff", "dump", "dump_profile", "dumps",
    "get_include", "load", "memory", "pause", "profiler_set_config", "profile",
    "profiler_set_state", "record_function", "report", "resume", "schedule", "scope",
    "set_config", "set_state", "sql", "trigger",
]  # fmt: skip


def python(code, *args, cwd, flags=()):
    """Run code in a fresh interpreter; its stdout parsed as JSON."""
    proc = subprocess.run(
        [sys.executable, *flags, "-c", textwrap.dedent(code), *map(str, args)],
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def recorded(tmp_path):
    trace = tmp_path / "t.json"
    _testing.start(trace)
    with mxprof.Domain("d").new_task("t"):
        pass
    _testing.finish(trace)
    return trace


def test_reading_traces_starts_no_session(tmp_path):
    """load, and the stats, merge, repair, diff and ranks commands, in a process of their
    own: no compiled core, no exit, fork or signal hooks (before, importing
    mxprof.trace loaded the whole live profiler)."""
    trace = recorded(tmp_path)
    out = python(
        """
        import atexit, contextlib, io, json, signal, sys
        watched = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
        handlers = {s: signal.getsignal(s) for s in watched}
        hooks = atexit._ncallbacks()

        import mxprof.trace
        from mxprof import cli
        names = [e.name for e in mxprof.trace.load(sys.argv[1])]
        rows = [r.name for r in mxprof.load(sys.argv[1]).key_averages()]
        with contextlib.redirect_stdout(io.StringIO()) as table:
            codes = [
                cli.main(["stats", sys.argv[1]]),
                cli.main(["stats", "--format", "json", sys.argv[1]]),
                cli.main(["merge", sys.argv[1], sys.argv[1], "-o", "merged.json.gz"]),
                cli.main(["repair", sys.argv[1], "-o", "repaired.pftrace"]),
                cli.main(["diff", sys.argv[1], sys.argv[1]]),
                cli.main(["ranks", sys.argv[1]]),  # one: a rank given twice is refused
            ]
        print(json.dumps({
            "names": names, "rows": rows, "codes": codes, "table": table.getvalue(),
            "modules": sorted(m for m in sys.modules if m.startswith("mxprof")),
            "hooks": atexit._ncallbacks() - hooks,
            "signals": [s for s in watched if signal.getsignal(s) != handlers[s]],
        }))
        """,
        trace,
        cwd=tmp_path,
    )
    assert out["codes"] == [0, 0, 0, 0, 0, 0]
    assert out["names"] == ["t"] and out["rows"] == ["t"]
    assert ["t", "d", "1"] in [line.split()[:3] for line in out["table"].splitlines()]
    assert '"name": "t"' in out["table"]  # the JSON one
    live = [m for m in out["modules"] if m not in OFFLINE and not m.startswith("mxprof.trace")]
    assert live == []  # no mxprof._native, _session, control, stats ...
    assert out["hooks"] == 0 and out["signals"] == []
    assert [e.name for e in mxprof.load(tmp_path / "repaired.pftrace")] == ["t"]
    assert [e.name for e in mxprof.load(tmp_path / "merged.json.gz")] == ["t", "t"]


def test_the_live_profiler_loads_at_the_first_use_of_its_names(tmp_path):
    """import mxprof alone loads nothing live; the first live name loads the
    session, which writes the trace at exit in a forked child and in the
    parent as it did when the import loaded everything."""
    out = python(
        """
        import atexit, json, os, sys
        import mxprof
        before = sorted(m for m in sys.modules if m.startswith("mxprof"))
        hooks = atexit._ncallbacks()
        api = {"all": mxprof.__all__, "dir": dir(mxprof)}
        pid = os.fork()
        if pid == 0:  # first use in a fork child: its own file, written at its exit
            mxprof.set_config(filename="child.json", profile_api=False)
            mxprof.set_state("run")
            with mxprof.Domain("d").new_task("in child"):
                pass
            sys.exit(0)
        os.waitpid(pid, 0)
        mxprof.set_config(filename="parent.json", aggregate_stats=True, profile_api=False)
        after = "mxprof._native" in sys.modules and atexit._ncallbacks() > hooks
        mxprof.set_state("run")
        with mxprof.Domain("d").new_task("in parent"):
            pass
        print(json.dumps({"before": before, "after": after, **api}))
        """,
        cwd=tmp_path,
    )
    assert out["before"] == ["mxprof", "mxprof._version", "mxprof.errors"]
    assert out["after"] is True
    assert out["all"] == PUBLIC
    assert set(PUBLIC) | {"range", "stats", "control", "trace"} <= set(out["dir"])
    for who in ("child", "parent"):
        assert _testing.count(tmp_path / f"{who}.json", f"in {who}") == 1


def test_the_report_starts_no_session(tmp_path):
    """mxprof report reads files only: the offline tier and plotly, nothing live."""
    trace = recorded(tmp_path)
    out = python(
        """
        import json, sys
        from mxprof import cli
        code = cli.main(["report", sys.argv[1], "-o", "r.html"])
        print(json.dumps({
            "code": code,
            "modules": sorted(m for m in sys.modules if m.startswith("mxprof")),
        }))
        """,
        trace,
        cwd=tmp_path,
    )
    assert out["code"] == 0
    # (plotly registers exit hooks of its own: the modules, not the hooks, tell.)
    live = [m for m in out["modules"] if m not in OFFLINE and not m.startswith("mxprof.trace")]
    assert live == []
    assert '<td class="text">t</td>' in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_api_names_keep_their_objects_when_a_module_of_that_name_is_imported(tmp_path):
    """mxprof.scope and mxprof.schedule are functions, even when modules of
    those names were imported straight, before any API name was used (as
    conftest does: mxprof._testing imports mxprof.scope)."""
    out = python(
        """
        import json
        import mxprof.schedule, mxprof.scope
        names = ("scope", "schedule", "range", "profile", "memory")
        print(json.dumps({n: type(getattr(mxprof, n)).__name__ for n in names}))
        """,
        cwd=tmp_path,
    )
    assert out == {
        "scope": "function", "schedule": "function", "range": "function", "profile": "type",
        "memory": "module",
    }  # fmt: skip
    assert mxprof.scope is sys.modules["mxprof.scope"].scope
    with mxprof.scope("outer:"):
        assert mxprof.current_scope() == "outer:"


def test_live_and_loaded_percentiles_of_one_run_agree_within_the_documented_bound(tmp_path, clock):
    """One definition, nearest rank (P is the duration at rank ceil(P/100 * n)).
    A loaded trace gives it exactly; the live core, which keeps no events,
    gives the midpoint of the ranked duration's histogram bucket, within 1/128
    of it.  Durations 5 % apart: a rank off by one would break the bound."""
    durations = [round(1000 * 1.05**k) for k in range(200)]
    random.Random(7).shuffle(durations)
    task = mxprof.Domain("pct").new_task("t")
    with mxprof.profile(filename=str(tmp_path / "p.json")) as prof:
        for d in durations:
            task.start()
            clock(d)
            task.stop()
            clock(100)
    (live,) = [r for r in prof.key_averages() if r.name == "t"]
    (loaded,) = [r for r in mxprof.load(prof.trace_files[-1]).key_averages() if r.name == "t"]
    ordered = sorted(durations)
    assert (loaded.count, loaded.total, loaded.min, loaded.max, loaded.self) == (
        live.count, live.total, live.min, live.max, live.self
    )  # fmt: skip
    differ = 0
    for p in (50, 90, 99):
        exact = ordered[math.ceil(p * len(ordered) / 100) - 1]
        assert getattr(loaded, f"p{p}") == exact
        assert abs(getattr(live, f"p{p}") - exact) <= exact / 128
        differ += getattr(live, f"p{p}") != exact
    assert differ  # the data tell the two apart


def test_reading_needs_no_compiled_core(tmp_path):
    """A copy of the package without its compiled core (a source tree never
    built) still loads traces and runs stats and repair; a live name says
    what is missing.  Without site-packages (-S): reading needs only the
    standard library and msgspec (its one dependency, put on the path by
    hand), and no installed mxprof can lend its core."""
    import shutil

    import msgspec

    trace = recorded(tmp_path)
    package = tmp_path / "src" / "mxprof"
    shutil.copytree(
        os.path.dirname(mxprof.__file__),
        package,
        ignore=shutil.ignore_patterns("_mxprof_native*", "__pycache__"),
    )
    out = python(
        """
        import json, sys
        sys.path.insert(0, sys.argv[2])
        sys.path.append(sys.argv[3])
        import mxprof
        from mxprof import cli
        codes = [
            cli.main(["stats", sys.argv[1]]),
            cli.main(["repair", sys.argv[1], "-o", "r.json"]),
        ]
        try:
            mxprof.set_config(filename="x.json")
            error = ""
        except ImportError as e:
            error = str(e)
        rows = [r.name for r in mxprof.load(sys.argv[1]).key_averages()]
        print(json.dumps({"file": mxprof.__file__, "codes": codes, "rows": rows, "error": error}))
        """,
        trace,
        tmp_path / "src",
        os.path.dirname(os.path.dirname(msgspec.__file__)),
        cwd=tmp_path,
        flags=["-S"],
    )
    assert out["file"].startswith(str(package))
    assert out["codes"] == [0, 0] and out["rows"] == ["t"]
    assert "compiled core is missing" in out["error"]
    assert _testing.count(tmp_path / "r.json") == 1


def test_the_offline_tier_imports_only_the_offline_tier():
    """Who may import what (docs: architecture): the modules that read and
    write trace files import, anywhere in their code, only each other."""
    import ast
    import pathlib

    root = pathlib.Path(mxprof.__file__).parent
    packages = {"trace", "report"}
    offline = {"errors", "_version", "_tallies", "_tracejson", "_render", "averages", *packages}
    # The offline tier's own compiled module (native/offline/, trace/_fastread.py):
    # an extension, not a .py file; the live core (_mxprof_native) stays out.
    compiled = {"trace._fastjson"}
    for pkg in sorted(packages):
        for p in (root / pkg).rglob("*.py"):  # sub-packages too (report/hints/)
            parts = p.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                packages.add(".".join(parts[:-1]))
            offline.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert {"report.hints", "report.hints.loading", "report.diff"} <= offline
    found = {}
    for module in sorted(offline):
        path = root / (module.replace(".", "/") + ("/__init__.py" if module in packages else ".py"))
        package = module.split(".")[:-1] if module not in packages else [module]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - node.level + 1]
                names = [node.module] if node.module else [a.name for a in node.names]
                targets = [".".join([*base, n]) for n in names]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                absolute = [node.module] if isinstance(node, ast.ImportFrom) else []
                absolute += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                targets = [n[len("mxprof.") :] for n in absolute if n and n.startswith("mxprof.")]
            else:
                continue
            for target in targets:
                if target not in offline and target not in compiled:
                    found.setdefault(module, []).append(target)
    assert found == {}
