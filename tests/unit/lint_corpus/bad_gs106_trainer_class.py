"""GS106: the DDP tutorial's structure (multigpu_torchrun.py): a Trainer class wraps the model in ``__init__`` and
saves it in another method, defined before or after; ``self.model.module.state_dict()`` is right."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def _save_snapshot(self, epoch):
        torch.save({"MODEL_STATE": self.model.state_dict(), "EPOCHS_RUN": epoch}, "snapshot.pt")  # expect: GS106

    def __init__(self, model, optimizer, save_every):
        self.model = DDP(model)
        self.optimizer = optimizer
        self.save_every = save_every

    def _save_checkpoint(self, epoch):
        torch.save(self.model.module.state_dict(), "checkpoint.pt")
        torch.save(self.optimizer.state_dict(), "optimizer.pt")

    def train(self, epochs):
        for epoch in range(epochs):
            self.optimizer.zero_grad()
            self.model(torch.randn(8, 4)).sum().backward()
            self.optimizer.step()
            if dist.get_rank() == 0 and epoch % self.save_every == 0:
                self._save_checkpoint(epoch)
                self._save_snapshot(epoch)


class Evaluator:
    def __init__(self, model):
        self.model = model  # a plain model: another class's self.model

    def save(self):
        if dist.get_rank() == 0:
            torch.save(self.model.state_dict(), "eval.pt")


def main():
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 2)
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), save_every=1).train(2)
    Evaluator(model).save()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
