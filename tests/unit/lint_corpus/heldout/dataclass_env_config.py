"""ResNet-18 on CIFAR-10 under torchrun; the launcher's variables are read once into a frozen dataclass.

    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$HEAD:29400 dataclass_env_config.py
"""
import logging
import math
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, random_split
from torch.utils.data.distributed import DistributedSampler

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
log = logging.getLogger("cifar")


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    master_addr: str = "localhost"
    master_port: int = 29500

    @classmethod
    def from_env(cls) -> "DistEnv":
        return cls(rank=int(os.environ.get("RANK", 0)), local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                   world_size=int(os.environ.get("WORLD_SIZE", 1)),
                   master_addr=os.environ.get("MASTER_ADDR", "localhost"),
                   master_port=int(os.environ.get("MASTER_PORT", 29500)))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@dataclass
class TrainConfig:
    data_dir: str = "./data"
    epochs: int = 30
    batch_size: int = 128  # per GPU
    lr: float = 0.1
    warmup_epochs: int = 2
    val_fraction: float = 0.1
    ckpt: str = "cifar_resnet18.pt"
    env: DistEnv = field(default_factory=DistEnv.from_env)


def setup(env: DistEnv) -> torch.device:
    if env.distributed:
        dist.init_process_group("nccl", rank=env.rank, world_size=env.world_size)
    device = torch.device("cuda", env.local_rank)
    torch.cuda.set_device(device)
    return device


def build_datasets(cfg: TrainConfig):
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor()])
    full = torchvision.datasets.CIFAR10(cfg.data_dir, train=True, download=True, transform=train_tf)
    n_val = int(len(full) * cfg.val_fraction)
    train_set, val_set = random_split(full, [len(full) - n_val, n_val])
    test_set = torchvision.datasets.CIFAR10(cfg.data_dir, train=False, download=True, transform=T.ToTensor())
    return train_set, val_set, test_set


def build_loaders(cfg: TrainConfig, train_set, val_set, test_set):
    env = cfg.env
    train_sampler = DistributedSampler(train_set, num_replicas=env.world_size, rank=env.rank) if env.distributed else None
    val_sampler = (DistributedSampler(val_set, num_replicas=env.world_size, rank=env.rank, shuffle=False)
                   if env.distributed else None)
    train_loader = DataLoader(train_set, batch_size=cfg.batch_size, sampler=train_sampler,
                              shuffle=train_sampler is None, num_workers=4, pin_memory=True, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=256, sampler=val_sampler, num_workers=4)
    test_loader = DataLoader(test_set, batch_size=256, num_workers=4)
    return train_loader, val_loader, test_loader


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    correct = torch.zeros((), device=device)
    seen = torch.zeros((), device=device)
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        correct += (model(images).argmax(1) == labels).sum()
        seen += labels.numel()
    return (correct / seen).item()


def lr_at(cfg: TrainConfig, epoch: int, step: int, steps_per_epoch: int) -> float:
    t = epoch + step / steps_per_epoch
    if t < cfg.warmup_epochs:
        return cfg.lr * t / cfg.warmup_epochs
    return 0.5 * cfg.lr * (1 + math.cos(math.pi * (t - cfg.warmup_epochs) / (cfg.epochs - cfg.warmup_epochs)))


def main():
    cfg = TrainConfig()
    env = cfg.env
    device = setup(env)
    torch.manual_seed(1234 + env.rank)  # different augmentations on every rank
    if env.is_main:
        log.info("config: %s", cfg)
    train_set, val_set, test_set = build_datasets(cfg)
    train_loader, val_loader, test_loader = build_loaders(cfg, train_set, val_set, test_set)
    model = torchvision.models.resnet18(num_classes=10).to(device)
    if env.distributed:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = DistributedDataParallel(model, device_ids=[env.local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    for epoch in range(cfg.epochs):
        model.train()
        for step, (images, labels) in enumerate(train_loader):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(cfg, epoch, step, len(train_loader))
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 50 == 0:
                log.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
        val_acc = evaluate(model, val_loader, device)
        log.info("epoch %d validation accuracy %.2f%%", epoch, 100 * val_acc)
        if env.is_main:
            torch.save(model.state_dict(), cfg.ckpt)
    if env.is_main:
        test_acc = evaluate(model.module if env.distributed else model, test_loader, device)
        log.info("test accuracy %.2f%%", 100 * test_acc)
    if env.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
