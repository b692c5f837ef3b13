"""Per-layer timings of a small PyTorch CNN, with mxprof's torch adapter.

Every module call becomes a task named by its path (``model.block1.conv``),
every backward a task ``<path>.backward``, and on a GPU each layer's memory
is attributed to its scope (``model:block1:conv:``).  It trains a few steps
on random data (on CUDA when there is a GPU), prints the statistics table
sorted by total time and writes a Chrome trace (open it in
https://ui.perfetto.dev or chrome://tracing).

    python examples/torch_module_profile.py [trace.json]
"""

import sys
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

import mxprof
from mxprof.integrations.torch import instrument

STEPS = 5
BATCH = 32


def conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(cin, cout, 3, padding=1),
            bn=nn.BatchNorm2d(cout),
            relu=nn.ReLU(inplace=True),
            pool=nn.MaxPool2d(2),
        )
    )


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block1 = conv_block(3, 16)
        self.block2 = conv_block(16, 32)
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.block1(x))
        return self.head(x.flatten(1))


def main() -> None:
    trace_path = sys.argv[1] if len(sys.argv) > 1 else "torch_module_trace.json"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = SmallCNN().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    images = torch.randn(BATCH, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (BATCH,), device=device)

    mxprof.set_config(filename=trace_path, aggregate_stats=True)
    with instrument(model, name="model"):
        mxprof.set_state("run")
        for step in range(STEPS):
            opt.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            print(f"step {step}: loss {loss.item():.3f}")
        mxprof.set_state("stop")
    mxprof.dump()
    print(mxprof.dumps(sort_by="total"))
    print(f"trace written to {trace_path} ({device})")


if __name__ == "__main__":
    main()
