"""GS107: validation accuracy of rank 0's shard reported as the dataset's."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def evaluate(model, loader):
    model.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for x, y in loader:
            pred = model(x).argmax(dim=1)
            correct += (pred == y).sum().item()
            total += y.size(0)
    model.train()
    return correct / total


def main():
    dist.init_process_group("gloo")
    train_set = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    val_set = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=8, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, shuffle=False))
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        train_sampler.set_epoch(epoch)
        for x, y in train_loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        accuracy = evaluate(model, val_loader)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: validation accuracy {accuracy:.3f}")  # expect: GS107
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
