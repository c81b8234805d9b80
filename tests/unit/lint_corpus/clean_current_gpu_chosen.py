"""The current GPU, chosen per rank first (the PyTorch DDP tutorial's way), or left to a rank that sees only its own."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    with torch.cuda.device(local_rank):
        model = DDP(torch.nn.Linear(8, 1).cuda(), device_ids=[local_rank])
        x = torch.randn(4, 8, device="cuda")
        model(x).sum().backward()
    if dist.get_rank() == 0:
        print("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
