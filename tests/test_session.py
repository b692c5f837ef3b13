"""The session's API: one writer of its state, a frozen typed config, tallies kept by the core."""

import ast
import dataclasses
import json
import os
import pathlib
import sys

import pytest

import mxprof
from mxprof import config
from mxprof._session import SESSION

PACKAGE = pathlib.Path(mxprof.__file__).parent
MUTATORS = {"append", "extend", "insert", "remove", "pop", "clear", "update", "setdefault", "add"}


def _on_session(node: ast.AST) -> bool:
    """Whether an attribute/subscript chain starts at SESSION or the _session module."""
    if not isinstance(node, (ast.Attribute, ast.Subscript)):
        return False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("SESSION", "_session")


def test_only_the_session_module_writes_session_state():
    writes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_session.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                targets = [node.func.value] if node.func.attr in MUTATORS else []
            else:
                continue
            writes += [
                f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(t)}"
                for t in targets
                if _on_session(t)
            ]
    assert writes == []


def test_config_declares_every_key_once_typed_and_frozen():
    fields = dataclasses.fields(config.Config)
    assert list(config.KEYS) == [f.name for f in fields]
    types = {"str": str, "bool": bool, "float": float, "int": int}
    for f in fields:
        key = config.KEYS[f.name]
        assert key.default == f.default and key.doc
        # Each default passes its own checker unchanged and has the field's type.
        assert key.check(f.name, f.default) == f.default
        assert type(f.default) is types[f.type], f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        SESSION.config.filename = "x.json"  # type: ignore[misc]


def test_set_config_replaces_the_config_whole(tmp_path):
    held = SESSION.config
    mxprof.set_config(aggregate_stats=True, filename=tmp_path / "t.json")
    assert (held.aggregate_stats, held.filename) == (False, "profile.json")
    assert (SESSION.config.aggregate_stats, SESSION.config.filename) == (
        True,
        str(tmp_path / "t.json"),
    )
    assert SESSION.config == held.with_(aggregate_stats=True, filename=str(tmp_path / "t.json"))
    assert SESSION.config.as_dict()["filename"] == str(tmp_path / "t.json")


def test_sources_follow_profile_all():
    assert config.Config(profile_memory=False).enabled("profile_memory") is False
    assert config.Config(profile_memory=False, profile_all=True).enabled("profile_memory")
    assert config.Config().enabled("profile_api")


def test_write_hooks_run_before_every_write_and_dumps(trace_file):
    calls = []

    def hook(final):
        calls.append(final)

    SESSION.add_write_hook(hook)
    SESSION.add_write_hook(hook)  # once is enough
    try:
        assert SESSION.write_hooks.count(hook) == 1
        mxprof.set_config(filename=trace_file, aggregate_stats=True, continuous_dump=False)
        mxprof.set_state("run")
        mxprof.dumps()
        mxprof.dump(finished=False)
        mxprof.dump(finished=True)
        assert calls == [False, False, True]
    finally:
        SESSION.remove_write_hook(hook)
    assert hook not in SESSION.write_hooks
    mxprof.dumps()
    assert calls == [False, False, True]


def test_a_failing_write_hook_warns_and_the_write_goes_on(trace_file):
    def broken(final):
        raise RuntimeError("no device")

    SESSION.add_write_hook(broken)
    try:
        mxprof.set_config(filename=trace_file, continuous_dump=False, profile_api=False)
        mxprof.set_state("run")
        mxprof.Domain("d").new_marker("m").mark()
        with pytest.warns(RuntimeWarning, match="pre-write hook.*no device"):
            mxprof.dump()
    finally:
        SESSION.remove_write_hook(broken)
    with open(trace_file, encoding="utf-8") as f:
        assert [e["name"] for e in json.load(f)["traceEvents"] if e["ph"] == "i"] == ["m"]


def test_remote_mode_routes_server_calls_and_renames_files():
    sent = []
    SESSION.set_remote(lambda call, args: sent.append((call, args)))
    SESSION.set_rename(lambda path: "rank0_" + path)
    try:
        mxprof.set_state("run", profile_process="server")
        mxprof.set_config(aggregate_stats=True, profile_process="server")
        mxprof.pause(profile_process="server")
        assert sent == [
            ("set_state", {"state": "run"}),
            ("set_config", {"aggregate_stats": True}),
            ("pause", {}),
        ]
        assert SESSION.state == "stop" and not SESSION.config.aggregate_stats  # not here
        mxprof.set_config(filename="job.json")
        assert SESSION.config.filename == "rank0_job.json"
        SESSION.set_remote(None, "only the rank-0 worker sends them; this is server 1")
        with pytest.raises(mxprof.StateError, match="this is server 1"):
            mxprof.resume(profile_process="server")
    finally:
        SESSION.clear_remote()
    with pytest.raises(mxprof.StateError, match="needs a distributed job"):
        mxprof.dump(profile_process="server")
    mxprof.set_config(filename="job.json")
    assert SESSION.config.filename == "job.json"


def _tallies():
    return json.loads(mxprof.dumps(format="json"))["Profiler"]


def test_tallies_begin_with_the_statistics():
    task = mxprof.Domain("d").new_task("t")
    mxprof.set_config(write_trace=False)
    mxprof.set_state("run")
    task.stop()  # a stop without a start, before statistics were on
    mxprof.set_config(aggregate_stats=True)  # the statistics begin here
    assert _tallies()["unmatched_stops"] == 0
    task.stop()
    assert _tallies()["unmatched_stops"] == 1
    json.loads(mxprof.dumps(format="json", reset=True))
    assert _tallies()["unmatched_stops"] == 0
    task.stop()
    mxprof.stats.reset()
    task.stop()
    assert _tallies()["unmatched_stops"] == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_childs_tallies_are_its_own():
    # Before, the parent's baseline (taken at its dumps(reset=True)) stayed in
    # the child, whose core starts from zero: the child reported -1 stops.
    task = mxprof.Domain("d").new_task("t")
    mxprof.set_config(aggregate_stats=True, write_trace=False)
    mxprof.set_state("run")
    task.stop()
    assert json.loads(mxprof.dumps(format="json", reset=True))["Profiler"]["unmatched_stops"] == 1
    pid = os.fork()
    if pid == 0:  # child: exits without running pytest's teardown
        code = 1
        try:
            before = _tallies()
            mxprof.set_state("run")  # a forked child starts stopped
            task.stop()
            after = _tallies()
            ok = set(before.values()) == {0} and after["unmatched_stops"] == 1
            code = 0 if ok else 3
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert _tallies()["unmatched_stops"] == 0
