"""GS109: strong scaling by integer division: a global batch of 25 on 2 ranks becomes 24."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=25)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world_size = dist.get_world_size()
    per_rank = args.batch_size // world_size  # expect: GS109
    eval_batch = int(args.batch_size / int(os.environ["WORLD_SIZE"]))  # expect: GS109
    workers = os.cpu_count() // world_size  # cores per rank, not a batch
    node = dist.get_rank() // torch.cuda.device_count() if torch.cuda.is_available() else 0
    dataset = TensorDataset(torch.randn(100, 8), torch.randn(100, 1))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=per_rank, sampler=sampler, num_workers=min(workers, 2))
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    if dist.get_rank() == 0:
        print(f"node {node}, eval batch {eval_batch}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
