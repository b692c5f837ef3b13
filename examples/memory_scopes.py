"""Memory attribution by scope, with simulated allocations (runs anywhere).

A toy two-layer model "allocates" its weights once and activations on every
step, on a pretend GPU; a loader thread fills host buffers in its own scope.
Each allocation is attributed to the scope that was current where it was
made, so the profile says which layer held how much, at peak and now.

    python examples/memory_scopes.py [trace.json]

Writes the trace (counter tracks "Memory: gpu/0" and one per scope, plus an
instant per allocation) and MXNet's GPU memory CSV next to it, then prints
the Memory section of dumps() and the per-scope peaks.
"""

import os
import sys
import threading

import mxprof
from mxprof import memory

trace = sys.argv[1] if len(sys.argv) > 1 else "memory_trace.json"
mxprof.set_config(
    filename=trace,
    aggregate_stats=True,
    profile_memory=True,
    memory_events=True,
    gpu_memory_profile_filename_prefix=os.path.splitext(trace)[0] + "_gpu",
)

LAYERS = {"dense0": (784, 256), "dense1": (256, 10)}
BATCH = 64
FLOAT = 4  # bytes


def loader(steps):
    """Host-side batches, in a scope of their own on another thread."""
    with mxprof.scope("loader"):
        for _ in range(steps):
            buf = memory.record_alloc(BATCH * 784 * FLOAT, "cpu", tag="batch")
            memory.record_free(buf)


mxprof.set_state("run")
with mxprof.scope("model"):
    weights = []
    for name, (n_in, n_out) in LAYERS.items():
        with mxprof.scope(name):
            weights.append(memory.record_alloc(n_in * n_out * FLOAT, "gpu:0", tag="weight"))
            weights.append(memory.record_alloc(n_out * FLOAT, "gpu:0", tag="bias"))

thread = threading.Thread(target=loader, args=(5,), name="loader")
thread.start()
step = mxprof.Domain("train").new_frame("step")
for _ in range(5):
    with step, mxprof.scope("model"):
        activations = []
        for name, (_, n_out) in LAYERS.items():
            with mxprof.scope(name):
                # A caching allocator would report its rounding and reuse like this.
                nbytes = BATCH * n_out * FLOAT
                actual = -(-nbytes // 512) * 512
                activations.append(
                    memory.record_alloc(nbytes, "gpu:0", tag="out", actual=actual, reuse=True)
                )
        for handle in activations:
            memory.record_free(handle)
thread.join()
mxprof.set_state("stop")
mxprof.dump()  # the trace, and the CSV of what is still live on the GPU (the weights)

table = mxprof.dumps()
start = table.index("Device Storage")
print(table[start : table.index("\n\n", table.index("Scope Storage")) + 1])
print("peak bytes per scope:")
for u in memory.usage():
    if u.kind == "scope":
        print(f"  {u.name:<20} peak {u.peak:>9}  in use {u.current:>9}  allocations {u.allocs}")
print(f"trace written to {trace}")
print(f"GPU memory CSV written to {memory.csv_path(os.path.splitext(trace)[0] + '_gpu')}")
