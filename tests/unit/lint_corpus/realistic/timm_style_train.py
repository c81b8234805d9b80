#!/usr/bin/env python3
"""Image classification training in the style of timm's train.py: args.distributed, reduce_tensor,
distributed validation, mixup, a model EMA, primary-rank logging and checkpoints.

    torchrun --nproc_per_node=8 timm_style_train.py /data/flowers --model resnet50 -b 64 --epochs 100
"""
import argparse
import logging
import os
import random
import time
from collections import OrderedDict

import numpy as np
import timm
import torch
import torch.distributed as dist
import torch.nn as nn
from timm.data import create_transform
from timm.utils import ModelEmaV2, accuracy
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision.datasets.folder import default_loader

_logger = logging.getLogger("train")

parser = argparse.ArgumentParser(description="PyTorch ImageNet-style training")
parser.add_argument("data_dir", metavar="DIR")
parser.add_argument("--model", default="resnet50", type=str)
parser.add_argument("-b", "--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--val-fraction", type=float, default=0.1)
parser.add_argument("--mixup-prob", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--output", default="./output")
parser.add_argument("--log-interval", type=int, default=50)


class FileListDataset(torch.utils.data.Dataset):
    def __init__(self, samples, transform):
        self.samples, self.transform = samples, transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        return self.transform(default_loader(path)), target


def random_seed(seed=42, rank=0):
    torch.manual_seed(seed + rank)
    np.random.seed(seed + rank)
    random.seed(seed + rank)


def reduce_tensor(tensor, n):
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.ReduceOp.SUM)
    return rt / n


def list_samples(root):
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    return [(os.path.join(root, c, f), i) for i, c in enumerate(classes) for f in sorted(os.listdir(os.path.join(root, c)))]


def mixup(x, y, alpha=0.2):
    lam = float(np.random.beta(alpha, alpha))
    index = torch.randperm(x.size(0), device=x.device)
    return lam * x + (1 - lam) * x[index], y, y[index], lam


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, model_ema=None):
    model.train()
    for batch_idx, (input, target) in enumerate(loader):
        input, target = input.cuda(non_blocking=True), target.cuda(non_blocking=True)
        if random.random() < args.mixup_prob:
            input, y_a, y_b, lam = mixup(input, target)
            output = model(input)
            loss = lam * loss_fn(output, y_a) + (1 - lam) * loss_fn(output, y_b)
        else:
            loss = loss_fn(model(input), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if model_ema is not None:
            model_ema.update(model)
        if batch_idx % args.log_interval == 0:
            reduced_loss = reduce_tensor(loss.data, args.world_size) if args.distributed else loss.data
            if args.rank == 0:
                _logger.info(f"Train: {epoch} [{batch_idx}/{len(loader)}] loss {reduced_loss.item():.4f}")
    return OrderedDict([("loss", loss.item())])


def validate(model, loader, loss_fn, args):
    model.eval()
    top1_sum, loss_sum, n = 0.0, 0.0, 0
    with torch.no_grad():
        for input, target in loader:
            input, target = input.cuda(), target.cuda()
            output = model(input)
            acc1, = accuracy(output, target, topk=(1,))
            loss = loss_fn(output, target)
            if args.distributed:
                acc1 = reduce_tensor(acc1, args.world_size)
                loss = reduce_tensor(loss.data, args.world_size)
            top1_sum += acc1.item() * input.size(0)
            loss_sum += loss.item() * input.size(0)
            n += input.size(0)
    return OrderedDict([("loss", loss_sum / n), ("top1", top1_sum / n)])


def main():
    logging.basicConfig(level=logging.INFO)
    args = parser.parse_args()
    args.distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    args.rank, args.world_size, args.local_rank = 0, 1, 0
    if args.distributed:
        args.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(args.local_rank)
        dist.init_process_group(backend="nccl", init_method="env://")
        args.world_size, args.rank = dist.get_world_size(), dist.get_rank()
        _logger.info(f"Training in distributed mode. Process {args.rank}, total {args.world_size}.")
    random_seed(args.seed, args.rank)

    samples = list_samples(args.data_dir)
    random.shuffle(samples)
    n_val = int(len(samples) * args.val_fraction)
    dataset_train = FileListDataset(samples[n_val:], create_transform(224, is_training=True))
    dataset_eval = FileListDataset(samples[:n_val], create_transform(224, is_training=False))
    sampler_train = DistributedSampler(dataset_train) if args.distributed else None
    sampler_eval = DistributedSampler(dataset_eval, shuffle=False) if args.distributed else None
    loader_train = DataLoader(dataset_train, batch_size=args.batch_size, shuffle=sampler_train is None,
                              sampler=sampler_train, num_workers=8, pin_memory=True, drop_last=True)
    loader_eval = DataLoader(dataset_eval, batch_size=args.batch_size * 2, sampler=sampler_eval, num_workers=8)

    model = timm.create_model(args.model, pretrained=True, num_classes=len({t for _, t in samples})).cuda()
    model_ema = ModelEmaV2(model, decay=0.9998)
    if args.distributed:
        model = NativeDDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    loss_fn = nn.CrossEntropyLoss().cuda()

    best_metric = None
    os.makedirs(args.output, exist_ok=True)
    for epoch in range(args.epochs):
        if args.distributed:
            sampler_train.set_epoch(epoch)
        start = time.time()
        train_metrics = train_one_epoch(epoch, model, loader_train, optimizer, loss_fn, args, model_ema=model_ema)
        eval_metrics = validate(model, loader_eval, loss_fn, args)
        ema_metrics = validate(model_ema.module, loader_eval, loss_fn, args)
        scheduler.step()
        if args.rank == 0:
            _logger.info(f"epoch {epoch}: train loss {train_metrics['loss']:.4f} top1 {eval_metrics['top1']:.2f} "
                         f"ema top1 {ema_metrics['top1']:.2f} ({time.time() - start:.0f}s)")
            if best_metric is None or eval_metrics["top1"] > best_metric:
                best_metric = eval_metrics["top1"]
                torch.save({"epoch": epoch, "state_dict": model.state_dict(), "state_dict_ema": model_ema.module.state_dict(),
                            "optimizer": optimizer.state_dict(), "metric": best_metric},
                           os.path.join(args.output, "model_best.pth.tar"))
    if args.distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
