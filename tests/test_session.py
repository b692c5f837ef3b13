"""The session's state: a frozen, typed config; tallies kept by the core."""

import dataclasses
import json
import os
import sys

import pytest

import mxprof
from mxprof import config
from mxprof._session import SESSION


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
