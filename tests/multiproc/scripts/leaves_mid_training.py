"""A plain DDP-style loop (no gpuscale) whose rank 1 leaves with ``sys.exit(3)`` at step 5 while rank 0 goes on to its
next all_reduce, which can then never complete. Bare torchrun ends such a job within seconds: it sees rank 1's exit
code and stops rank 0. Its group is left open, so gpuscale's exit handler runs in rank 1."""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # gpuscale: ignore[GS112]  left open, as the scripts the exit handler is for leave it
rank = dist.get_rank()
for step in range(10_000):
    if rank == 1 and step == 5:
        print(f"rank 1 leaves at step {step} with exit code 3", flush=True)
        sys.exit(3)
    dist.all_reduce(torch.ones(4))
    time.sleep(0.01)
print(f"rank {os.environ['RANK']} finished all steps", flush=True)
