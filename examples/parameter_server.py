"""A parameter-server job profiled as one: 2 workers, 2 servers, one timeline.

This script is the rank-0 worker.  It starts worker 1 and servers 0 and 1
as local processes, and every process joins mxprof's control channel.  The
workers compute "gradients" for a sharded weight vector, push them to the
server that owns each shard and pull the updated weights back; the servers
apply the updates.  From here, the rank-0 worker configures and starts the
servers' profilers with MXNet's calls (``profile_process='server'``), and at
the end collects every process's trace into one timeline, each clock
corrected to this process's.

    python examples/parameter_server.py [merged.json]

Open the merged file in https://ui.perfetto.dev: one process track per
rank ("server 1 (host, pid ...)"), pushes on the workers lined up with the
servers' handling of them.  ``mxprof ranks ps_merged.json`` splits each
worker's steps into compute and communication (push and pull) and lists
the servers.
"""

import array
import multiprocessing
import socket
import sys
import time

import mxprof
from mxprof import distributed, memory

NUM_WORKERS, NUM_SERVERS = 2, 2
SHARD = 20_000  # floats per server
STEPS = 8


def free_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def server(rank, address, requests, replies):
    """Own one shard; apply pushes, answer pulls, until told to stop."""
    distributed.init("server", rank, NUM_WORKERS, NUM_SERVERS, address=address)
    dom = mxprof.Domain("server")
    on_push, on_pull = dom.new_task("apply_push"), dom.new_task("serve_pull")
    weights = array.array("f", [0.0]) * SHARD
    with mxprof.scope(f"shard{rank}"):
        memory.record_alloc(len(weights) * 4, "cpu", tag="weights")
    while True:
        msg = requests.get()
        if msg[0] == "stop":
            break
        worker = msg[1]
        if msg[0] == "push":
            with on_push:
                grad = msg[2]
                for i in range(0, SHARD, 50):  # a sparse update, to keep the demo quick
                    weights[i] -= 0.1 * grad[i]
        else:
            with on_pull:
                replies[worker].put(weights)
    distributed.shutdown()


def train(rank, address, server_queues, replies, go=None):
    """One worker's loop: compute, push to every server, pull back."""
    if rank != 0:
        distributed.init("worker", rank, NUM_WORKERS, NUM_SERVERS, address=address)
        mxprof.set_config(filename="ps_trace.json")  # becomes worker<rank>_ps_trace.json
        mxprof.set_state("run")
        go.wait()  # the servers' profilers are running
    dom = mxprof.Domain("worker")
    step, compute = dom.new_frame("step"), dom.new_task("compute")
    # The "kvstore" domain marks push and pull as communication (mxprof ranks).
    kvstore = mxprof.Domain("kvstore")
    push, pull = kvstore.new_task("push"), kvstore.new_task("pull")
    for s in range(STEPS):
        with step:
            with compute:
                grads = [array.array("f", [float(s + rank + 1)]) * SHARD for _ in server_queues]
            with push:
                for q, g in zip(server_queues, grads):
                    q.put(("push", rank, g))
            with pull:
                for q in server_queues:
                    q.put(("pull", rank))
                shards = [replies[rank].get() for _ in server_queues]
    if rank != 0:
        mxprof.set_state("stop")
        distributed.shutdown()
    return shards


def main():
    merged = sys.argv[1] if len(sys.argv) > 1 else "ps_merged.json"
    address = free_address()
    ctx = multiprocessing.get_context("spawn")
    server_queues = [ctx.Queue() for _ in range(NUM_SERVERS)]
    replies = [ctx.Queue() for _ in range(NUM_WORKERS)]

    distributed.init("worker", 0, NUM_WORKERS, NUM_SERVERS, address=address)
    procs = [
        ctx.Process(target=server, args=(r, address, server_queues[r], replies))
        for r in range(NUM_SERVERS)
    ]
    go = ctx.Event()
    procs.append(ctx.Process(target=train, args=(1, address, server_queues, replies, go)))
    for p in procs:
        p.start()

    # MXNet's calls, sent to every server; each answers before they return.
    mxprof.set_config(filename="ps_trace.json", aggregate_stats=True, profile_process="server")
    mxprof.set_state("run", profile_process="server")
    mxprof.set_config(filename="ps_trace.json")
    mxprof.set_state("run")
    go.set()

    t0 = time.perf_counter()
    shards = train(0, address, server_queues, replies)
    pulled = sum(len(s) for s in shards)
    print(f"worker 0: {STEPS} steps in {time.perf_counter() - t0:.2f} s, {pulled} weights pulled")

    procs[-1].join()  # worker 1 is done
    mxprof.set_state("stop", profile_process="server")
    mxprof.set_state("stop")
    summary = distributed.collect(merged)
    for q in server_queues:
        q.put(("stop",))
    for p in procs:
        p.join()
    distributed.shutdown()

    print(f"merged timeline written to {merged}")
    for item in summary["inputs"]:
        clock = item["clock"] or {}
        offset_us, error_us = clock.get("offset_ns", 0) / 1e3, clock.get("error_ns", 0) / 1e3
        print(
            f"  {item['process']:<32} {item['path']:<22}"
            f" clock offset {offset_us:>8.1f} us +- {error_us:.1f} us"
        )
    print(f"server files: {', '.join(f'rank{r}_ps_trace.json' for r in range(NUM_SERVERS))}")


if __name__ == "__main__":
    main()
