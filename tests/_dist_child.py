"""Processes of a distributed job, started by tests/test_distributed.py (spawn).

Each joins the job, records a task 'tick' every few ms on its main thread
while its control channel serves the rank-0 worker, and exits when the
file ``<workdir>/done`` appears (or after ``life`` seconds).
"""

import os
import time


def serve(
    workdir,
    role,
    rank,
    num_workers,
    num_servers,
    address,
    token=None,
    skew_ns=0,
    life=60.0,
    run_locally=False,
    timeout=10.0,
    slow_first_clock=0.0,
):
    os.chdir(workdir)
    import mxprof
    from mxprof import _native, distributed

    if slow_first_clock:  # join() is still measuring when the hub already knows us
        from mxprof.distributed import _node

        measure, calls = _node.Peer.measure, []

        def slow(self, timeout):
            calls.append(1)
            if len(calls) == 1:
                open("measuring", "w").close()
                time.sleep(slow_first_clock)
            return measure(self, timeout)

        _node.Peer.measure = slow
    if skew_ns:
        _native.lib.mxp_clock_skew_set(skew_ns)  # this process's wall clock is off
    try:
        distributed.init(
            role, rank, num_workers, num_servers, address=address, token=token, timeout=timeout
        )
    except Exception as e:  # the test reads why
        with open(f"{role}{rank}.error", "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        return
    if run_locally:  # a worker runs its own profiler, as a training script would
        mxprof.set_config(filename="trace.json")
        mxprof.set_state("run")
    tick = mxprof.Domain(role).new_task("tick")
    end = time.monotonic() + life
    while time.monotonic() < end and not os.path.exists("done"):
        with tick:
            time.sleep(0.002)
        if run_locally and not os.path.exists(f"{role}{rank}.ticked"):
            open(f"{role}{rank}.ticked", "w").close()  # a tick is in its profile
    distributed.shutdown()


def torch_job(workdir, torch_rank, port, result_path):
    """A two-rank gloo job: torch rank 0 is worker 0, rank 1 is server 0."""
    os.chdir(workdir)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import json

    import torch.distributed as dist

    import mxprof
    from mxprof import distributed

    dist.init_process_group("gloo", rank=torch_rank, world_size=2)
    role, rank = ("worker", 0) if torch_rank == 0 else ("server", 0)
    distributed.init(role, rank, num_workers=1, num_servers=1, backend="torch", timeout=20)
    tick = mxprof.Domain(role).new_task("tick")
    if torch_rank == 0:
        mxprof.set_config(filename="trace.json")
        mxprof.set_config(filename="trace.json", profile_process="server")
        mxprof.set_state("run", profile_process="server")
        mxprof.set_state("run")
        for _ in range(20):
            with tick:
                time.sleep(0.002)
        mxprof.set_state("stop", profile_process="server")
        mxprof.set_state("stop")
        summary = distributed.collect("merged.json")
        with open(result_path, "w") as f:
            json.dump({"summary": summary, "tally": distributed.tally()}, f)
        open("done", "w").close()
    else:
        while not os.path.exists("done"):
            with tick:
                time.sleep(0.002)
    dist.barrier()
    distributed.shutdown()
    dist.destroy_process_group()


def serve_env(workdir, env, life=60.0):
    """A peer that joins with init() and no arguments, under a launcher's env."""
    os.chdir(workdir)
    os.environ.update(env)
    import json

    import mxprof
    from mxprof import distributed

    try:
        info = distributed.init(timeout=20)
    except Exception as e:  # the test reads why
        with open("peer.error", "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        return
    with open(f"{info['role']}{info['rank']}.info", "w") as f:
        json.dump(info, f)
    mxprof.set_config(filename="trace.json")
    mxprof.set_state("run")
    tick = mxprof.Domain(info["role"]).new_task("tick")
    end = time.monotonic() + life
    while time.monotonic() < end and not os.path.exists("done"):
        with tick:
            time.sleep(0.002)
    distributed.shutdown()


def torchrun_job(workdir, torch_rank, port, result_path):
    """torchrun's variables, a gloo process group, then init() with no arguments."""
    os.chdir(workdir)
    os.environ.update(
        RANK=str(torch_rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(torch_rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import json

    import torch.distributed as dist

    import mxprof
    from mxprof import distributed

    dist.init_process_group("gloo")  # env:// from the variables above
    info = distributed.init(timeout=20)
    mxprof.set_config(filename="trace.json")
    mxprof.set_state("run")
    tick = mxprof.Domain("worker").new_task("tick")
    for _ in range(20):
        with tick:
            time.sleep(0.002)
    mxprof.set_state("stop")
    dist.barrier()
    if torch_rank == 0:
        summary = distributed.collect("merged.json")
        with open(result_path, "w") as f:
            json.dump({"summary": summary, "info": info}, f)
    dist.barrier()
    distributed.shutdown()
    dist.destroy_process_group()
