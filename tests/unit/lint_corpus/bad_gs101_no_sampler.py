"""GS101: the course's first DDP script: every rank iterates over the whole training set."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    train_set = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    val_set = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    train_loader = DataLoader(train_set, batch_size=8, shuffle=True)  # expect: GS101
    sampler = RandomSampler(val_set)
    val_loader = DataLoader(val_set, batch_size=8, sampler=sampler)  # expect: GS101
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in train_loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        correct = torch.zeros(1)
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum()
        dist.all_reduce(correct)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.3f}, correct {int(correct)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
