"""GS101: `sampler=None` / `batch_sampler=None` is no sampler at all; a loader that only rank 0
iterates (validation on the main rank) reads the dataset once, which is right."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, loader):
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += torch.nn.functional.cross_entropy(model(x), y).item()
    return total


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train_set = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    val_set = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    test_set = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    train_loader = DataLoader(train_set, batch_size=8, shuffle=True, sampler=None)  # expect: GS101
    extra_loader = DataLoader(train_set, batch_size=8, batch_sampler=None)  # expect: GS101
    val_loader = DataLoader(val_set, batch_size=8)
    test_loader = DataLoader(test_set, batch_size=8, sampler=None)
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for loader in (train_loader, extra_loader):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
        if rank == 0:
            print(f"epoch {epoch}: validation loss {evaluate(model.module, val_loader):.3f}")
    if rank == 0:
        for x, y in test_loader:
            print(model.module(x).argmax(1).eq(y).float().mean().item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
