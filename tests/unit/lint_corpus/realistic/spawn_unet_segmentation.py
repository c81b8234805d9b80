"""U-Net segmentation of microscopy images with DDP, one process per GPU started by mp.spawn.

    python spawn_unet_segmentation.py --images data/imgs --masks data/masks --epochs 40
"""
import argparse
import glob
import os
import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter


class TileDataset(Dataset):
    def __init__(self, image_paths, mask_dir):
        self.image_paths = image_paths
        self.mask_dir = mask_dir

    def __len__(self):
        return len(self.image_paths)

    def __getitem__(self, i):
        name = os.path.basename(self.image_paths[i])
        image = np.asarray(Image.open(self.image_paths[i]).convert("L"), dtype=np.float32) / 255.0
        mask = np.asarray(Image.open(os.path.join(self.mask_dir, name)), dtype=np.int64) > 0
        return torch.from_numpy(image)[None], torch.from_numpy(mask.astype(np.int64))


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.down1, self.down2, self.bottom = block(1, width), block(width, 2 * width), block(2 * width, 4 * width)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2), block(4 * width, 2 * width)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2), block(2 * width, width)
        self.head = nn.Conv2d(width, 2, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        b = self.bottom(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], 1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], 1))
        return self.head(u1)


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def dice(logits, target):
    pred = logits.argmax(1)
    inter = ((pred == 1) & (target == 1)).sum().float()
    return (2 * inter + 1) / ((pred == 1).sum() + (target == 1).sum() + 1)


def train(rank, world_size, port, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)

    paths = sorted(glob.glob(os.path.join(args.images, "*.png")))
    n_val = len(paths) // 10
    train_set, val_set = TileDataset(paths[n_val:], args.masks), TileDataset(paths[:n_val], args.masks)
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, num_workers=4, pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=args.batch_size, num_workers=2)

    model = nn.SyncBatchNorm.convert_sync_batchnorm(UNet()).cuda(rank)
    model = DDP(model, device_ids=[rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for step, (x, y) in enumerate(train_loader):
            x, y = x.cuda(rank, non_blocking=True), y.cuda(rank, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0:
                writer.add_scalar("train/loss", loss.item(), epoch * len(train_loader) + step)
        model.eval()
        scores = []
        with torch.no_grad():
            for x, y in val_loader:
                scores.append(dice(model(x.cuda(rank)), y.cuda(rank)).item())
        print(f"epoch {epoch}: validation dice {np.mean(scores):.4f}")
        torch.save(model.module.state_dict(), os.path.join(args.out, "unet_last.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", required=True)
    parser.add_argument("--masks", required=True)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--out", default="unet-runs")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    writer = SummaryWriter(os.path.join(args.out, "tb"))
    world_size = torch.cuda.device_count()
    mp.spawn(train, args=(world_size, free_port(), args), nprocs=world_size, join=True)
    writer.close()
