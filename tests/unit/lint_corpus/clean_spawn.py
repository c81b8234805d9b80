"""Clean: mp.spawn from one launching process; a free port; each rank on its own GPU."""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=rank, world_size=world_size)
    try:
        device = torch.device(f"cuda:{rank}") if torch.cuda.is_available() else torch.device("cpu")
        model = DDP(torch.nn.Linear(8, 1).to(device), device_ids=[rank] if device.type == "cuda" else None)
        model(torch.randn(4, 8, device=device)).sum().backward()
        if rank == 0:
            print("one step done")
    finally:
        dist.destroy_process_group()


def main():
    world_size = max(torch.cuda.device_count(), 2)
    print(f"starting {world_size} processes")
    mp.spawn(worker, args=(world_size, free_port()), nprocs=world_size)
    print("all processes finished")


if __name__ == "__main__":
    main()
