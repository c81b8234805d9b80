"""A plain DDP script (no gpuscale) that ends right after collectives it never waits for, leaving its
process group open, as scripts written the Accelerate or Lightning way leave theirs.

It makes gloo's exit race (docs/traps.md, "gloo aborts at exit") likely: gloo's worker threads still
hold the last collectives, with Python callbacks, when the interpreter shuts down. Under bare torchrun
most runs end in "terminate called without an active exception" (SIGABRT) after "done" was printed.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")  # gpuscale: ignore[GS112]  left open on purpose: the exit race is the point
model = DDP(nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(20):
    model(torch.randn(32, 256)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
pending = [dist.all_reduce(torch.ones(1 << 16), async_op=True).get_future().then(lambda f: f.value()) for _ in range(8)]
print(f"rank {os.environ['RANK']} done", flush=True)
