"""Zero-config init(): the launcher's variables (torchrun, MXNet's dmlc launcher).

Explicit arguments win over MXPROF_* variables, which win over the launcher's.
"""

import json
import os
import sys

import pytest

import mxprof
from mxprof import _testing
from mxprof.distributed import _launcher

zmq = pytest.importorskip("zmq", reason="the ZeroMQ transport needs pyzmq (mxprof[dist])")

from mxprof import distributed  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # spawned children import it
import _dist_child  # noqa: E402
import _dist_job  # noqa: E402
from _dist_job import SPAWN, free_port, wait_for  # noqa: E402

LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "DMLC_ROLE",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "DMLC_TASK_ID",
    "DMLC_WORKER_ID",
    "DMLC_SERVER_ID",
    "MXPROF_ROLE",
    "MXPROF_RANK",
    "MXPROF_NUM_WORKERS",
    "MXPROF_NUM_SERVERS",
    "MXPROF_ADDRESS",
    "MXPROF_BACKEND",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def job(tmp_path):
    yield from _dist_job.job(tmp_path)


def start_env(tmp_path, env):
    p = SPAWN.Process(target=_dist_child.serve_env, args=(str(tmp_path), env), daemon=True)
    p.start()
    return p


# ---- what each launcher's variables say ----


def test_torchrun_variables():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
    }
    assert _launcher.detect(env) == {
        "launcher": "torchrun",
        "role": "worker",
        "rank": 3,
        "num_workers": 8,
        "num_servers": 0,
        "local_rank": 1,
        "address": "tcp://node0:29501",
    }
    ipv6 = _launcher.detect({**env, "MASTER_ADDR": "::1"})
    assert ipv6["address"] == "tcp://[::1]:29501"


@pytest.mark.parametrize(
    ("extra", "role", "rank"),
    [
        ({"DMLC_ROLE": "worker", "DMLC_TASK_ID": "2"}, "worker", 2),
        ({"DMLC_ROLE": "server", "DMLC_TASK_ID": "4"}, "server", 1),  # workers 0..2 first
        ({"DMLC_ROLE": "server", "DMLC_SERVER_ID": "0", "DMLC_TASK_ID": "9"}, "server", 0),
        ({"DMLC_ROLE": "worker", "DMLC_WORKER_ID": "1"}, "worker", 1),
    ],
)
def test_dmlc_variables(extra, role, rank):
    env = {
        "DMLC_NUM_WORKER": "3",
        "DMLC_NUM_SERVER": "2",
        "DMLC_PS_ROOT_URI": "10.0.0.5",
        "DMLC_PS_ROOT_PORT": "9091",
        **extra,
    }
    assert _launcher.detect(env) == {
        "launcher": "dmlc",
        "role": role,
        "rank": rank,
        "num_workers": 3,
        "num_servers": 2,
        "address": "tcp://10.0.0.5:9092",
    }


def test_bad_launcher_variables_are_config_errors(monkeypatch):
    with pytest.raises(mxprof.ConfigError, match="WORLD_SIZE must be an integer, got 'x'"):
        _launcher.detect({"RANK": "0", "WORLD_SIZE": "x"})
    with pytest.raises(mxprof.ConfigError, match="'scheduler'.*workers and servers only"):
        _launcher.detect({"DMLC_ROLE": "scheduler"})
    monkeypatch.setenv("DMLC_ROLE", "worker")
    monkeypatch.setenv("DMLC_NUM_WORKER", "2")
    with pytest.raises(mxprof.ConfigError, match="rank is required.*DMLC_TASK_ID"):
        distributed.init()
    assert not distributed.is_initialized()


def test_no_launcher_no_guess():
    assert _launcher.detect({}) == {}
    with pytest.raises(mxprof.ConfigError, match="role must be"):
        distributed.init()


# ---- explicit arguments win ----


def test_explicit_arguments_win_over_mxprof_variables_over_the_launchers(monkeypatch):
    port = free_port()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("MXPROF_NUM_SERVERS", "1")
    own = f"tcp://127.0.0.1:{free_port()}"
    info = distributed.init(num_workers=2, address=own)
    # num_workers given, num_servers from MXPROF_*, role and rank from torchrun.
    assert (info["role"], info["rank"], info["num_workers"], info["num_servers"]) == (
        "worker",
        0,
        2,
        1,
    )
    assert (info["launcher"], info["local_rank"], info["backend"]) == ("torchrun", 0, "zmq")
    node = distributed._node_ref["node"]
    assert node.endpoint.transport.address == own
    distributed.shutdown()


# ---- real jobs, zero-config ----


def test_zero_config_under_torchrun_variables(job, tmp_path, monkeypatch):
    port = free_port()
    common = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for k, v in {**common, "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    info = distributed.init(timeout=20)
    assert (info["role"], info["rank"], info["world_size"], info["backend"]) == (
        "worker",
        0,
        2,
        "zmq",
    )
    node = distributed._node_ref["node"]
    assert node.endpoint.transport.address == f"tcp://127.0.0.1:{port + 1}"
    peer = start_env(tmp_path, {**common, "RANK": "1", "LOCAL_RANK": "1"})
    job.procs.append(peer)
    assert wait_for(lambda: (tmp_path / "worker1.info").exists(), 60), _error(tmp_path)
    assert [(m.role, m.rank, m.pid) for m in distributed.members()] == [("worker", 1, peer.pid)]
    seen = json.loads((tmp_path / "worker1.info").read_text())
    assert (seen["launcher"], seen["local_rank"], seen["num_workers"]) == ("torchrun", 1, 2)


def test_zero_config_under_mxnets_launcher(job, tmp_path, monkeypatch):
    port = free_port()
    common = {
        "DMLC_NUM_WORKER": "1",
        "DMLC_NUM_SERVER": "2",
        "DMLC_PS_ROOT_URI": "127.0.0.1",
        "DMLC_PS_ROOT_PORT": str(port),
    }
    for k, v in {**common, "DMLC_ROLE": "worker", "DMLC_TASK_ID": "0"}.items():
        monkeypatch.setenv(k, v)
    info = distributed.init(timeout=20)
    assert (info["role"], info["rank"], info["launcher"]) == ("worker", 0, "dmlc")
    # dmlc's local launcher numbers tasks workers first: tasks 1 and 2 are servers 0 and 1.
    servers = [
        start_env(tmp_path, {**common, "DMLC_ROLE": "server", "DMLC_TASK_ID": str(t)})
        for t in (1, 2)
    ]
    job.procs.extend(servers)
    assert wait_for(lambda: len(distributed.members()) == 2, 60), _error(tmp_path)
    got = sorted((m.role, m.rank, m.pid) for m in distributed.members())
    assert got == sorted(
        [("server", 0, servers[0].pid), ("server", 1, servers[1].pid)], key=lambda m: m[1]
    )
    mxprof.set_state("run", profile_process="server")  # they obey as servers
    assert wait_for(lambda: (tmp_path / "rank1_trace.json").exists(), 30)


def _error(tmp_path):
    path = tmp_path / "peer.error"
    return path.read_text() if path.exists() else "no error file"


def test_zero_config_uses_the_torch_process_groups_store(tmp_path):
    pytest.importorskip("torch.distributed", reason="needs PyTorch")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    port = free_port()
    result = tmp_path / "result.json"
    procs = [
        SPAWN.Process(target=_dist_child.torchrun_job, args=(str(tmp_path), r, port, str(result)))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    data = json.loads(result.read_text())
    assert (data["info"]["backend"], data["info"]["launcher"]) == ("torch", "torchrun")
    assert data["summary"]["missing"] == []
    merged = _testing.load_trace(tmp_path / "merged.json")
    assert merged["distributedInfo"]["backend"] == "torch"
    names = {e["pid"]: e["args"]["name"] for e in _testing.events(merged, "M", "process_name")}
    ranks = {names[e["pid"]].split(" (")[0] for e in _testing.events(merged, "X", "tick")}
    assert ranks == {"worker 0", "worker 1"}
