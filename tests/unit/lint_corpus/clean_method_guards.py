"""Clean: a trainer class whose evaluate() prints, called only as `self.evaluate()` under a rank guard;
`judge.evaluate()` (another object's method of the same name) and `np.save` (a module's function
of a method's name) do not make them run on every rank."""

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_judge():
    return object()


class Trainer:
    def __init__(self, model, loader, sampler):
        self.model, self.loader, self.sampler = model, loader, sampler
        self.rank = dist.get_rank()

    def evaluate(self):
        print("evaluating")

    def save(self, path):
        print(f"saving to {path}")
        torch.save(self.model.module.state_dict(), path)

    def fit(self, epochs):
        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)
            for x, y in self.loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(self.model(x), y).backward()
                opt.step()
            if self.rank == 0:
                self.evaluate()
                self.save("model.pt")


class Judge:
    def evaluate(self):
        return 0


def main():
    dist.init_process_group("gloo")
    dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(dataset)
    trainer = Trainer(DDP(torch.nn.Linear(8, 1)), DataLoader(dataset, batch_size=8, sampler=sampler), sampler)
    trainer.fit(2)
    judge = make_judge()
    judge.evaluate()
    Judge().evaluate()
    other = Judge()
    other.evaluate()
    np.save("/dev/null", np.zeros(1))  # a module's save, not Trainer.save
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
