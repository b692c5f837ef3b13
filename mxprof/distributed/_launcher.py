"""What a launcher's environment says about this process's place in the job.

``init()`` with arguments left out takes them from the ``MXPROF_*``
variables first, then from here:

- torchrun (and ``torch.distributed.launch``): ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``.  Every process is a
  worker, rank ``RANK`` of ``WORLD_SIZE``; an initialised default process
  group carries the control channel through its store (``backend='torch'``,
  no port of its own); without one, the rank-0 worker listens at
  ``MASTER_ADDR`` on ``MASTER_PORT + PORT_OFFSET``.
- MXNet's launcher (dmlc tracker, ps-lite): ``DMLC_ROLE``,
  ``DMLC_NUM_WORKER``, ``DMLC_NUM_SERVER``, ``DMLC_PS_ROOT_URI``/``PORT``.
  ps-lite hands out ranks at run time, so the rank comes from
  ``DMLC_WORKER_ID``/``DMLC_SERVER_ID`` where the launcher sets them, else
  from ``DMLC_TASK_ID`` as dmlc's local launcher numbers tasks (workers
  first, then servers).  The rank-0 worker listens at ``DMLC_PS_ROOT_URI``
  on ``DMLC_PS_ROOT_PORT + PORT_OFFSET``, so it must run on the
  scheduler's host (else set ``MXPROF_ADDRESS``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError

PORT_OFFSET = 1  # mxprof's port is the launcher's rendezvous port + 1


def _number(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


def _tcp(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    return f"tcp://{host}:{port}"


def _torch_group(world_size: int) -> bool:
    """Whether this process already runs the job's default process group
    (torch is looked for only where the program imported it)."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(
            dist is not None
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() == world_size
        )
    except Exception:  # a half-built group: not ours to use
        return False


def torchrun(env: Mapping[str, str]) -> dict[str, Any]:
    rank, world = _number(env, "RANK"), _number(env, "WORLD_SIZE")
    found: dict[str, Any] = {
        "launcher": "torchrun",
        "role": "worker",
        "rank": rank,
        "num_workers": world,
        "num_servers": 0,
    }
    if "LOCAL_RANK" in env:
        found["local_rank"] = _number(env, "LOCAL_RANK")
    if _torch_group(world):
        found["backend"] = "torch"
    elif "MASTER_ADDR" in env and "MASTER_PORT" in env:
        found["address"] = _tcp(env["MASTER_ADDR"], _number(env, "MASTER_PORT") + PORT_OFFSET)
    return found


def dmlc(env: Mapping[str, str]) -> dict[str, Any]:
    role = env["DMLC_ROLE"]
    if role == "scheduler":
        raise ConfigError(
            "DMLC_ROLE is 'scheduler': ps-lite's scheduler is no member of the profiled job; "
            "call mxprof.distributed.init() in workers and servers only"
        )
    found: dict[str, Any] = {"launcher": "dmlc", "role": role}
    workers = _number(env, "DMLC_NUM_WORKER") if "DMLC_NUM_WORKER" in env else None
    if workers is not None:
        found["num_workers"] = workers
    if "DMLC_NUM_SERVER" in env:
        found["num_servers"] = _number(env, "DMLC_NUM_SERVER")
    own = {"worker": "DMLC_WORKER_ID", "server": "DMLC_SERVER_ID"}.get(role)
    if own is not None and own in env:
        found["rank"] = _number(env, own)
    elif "DMLC_TASK_ID" in env:
        task = _number(env, "DMLC_TASK_ID")
        if role == "server":
            if workers is None:
                raise ConfigError("DMLC_TASK_ID of a server needs DMLC_NUM_WORKER")
            task -= workers  # dmlc's local launcher: workers 0..n-1, then servers
        found["rank"] = task
    if "DMLC_PS_ROOT_URI" in env and "DMLC_PS_ROOT_PORT" in env:
        port = _number(env, "DMLC_PS_ROOT_PORT") + PORT_OFFSET
        found["address"] = _tcp(env["DMLC_PS_ROOT_URI"], port)
    return found


def detect(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The launcher's word on role, rank, sizes, address, backend ({}: none).

    Raises:
        ConfigError: a launcher variable that is not a number, or
            DMLC_ROLE=scheduler.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return torchrun(env)
    if "DMLC_ROLE" in env:
        return dmlc(env)
    return {}
