"""GS111: every rank of the node computes on GPU 0."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)  # expect: GS111
    device = torch.device("cuda:0")  # expect: GS111
    model = torch.nn.Linear(8, 1).cuda(0)  # expect: GS111
    model = DDP(model, device_ids=[0])  # expect: GS111
    x = torch.randn(4, 8, device=torch.device("cuda", 0))  # expect: GS111
    model(x.to(device)).sum().backward()
    state = torch.load("init.pt", map_location={"cuda:0": f"cuda:{dist.get_rank()}"}, weights_only=True)
    if dist.get_rank() == 0:
        print(sorted(state))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
