"""A minimal DDP example without Lightning: a regression MLP on synthetic data, CPU (gloo) or GPU.

    torchrun --nproc_per_node 4 minimal_ddp_regression.py --epochs 20
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_dataset(n=20000, features=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default="mlp.pt")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    data = make_dataset()
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(1234))
    n_val = len(data) // 10
    train_set, val_set = Subset(data, perm[n_val:].tolist()), Subset(data, perm[:n_val].tolist())
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=1024, sampler=DistributedSampler(val_set, shuffle=False))
    print(f"rank {rank}: {len(sampler)} training samples, {len(val_loader)} validation batches")

    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    for epoch in range(args.epochs):
        ddp_model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss_fn(ddp_model(x), y).backward()
            optimizer.step()
        ddp_model.eval()
        sums = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                sums[0] += loss_fn(ddp_model(x), y) * len(y)
                sums[1] += len(y)
        dist.all_reduce(sums)
        if rank == 0:
            print(f"epoch {epoch}: validation MSE {(sums[0] / sums[1]).item():.5f}")

    if rank == 0:
        torch.save(ddp_model.module.state_dict(), args.out)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
