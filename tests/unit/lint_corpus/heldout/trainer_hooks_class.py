"""A small hand-rolled Trainer with callback hooks (no Lightning), launched with torchrun:

    torchrun --nproc_per_node=4 trainer_hooks_class.py --epochs 20 --out runs/exp1
"""
import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Callback:
    """Hooks the Trainer calls; override the ones you need."""

    def on_fit_start(self, trainer):
        pass

    def on_epoch_end(self, trainer, epoch, logs):
        pass

    def on_fit_end(self, trainer):
        pass


class ProgressPrinter(Callback):
    def on_fit_start(self, trainer):
        self.start = time.time()

    def on_epoch_end(self, trainer, epoch, logs):
        print(f"epoch {epoch:3d} | " + " | ".join(f"{k} {v:.4f}" for k, v in logs.items()))

    def on_fit_end(self, trainer):
        if trainer.is_main:
            print(f"done in {time.time() - self.start:.0f}s")


class JsonHistory(Callback):
    def __init__(self, path):
        self.path = Path(path)
        self.rows = []

    def on_epoch_end(self, trainer, epoch, logs):
        self.rows.append({"epoch": epoch, **logs})
        if trainer.is_main:
            self.path.write_text(json.dumps(self.rows, indent=2))


class BestCheckpoint(Callback):
    def __init__(self, path, monitor="val_acc"):
        self.path, self.monitor, self.best = path, monitor, float("-inf")

    def on_epoch_end(self, trainer, epoch, logs):
        if logs[self.monitor] > self.best:
            self.best = logs[self.monitor]
            torch.save({"epoch": epoch, "model": trainer.model.state_dict(), "best": self.best}, self.path)


class Trainer:
    def __init__(self, model, optimizer, train_set, val_set, batch_size, callbacks=()):
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.is_main = self.rank == 0
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.optimizer = optimizer
        self.train_sampler = DistributedSampler(train_set, shuffle=True)
        self.train_loader = DataLoader(train_set, batch_size=batch_size, sampler=self.train_sampler,
                                       num_workers=2, pin_memory=True, drop_last=True)
        self.val_loader = DataLoader(val_set, batch_size=batch_size * 2, shuffle=False, num_workers=2)
        self.callbacks = list(callbacks)

    def _hook(self, name, *args):
        for callback in self.callbacks:
            getattr(callback, name)(self, *args)

    def train_epoch(self, epoch):
        self.model.train()
        self.train_sampler.set_epoch(epoch)
        loss_sum = torch.zeros((), device=self.device)
        for x, y in self.train_loader:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            loss = F.cross_entropy(self.model(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            loss_sum += loss.detach()
        dist.all_reduce(loss_sum)
        return loss_sum.item() / (len(self.train_loader) * self.world_size)

    @torch.no_grad()
    def validate(self):
        self.model.eval()
        correct = total = 0
        for x, y in self.val_loader:
            x, y = x.to(self.device), y.to(self.device)
            correct += (self.model(x).argmax(1) == y).sum().item()
            total += y.numel()
        return correct / total

    def fit(self, epochs):
        self._hook("on_fit_start")
        for epoch in range(epochs):
            start = time.time()
            train_loss = self.train_epoch(epoch)
            val_acc = self.validate()
            self._hook("on_epoch_end", epoch, {"train_loss": train_loss, "val_acc": val_acc,
                                               "seconds": time.time() - start})
        self._hook("on_fit_end")


def build_data(n_train=20000, n_val=2000, dim=32, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, classes, generator=g)
    x = torch.randn(n_train + n_val, dim, generator=g)
    y = (x @ w).argmax(1)
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", default="runs/default")
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world_size = dist.get_world_size()
    batch_size = args.global_batch // world_size
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    train_set, val_set = build_data()
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    if args.resume:
        state = torch.load(args.resume)
        model.load_state_dict(state["model"])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world_size, momentum=0.9)
    callbacks = [ProgressPrinter(), JsonHistory(os.path.join(args.out, "history.json")),
                 BestCheckpoint(os.path.join(args.out, "best.pt"))]
    trainer = Trainer(model, optimizer, train_set, val_set, batch_size, callbacks)
    if trainer.is_main:
        print(f"training on {world_size} GPUs, {batch_size} samples per GPU per step")
    trainer.fit(args.epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
