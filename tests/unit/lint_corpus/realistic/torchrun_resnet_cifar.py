"""ResNet-18 on CIFAR-10 with DDP, launched by torchrun (one process per GPU), mixed precision.

    torchrun --nproc-per-node 4 torchrun_resnet_cifar.py --global-batch 512 --epochs 30
"""
import argparse
import logging
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
log = logging.getLogger("cifar")


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/scratch/cifar10")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", default="")
    p.add_argument("--out", default="checkpoints")
    return p.parse_args()


def build_loaders(args, rank, world_size, local_world_size):
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])
    test_tf = T.Compose([T.ToTensor(), T.Normalize(mean, std)])
    train_set = torchvision.datasets.CIFAR10(args.data, train=True, transform=train_tf)
    test_set = torchvision.datasets.CIFAR10(args.data, train=False, transform=test_tf)
    per_gpu = args.global_batch // world_size
    num_workers = max(1, os.cpu_count() // local_world_size)
    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    test_sampler = DistributedSampler(test_set, num_replicas=world_size, rank=rank, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=per_gpu, sampler=train_sampler, num_workers=num_workers,
                              pin_memory=True, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=per_gpu, sampler=test_sampler, num_workers=num_workers)
    return train_loader, test_loader, train_sampler


def train_one_epoch(model, loader, optimizer, scaler, device):
    model.train()
    criterion = nn.CrossEntropyLoss()
    total, count = torch.zeros((), device=device), 0
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        total += loss.detach() * labels.size(0)
        count += labels.size(0)
    return total / count


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    stats = torch.zeros(2, device=device)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        preds = model(images).argmax(dim=1)
        stats[0] += (preds == labels).sum()
        stats[1] += labels.numel()
    dist.all_reduce(stats, op=dist.ReduceOp.SUM)
    return (stats[0] / stats[1]).item()


def main():
    args = get_args()
    dist.init_process_group(backend="nccl")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.manual_seed(args.seed + rank)

    train_loader, test_loader, train_sampler = build_loaders(args, rank, world_size, local_world_size)
    model = torchvision.models.resnet18(num_classes=10).to(device)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=[local_rank])
    lr = args.lr * args.global_batch / 256
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    scaler = torch.cuda.amp.GradScaler()

    start_epoch = 0
    if args.resume:
        ckpt = torch.load(args.resume)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch = ckpt["epoch"] + 1

    best = 0.0
    for epoch in range(start_epoch, args.epochs):
        train_sampler.set_epoch(epoch)
        t0 = time.time()
        loss = train_one_epoch(model, train_loader, optimizer, scaler, device)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        scheduler.step()
        acc = evaluate(model, test_loader, device)
        log.info("epoch %d loss %.4f test acc %.4f (%.1fs)", epoch, loss.item(), acc, time.time() - t0)
        if rank == 0 and acc > best:
            best = acc
            os.makedirs(args.out, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                       os.path.join(args.out, "best.pt"))
    if rank == 0:
        log.info("best test accuracy %.4f", best)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
