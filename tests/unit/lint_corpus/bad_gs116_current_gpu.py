"""GS116: the current GPU, never chosen per rank: every rank of the node computes on cuda:0."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(8, 1).cuda())  # expect: GS116
    x = torch.randn(4, 8).to("cuda")  # the same mistake again: one finding per script says it
    model(x).sum().backward()
    if dist.get_rank() == 0:
        print("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
