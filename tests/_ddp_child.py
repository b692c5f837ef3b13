"""A DDP training job on gloo, started by tests/test_collectives.py (spawn).

Every rank trains a small model for ``steps`` frames named ``step`` with
its collectives recorded by the torch adapter; rank ``slow`` sleeps
``sleep_s`` before each backward, so that the others wait for it in DDP's
gradient all-reduce.  Each rank writes its own trace; rank 0 also
collects one merged timeline (mxprof.distributed over the process group's
store) and the cross-rank analysis (``distributed.dumps(ranks=True)``)
while the others wait in a barrier.
"""

import os
import time


def train(workdir, rank, world, port, steps, slow, sleep_s):
    os.chdir(workdir)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import mxprof
    from mxprof import distributed
    from mxprof.integrations.torch import instrument

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    distributed.init("worker", rank, world, 0, backend="torch", timeout=60)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = mxprof.Domain("train").new_frame("step")
    x, y = torch.randn(16, 32), torch.randn(16, 8)
    mxprof.set_config(filename="trace.json", profile_all=True)
    with instrument(model, name="ddp"):
        mxprof.set_state("run")
        scale = torch.ones(1, dtype=torch.float64)
        dist.broadcast(scale, src=0)
        for _ in range(steps):
            with step:
                loss = torch.nn.functional.mse_loss(model(x), y)
                if rank == slow:
                    time.sleep(sleep_s)
                loss.backward()
                opt.step()
                opt.zero_grad()
                total = loss.detach().clone()
                dist.all_reduce(total)  # the loss printed by rank 0
        parts = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(parts, torch.full((2,), rank, dtype=torch.int64))
        token = torch.zeros(3)
        if rank == 0:
            dist.send(torch.ones(3), dst=1)
            dist.isend(torch.ones(5, dtype=torch.float16), dst=2).wait()
        elif rank == 1:
            dist.recv(token, src=0)
        elif rank == 2:
            dist.irecv(torch.zeros(5, dtype=torch.float16), src=0).wait()
        dist.all_reduce(torch.ones(6, dtype=torch.float64), async_op=True).wait()
        dist.barrier()
        mxprof.set_state("stop")
    if rank == 0:
        distributed.collect("merged.json")
        with open("ranks.json", "w") as f:
            f.write(distributed.dumps(ranks=True, format="json")["ranks"])
    dist.barrier()
    if rank:  # leave while the hub still listens (it holds the store, too)
        distributed.shutdown()
    dist.barrier()
    distributed.shutdown()
    dist.destroy_process_group()
