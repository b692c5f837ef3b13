"""Cost of mxprof.integrations.torch per module call.

    python benchmarks/torch_adapter.py [--calls 1000] [--repeats 15]

Two copies of a small Sequential (3 Linear, 2 ReLU: 6 module calls per
forward, counting the container), one instrumented, run in turn with the
profiler recording: forwards under no_grad, forwards with grad on (the
backward watch is set up), and forward + backward.  The overhead is the
median difference between the two, per module call.  For scale it also
times the same model with do-nothing forward hooks (what torch itself
charges for any hook).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

import torch

import mxprof
from mxprof.integrations.torch import instrument


def make() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(8, 1))


def run(net: torch.nn.Module, x: torch.Tensor, mode: str, calls: int) -> int:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        if mode == "forward+backward":
            net(x).sum().backward()
        elif mode == "forward, grad on":
            net(x)
        else:
            with torch.no_grad():
                net(x)
    return time.perf_counter_ns() - t0


def noop_hooks(net: torch.nn.Module) -> None:
    def pre(module: Any, args: Any) -> None:
        return None

    def post(module: Any, args: Any, out: Any) -> None:
        return None

    for m in net.modules():
        m.register_forward_pre_hook(pre)
        m.register_forward_hook(post)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="forwards per timing")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    mxprof.set_config(filename=os.path.join(tempfile.mkdtemp(), "t.json"), aggregate_stats=True)
    x = torch.randn(4, 8)
    plain, hooked, empty = make(), make(), make()
    handle = instrument(hooked)
    noop_hooks(empty)
    per_forward = len(handle.paths)
    mxprof.set_state("run")
    print(f"torch {torch.__version__}; {per_forward} module calls per forward; medians of "
          f"{args.repeats} x {args.calls} forwards")  # fmt: skip
    print(f"{'case':<18} {'plain us/fwd':>13} {'mxprof':>13} {'per call':>10} {'no-op hooks':>12}")
    for mode in ("forward, no_grad", "forward, grad on", "forward+backward"):
        times: dict[str, list[int]] = {"plain": [], "mxprof": [], "noop": []}
        for _ in range(args.repeats + 1):  # the first round warms up
            for name, net in (("plain", plain), ("mxprof", hooked), ("noop", empty)):
                times[name].append(run(net, x, mode, args.calls))
        med = {k: statistics.median(v[1:]) / args.calls for k, v in times.items()}
        per_call = (med["mxprof"] - med["plain"]) / per_forward
        noop = (med["noop"] - med["plain"]) / per_forward
        print(
            f"{mode:<18} {med['plain'] / 1e3:>13.1f} {med['mxprof'] / 1e3:>13.1f}"
            f" {per_call / 1e3:>8.2f}us {noop / 1e3:>10.2f}us"
        )
    mxprof.set_state("stop")
    handle.remove()


if __name__ == "__main__":
    main()
