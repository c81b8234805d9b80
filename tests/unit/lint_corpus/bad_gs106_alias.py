"""GS106: the DDP wrapper under another name (`DistributedDataParallel as NativeDDP`) still prefixes every
key with 'module.'."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as NativeDDP


def main():
    dist.init_process_group("gloo")
    model = NativeDDP(torch.nn.Linear(4, 2))
    model(torch.randn(8, 4)).sum().backward()
    if dist.get_rank() == 0:
        torch.save({"state_dict": model.state_dict()}, "best.pth")  # expect: GS106
        torch.save({"state_dict": model.module.state_dict()}, "best_plain.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
