"""GS103: the function a multiprocessing Process runs joins the process group: it is one rank, and its
prints (and those of what it calls) run once per rank. The launching block that starts the processes runs
once: its prints are right."""

import os

import torch
import torch.distributed as dist
from torch.multiprocessing import Process


def run(rank, size):
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    print("all_reduce done, sum", tensor.item())  # expect: GS103
    if rank == 0:
        print("expected", size)


def init_process(rank, size, fn, backend="gloo"):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    size = 2
    print(f"starting {size} processes")
    processes = []
    for rank in range(size):
        p = Process(target=init_process, args=(rank, size, run))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    print("all processes joined")
