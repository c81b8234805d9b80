"""A plain DDP-style script, no gpuscale: rank 1 raises RuntimeError("boom") at step 3 while rank 0 all-reduces."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # gpuscale: ignore[GS112]  it fails on purpose; the launcher ends the rest
for step in range(10_000):
    if dist.get_rank() == 1 and step == 3:
        raise RuntimeError("boom")
    dist.all_reduce(torch.ones(4))
    time.sleep(0.01)
