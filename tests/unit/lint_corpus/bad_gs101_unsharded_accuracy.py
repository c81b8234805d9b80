"""GS101 and GS107: an accuracy counted over a loader without a DistributedSampler is the whole dataset's
(every rank computes it: GS101, not GS107); a loader handed to a Trainer and read only in its rank-0
validation is read once, which is right."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def accuracy(model, loader):
    correct, total = 0, 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    return correct / total


class Trainer:
    def __init__(self, model, train_loader, val_loader):
        self.model = model
        self.train_loader = train_loader
        self.val_loader = val_loader

    def validate(self):
        return accuracy(self.model.module, self.val_loader)

    def fit(self, epochs):
        for epoch in range(epochs):
            self.train_loader.sampler.set_epoch(epoch)
            for x, y in self.train_loader:
                torch.nn.functional.cross_entropy(self.model(x), y).backward()
            if dist.get_rank() == 0:
                print(f"epoch {epoch}: validation accuracy {self.validate():.3f}")


def main():
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    test = TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    train_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    val_loader = DataLoader(test, batch_size=8)
    test_loader = DataLoader(test, batch_size=8)  # expect: GS101
    model = DDP(torch.nn.Linear(8, 2))
    Trainer(model, train_loader, val_loader).fit(2)
    test_accuracy = accuracy(model, test_loader)
    if dist.get_rank() == 0:
        print(f"test accuracy {test_accuracy:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
