"""A DDP training script written the way PyTorch's DDP tutorial writes one, with three known losses to inject.

It imports nothing of gpuscale: launched by torchrun (or `gpuscale run`), it reads its rank from the environment,
joins a gloo group, shards a synthetic data set with a DistributedSampler and trains an MLP with 6.3 MB of
gradients. The switches inject what a study must find again, each in its own part of the lost efficiency:

    --loader-sleep-ms N   every rank's loader sleeps N ms per batch (in collate_fn, in the main process): data
    --straggler-ms N      rank 1 busy-waits N ms before each backward, every step: a persistent imbalance, rank 1
    (neither)             a clean run

    torchrun --nproc-per-node 2 ddp_tutorial_losses.py --batch-size 32 --straggler-ms 10
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torch.utils.data.dataloader import default_collate


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=6144)
    parser.add_argument("--loader-sleep-ms", type=float, default=0.0)
    parser.add_argument("--straggler-ms", type=float, default=0.0)
    return parser.parse_args()


class MLP(nn.Module):
    """1.58 M parameters: 6.3 MB of fp32 gradients to all-reduce every step."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))

    def forward(self, x):
        return self.net(x)


def busy_wait(seconds):
    """Keep the core busy for `seconds` (a slower device, or host work only this rank does)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main():
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    data = TensorDataset(torch.randn(args.samples, 512), torch.randint(0, 10, (args.samples,)))

    def collate(batch):
        if args.loader_sleep_ms:
            time.sleep(args.loader_sleep_ms / 1000)
        return default_collate(batch)

    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, collate_fn=collate)
    model = DDP(MLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            if args.straggler_ms and rank == 1:
                busy_wait(args.straggler_ms / 1000)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
