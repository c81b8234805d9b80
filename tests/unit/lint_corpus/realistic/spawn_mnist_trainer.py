"""MNIST with DistributedDataParallel: one process per GPU started by mp.spawn, a small Trainer class.

    python spawn_mnist_trainer.py --epochs 5 --batch-size 64
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, random_split
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout(x), 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)


def cleanup():
    dist.destroy_process_group()


class Trainer:
    def __init__(self, model, train_loader, val_loader, optimizer, gpu_id, save_every):
        self.gpu_id = gpu_id
        self.model = DDP(model.to(gpu_id), device_ids=[gpu_id])
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.optimizer = optimizer
        self.save_every = save_every

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_loader.sampler.set_epoch(epoch)
        running = 0.0
        for source, targets in self.train_loader:
            source, targets = source.to(self.gpu_id), targets.to(self.gpu_id)
            running += self._run_batch(source, targets)
        steps = len(self.train_loader)
        print(f"[GPU{self.gpu_id}] epoch {epoch} | steps {steps} | loss {running / steps:.4f}")

    def _validate(self):
        model = self.model.module
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in self.val_loader:
                pred = model(x.to(self.gpu_id)).argmax(dim=1)
                correct += (pred == y.to(self.gpu_id)).sum().item()
        model.train()
        return correct / len(self.val_loader.dataset)

    def _save_checkpoint(self, epoch):
        state = {"epoch": epoch, "model": self.model.module.state_dict()}
        torch.save(state, args.checkpoint)

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)
            if self.gpu_id == 0:
                acc = self._validate()
                print(f"epoch {epoch} | validation accuracy {acc:.4f}")
                if epoch % self.save_every == 0:
                    self._save_checkpoint(epoch)


def load_data(root):
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    full = datasets.MNIST(root, train=True, download=True, transform=transform)
    train_set, val_set = random_split(full, [55000, 5000])
    return train_set, val_set


def main(rank, world_size, root, total_epochs, batch_size):
    setup(rank, world_size)
    train_set, val_set = load_data(root)
    train_loader = DataLoader(train_set, batch_size=batch_size, pin_memory=True, shuffle=False,
                              sampler=DistributedSampler(train_set))
    val_loader = DataLoader(val_set, batch_size=256)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    trainer = Trainer(model, train_loader, val_loader, optimizer, rank, save_every=1)
    trainer.train(total_epochs)
    cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="MNIST with DDP and mp.spawn")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="per GPU")
    parser.add_argument("--data", default="./data")
    parser.add_argument("--checkpoint", default="mnist_ddp.pt")
    args = parser.parse_args()
    world_size = torch.cuda.device_count()
    mp.spawn(main, args=(world_size, args.data, args.epochs, args.batch_size), nprocs=world_size)
