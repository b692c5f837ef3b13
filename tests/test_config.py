"""set_config / set_state / pause / dump argument handling and the MXNet keys."""

import json
import warnings

import pytest

import mxprof
from mxprof import _testing, config
from mxprof._session import SESSION
from mxprof._testing import count

MXNET_KEYS = {
    "filename": "profile.json",
    "profile_all": False,
    "profile_symbolic": True,
    "profile_imperative": True,
    "profile_memory": True,
    "profile_api": True,
    "continuous_dump": True,
    "dump_period": 1.0,
    "aggregate_stats": False,
    "profile_process": "worker",
    "gpu_memory_profile_filename_prefix": "gpu_memory_profile",
}


def test_every_mxnet_key_exists_with_mxnet_default():
    for key, default in MXNET_KEYS.items():
        assert config.KEYS[key].default == default, key
    for key in set(MXNET_KEYS) - {"profile_process"}:
        assert getattr(SESSION.config, key) == MXNET_KEYS[key]


def test_mxprof_keys_are_documented():
    assert config.KEYS["max_events"].default == 10_000_000
    assert config.KEYS["write_trace"].default is True
    assert all(k.doc for k in config.KEYS.values())


def test_unknown_key_lists_the_valid_ones():
    with pytest.raises(mxprof.ConfigError) as e:
        mxprof.set_config(bogus=1)
    msg = str(e.value)
    assert "'bogus'" in msg
    for key in MXNET_KEYS:
        assert key in msg


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"dump_period": 0}, "dump_period"),
        ({"dump_period": -1.5}, "dump_period"),
        ({"dump_period": float("nan")}, "dump_period"),
        ({"dump_period": True}, "dump_period"),
        ({"dump_period": "1"}, "dump_period"),
        ({"aggregate_stats": "yes"}, "aggregate_stats"),
        ({"aggregate_stats": 2}, "aggregate_stats"),
        ({"continuous_dump": None}, "continuous_dump"),
        ({"profile_process": "client"}, "profile_process"),
        ({"filename": ""}, "filename"),
        ({"filename": 42}, "filename"),
        ({"max_events": -1}, "max_events"),
        ({"max_events": 1.5}, "max_events"),
    ],
)
def test_bad_values_raise_naming_key_and_value(kwargs, fragment):
    before = SESSION.config
    with pytest.raises(mxprof.ConfigError) as e:
        mxprof.set_config(**kwargs)
    assert fragment in str(e.value)
    assert repr(next(iter(kwargs.values())))[:3] in str(e.value)
    assert SESSION.config == before


def test_one_bad_value_applies_nothing():
    with pytest.raises(mxprof.ConfigError):
        mxprof.set_config(aggregate_stats=True, dump_period=0)
    assert SESSION.config.aggregate_stats is False


def test_bools_accept_true_false_one_zero():
    mxprof.set_config(aggregate_stats=1)
    assert SESSION.config.aggregate_stats is True
    mxprof.set_config(aggregate_stats=0)
    assert SESSION.config.aggregate_stats is False


def test_keys_not_passed_keep_their_values(tmp_path):
    mxprof.set_config(aggregate_stats=True, dump_period=0.25)
    mxprof.set_config(filename=str(tmp_path / "x.json"))
    assert SESSION.config.aggregate_stats is True
    assert SESSION.config.dump_period == 0.25


def test_pathlike_filename(tmp_path):
    mxprof.set_config(filename=tmp_path / "p.json")
    assert SESSION.config.filename == str(tmp_path / "p.json")


def test_set_config_never_touches_files(tmp_path):
    path = tmp_path / "untouched.json"
    path.write_text("keep me")
    mxprof.set_config(filename=str(path))
    mxprof.set_config(filename=str(path), aggregate_stats=True)
    assert path.read_text() == "keep me"


def test_bad_state():
    with pytest.raises(mxprof.ConfigError, match="'walk'"):
        mxprof.set_state("walk")


def test_dumps_arguments_validated_even_when_stats_off():
    assert SESSION.config.aggregate_stats is False
    with pytest.raises(mxprof.ConfigError, match="'xml'"):
        mxprof.dumps(format="xml")
    with pytest.raises(mxprof.ConfigError, match="'median'"):
        mxprof.dumps(sort_by="median")
    with pytest.raises(mxprof.ConfigError, match="reset"):
        mxprof.dumps(reset="yes")
    with pytest.raises(mxprof.ConfigError, match="ascending"):
        mxprof.dumps(ascending=None)


def test_dumps_is_empty_when_stats_off_and_says_why_once(monkeypatch):
    from mxprof import stats

    monkeypatch.setattr(stats, "_warned_off", False)
    with pytest.warns(RuntimeWarning, match=r"aggregate_stats=True") as caught:
        assert mxprof.dumps() == ""
    assert caught[0].filename == __file__  # attributed to the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: no second warning
        assert mxprof.dumps(reset=True, format="json") == ""


def record_one_task(clock, name="step"):
    task = mxprof.Domain("d").new_task(name)
    mxprof.set_state("run")
    with task:
        clock(2_000_000)
    mxprof.set_state("stop")


def test_profile_all_turns_statistics_on(tmp_path, clock):
    # The typical flow printed an empty line: aggregate_stats defaults off.
    mxprof.set_config(profile_all=True, filename=str(tmp_path / "t.json"))
    assert SESSION.config.aggregate_stats is True
    record_one_task(clock)
    table = mxprof.dumps(sort_by="avg")
    row = next(ln for ln in table.splitlines() if ln.startswith("step "))
    assert row.split()[1:6] == ["1", "2.0000", "2.0000", "2.0000", "2.0000"]


@pytest.mark.parametrize(
    "calls, on",
    [
        ([{"profile_all": True, "aggregate_stats": False}], False),  # the same call: named wins
        ([{"aggregate_stats": False, "profile_all": True}], False),  # in any order
        ([{"profile_all": True}, {"aggregate_stats": False}], False),  # a later call wins
        ([{"profile_all": True}, {"profile_all": False}], True),  # turning all off: kept
        ([{"aggregate_stats": False}, {"profile_all": True}], True),  # the later call asks all
        ([{"profile_all": False}], False),  # MXNet's default
    ],
)
def test_an_explicit_aggregate_stats_wins_over_profile_all(clock, monkeypatch, calls, on):
    from mxprof import stats

    monkeypatch.setattr(stats, "_warned_off", True)
    for kwargs in calls:
        mxprof.set_config(write_trace=False, **kwargs)
    assert SESSION.config.aggregate_stats is on
    record_one_task(clock)
    text = mxprof.dumps(format="json")
    assert (text != "") is on
    if on:
        assert json.loads(text)["Time"]["d"]["step"]["Count"] == 1


def test_profile_all_with_a_bad_value_elsewhere_applies_nothing():
    with pytest.raises(mxprof.ConfigError, match="dump_period"):
        mxprof.set_config(profile_all=True, dump_period=0)
    assert SESSION.config.aggregate_stats is False
    assert SESSION.config.profile_all is False


def test_dump_before_ever_running_is_a_state_error():
    with pytest.raises(mxprof.StateError, match="never run"):
        mxprof.dump()
    with pytest.raises(mxprof.StateError):
        mxprof.dump(finished=False)


def test_dump_bad_arguments():
    mxprof.set_state("run")
    with pytest.raises(mxprof.ConfigError, match="finished"):
        mxprof.dump(finished="no")
    with pytest.raises(mxprof.ConfigError, match="profile_process"):
        mxprof.dump(profile_process="client")


@pytest.mark.parametrize(
    "call",
    [
        lambda: mxprof.set_config(profile_process="server", filename="x.json"),
        lambda: mxprof.set_state("run", profile_process="server"),
        lambda: mxprof.pause(profile_process="server"),
        lambda: mxprof.resume(profile_process="server"),
        lambda: mxprof.dump(profile_process="server"),
    ],
)
def test_server_process_without_a_distributed_job(call):
    with pytest.raises(mxprof.StateError, match="profile_process='server'"):
        call()
    assert SESSION.state == "stop"


def test_error_classes():
    assert issubclass(mxprof.ProfilerError, RuntimeError)
    assert issubclass(mxprof.ConfigError, mxprof.ProfilerError)
    assert issubclass(mxprof.ConfigError, ValueError)
    assert issubclass(mxprof.StateError, mxprof.ProfilerError)
    assert issubclass(mxprof.OutputError, OSError)


def test_deprecated_aliases_warn_every_call_and_work(tmp_path):
    path = str(tmp_path / "old.json")
    for _ in range(2):
        with pytest.warns(DeprecationWarning, match="profiler_set_config"):
            mxprof.profiler_set_config(mode="all", filename=path)
    assert SESSION.config.profile_all is True
    assert SESSION.config.filename == path
    with pytest.warns(DeprecationWarning, match="profiler_set_state"):
        mxprof.profiler_set_state("run")
    assert SESSION.state == "run"
    task = mxprof.Domain("old").new_task("t")
    task.start()
    task.stop()
    with pytest.warns(DeprecationWarning, match="dump_profile"):
        mxprof.dump_profile()
    trace = _testing.load_trace(path)
    assert [e["name"] for e in _testing.events(trace, "X")] == ["t"]
    with pytest.warns(DeprecationWarning), pytest.raises(mxprof.ConfigError, match="mode"):
        mxprof.profiler_set_config(mode="imperative")


def test_symbolic_mode_alias():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mxprof.profiler_set_config()
    assert SESSION.config.profile_symbolic is True
    assert SESSION.config.filename == "profile.json"


def test_domain_name_must_be_non_empty_str():
    with pytest.raises(mxprof.ConfigError, match="Domain name"):
        mxprof.Domain("")
    with pytest.raises(TypeError):
        mxprof.Domain(None)
    with pytest.raises(mxprof.ConfigError, match="not valid Unicode"):
        mxprof.Domain("\ud800")


def test_object_constructors_check_types():
    d = mxprof.Domain("d")
    with pytest.raises(TypeError, match="Domain"):
        mxprof.Task("not a domain", "t")
    with pytest.raises(TypeError):
        mxprof.Counter(d, 5)
    with pytest.raises(mxprof.ConfigError):
        d.new_marker("")
    with pytest.raises(TypeError):
        mxprof.Event(b"bytes")


# ---- values beyond what the core can take (issue 10, item 2) ----


def record(n, name="t"):
    task = mxprof.Domain("d").new_task(name)
    for _ in range(n):
        task.start()
        task.stop()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_events": 2**70},
        {"max_events": 2**63},
        {"dump_events": 2**70},
        {"dump_events": 2**64 - 1},  # the core's chunk rounding would wrap to 0
        {"dump_events": -1},
        {"dump_events": 1.0},
        {"dump_period": 1e12},  # beyond int64 nanoseconds
        {"dump_period": 10**400},  # too large even to become a float
        {"dump_period": 2**70},
        {"dump_period": float("inf")},
        {"dump_period": 1e-12},  # under the 1 ns the background writer can wait
        {"gpu_memory_profile_filename_prefix": "gpu\ud800"},
        {"gpu_memory_profile_filename_prefix": b"gpu"},
        {"profile_process": ["worker"]},
    ],
)
def test_a_value_the_core_cannot_take_poisons_nothing(tmp_path, kwargs):
    # Each of these was stored, then broke every later control call, the
    # background writer or dump() with a raw OverflowError/UnicodeEncodeError.
    path = str(tmp_path / "t.json")
    mxprof.set_config(filename=path, profile_api=False, dump_period=0.5)
    before = SESSION.config
    ((key, value),) = kwargs.items()
    with pytest.raises(mxprof.ConfigError) as e:
        mxprof.set_config(**kwargs)
    msg = str(e.value)
    assert key in msg and repr(value)[:6] in msg
    assert SESSION.config == before
    mxprof.set_config(aggregate_stats=True)
    mxprof.set_state("run")
    record(100)
    mxprof.pause()
    mxprof.resume()
    mxprof.set_state("stop")
    mxprof.dump()
    assert count(path) == 100
    assert json.loads(mxprof.dumps(format="json"))["Time"]["d"]["t"]["Count"] == 100


def test_integer_limits_at_the_edge_of_the_core(tmp_path):
    top = 2**63 - 1
    mxprof.set_config(max_events=top, dump_events=top, dump_period=(2**63 - 1) // 10**9)
    assert (SESSION.config.max_events, SESSION.config.dump_events) == (top, top)
    for key, value, allowed in (
        ("max_events", top + 1, "9223372036854775807"),
        ("dump_events", top + 1, "9223372036854775807"),
        ("dump_period", 9223372037, "9223372036"),
    ):
        with pytest.raises(mxprof.ConfigError, match=allowed) as e:
            mxprof.set_config(**{key: value})
        assert key in str(e.value)
    path = str(tmp_path / "t.json")
    mxprof.set_config(filename=path, profile_api=False)
    mxprof.set_state("run")
    record(5)
    mxprof.dump()
    assert count(path) == 5


def test_a_lone_surrogate_in_the_gpu_csv_prefix_is_refused(tmp_path):
    from mxprof import memory

    with pytest.raises(mxprof.ConfigError, match="gpu_memory_profile_filename_prefix.*Unicode"):
        mxprof.set_config(gpu_memory_profile_filename_prefix=str(tmp_path / "g\udcff"))
    assert SESSION.config.gpu_memory_profile_filename_prefix == "gpu_memory_profile"
    prefix = str(tmp_path / "g")
    mxprof.set_config(filename=str(tmp_path / "t.json"), gpu_memory_profile_filename_prefix=prefix)
    mxprof.set_state("run")
    memory.record_alloc(4096, "gpu:0", tag="w")
    mxprof.dump()
    with open(memory.csv_path(prefix), encoding="utf-8") as f:
        assert f.read().splitlines()[1:] == ['"<unk>:w","4096","0","4096","0"']


def test_set_config_rolls_back_when_applying_fails(tmp_path, monkeypatch):
    # A failure while applying (here: offering the config to children) leaves
    # the configuration, and what the core was told, as they were.
    from mxprof import _children

    path = str(tmp_path / "t.json")
    mxprof.set_config(filename=path, profile_api=False)
    mxprof.set_state("run")
    before = SESSION.config

    def broken_export(*args):
        raise RuntimeError("no room in the environment")

    monkeypatch.setattr(_children, "export", broken_export)
    with pytest.raises(RuntimeError, match="no room"):
        mxprof.set_config(follow_children=True, aggregate_stats=True, max_events=3)
    assert SESSION.config == before
    monkeypatch.undo()
    record(10)  # max_events=3 would have dropped 7 of them
    mxprof.set_config(aggregate_stats=True)
    record(2)
    mxprof.dump()
    assert count(path) == 12
    assert json.loads(mxprof.dumps(format="json"))["Time"]["d"]["t"]["Count"] == 2


def test_the_background_writer_survives_a_failing_write(tmp_path, monkeypatch):
    # An exception from a background write killed the thread: continuous
    # dump stopped for good, and nothing said so.
    import time

    path = str(tmp_path / "t.json")
    mxprof.set_config(filename=path, profile_api=False, dump_period=0.01)
    mxprof.set_state("run")
    record(3)
    calls = []

    def broken_flush(finish, explicit):
        calls.append(explicit)
        raise RuntimeError("the write broke")

    monkeypatch.setattr(SESSION, "flush", broken_flush)
    deadline = time.monotonic() + 20
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == [False] * len(calls) and len(calls) >= 3  # it went on after each failure
    assert SESSION.flusher.thread.is_alive()
    mxprof.set_config(continuous_dump=False)
    monkeypatch.undo()
    pending = SESSION.pending  # kept as a failed write is, for the next dump()
    assert isinstance(pending, mxprof.OutputError) and pending.filename == path
    assert "the write broke" in str(pending)
    with pytest.warns(RuntimeWarning, match="earlier background write failed.*the write broke"):
        mxprof.dump()
    assert count(path) == 3
