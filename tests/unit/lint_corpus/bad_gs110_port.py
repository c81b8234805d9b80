"""GS110: the rendezvous port is hard-coded: two jobs on one node collide."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"  # expect: GS110
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def setup_tcp(rank, world_size):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:23456", rank=rank, world_size=world_size)  # expect: GS110


def worker(rank, world_size):
    os.environ.setdefault("MASTER_PORT", "29500")  # expect: GS110
    if len(sys.argv) > 1:
        setup_tcp(rank, world_size)
    else:
        setup(rank, world_size)
    model = DDP(torch.nn.Linear(8, 1))
    model(torch.randn(4, 8)).sum().backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2,), nprocs=2)
