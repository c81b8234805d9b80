"""Cassava leaf disease classifier (Kaggle style): a CSV of image ids, timm model, torchrun on one node.

    torchrun --nproc_per_node 2 kaggle_style_leaf_classifier.py --csv train.csv --images train_images/
"""
import argparse
import os
import random

import cv2
import numpy as np
import pandas as pd
import timm
import torch
import torch.distributed as dist
import torch.nn as nn
from sklearn.metrics import accuracy_score
from sklearn.model_selection import train_test_split
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def seed_everything(seed):
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)


class LeafDataset(Dataset):
    def __init__(self, df, image_dir, size, train=True):
        self.ids = df["image_id"].values
        self.labels = df["label"].values
        self.image_dir = image_dir
        self.size = size
        self.train = train

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, idx):
        image = cv2.imread(os.path.join(self.image_dir, self.ids[idx]))
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        image = cv2.resize(image, (self.size, self.size)).astype(np.float32) / 255.0
        if self.train and random.random() < 0.5:
            image = image[:, ::-1].copy()
        return torch.from_numpy(image).permute(2, 0, 1), torch.tensor(self.labels[idx])


def train_epoch(model, loader, optimizer, scaler, criterion, device):
    model.train()
    losses = []
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad()
        with torch.cuda.amp.autocast():
            loss = criterion(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return float(np.mean(losses))


def valid_epoch(model, loader, device):
    model.eval()
    preds, targets = [], []
    with torch.no_grad():
        for images, labels in loader:
            preds.append(model(images.to(device)).argmax(1).cpu().numpy())
            targets.append(labels.numpy())
    return accuracy_score(np.concatenate(targets), np.concatenate(preds))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv", default="train.csv")
    parser.add_argument("--images", default="train_images")
    parser.add_argument("--model", default="tf_efficientnet_b3_ns")
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=719)
    parser.add_argument("--resume", default="")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    seed_everything(args.seed + local_rank)

    df = pd.read_csv(args.csv)
    train_df, valid_df = train_test_split(df, test_size=0.2, stratify=df["label"])
    train_ds = LeafDataset(train_df, args.images, args.size, train=True)
    valid_ds = LeafDataset(valid_df, args.images, args.size, train=False)
    train_sampler = DistributedSampler(train_ds, shuffle=True)
    train_loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=train_sampler, num_workers=4,
                              pin_memory=True, drop_last=True)
    valid_loader = DataLoader(valid_ds, batch_size=args.batch_size * 2, shuffle=False, num_workers=4)

    model = timm.create_model(args.model, pretrained=True, num_classes=df["label"].nunique()).to(device)
    if args.resume:
        model.load_state_dict(torch.load(args.resume, map_location="cuda:0"))
    model = DDP(model, device_ids=[local_rank], output_device=local_rank)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * dist.get_world_size())
    scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=10, eta_min=1e-6)
    scaler = torch.cuda.amp.GradScaler()
    criterion = nn.CrossEntropyLoss()

    best_acc = 0.0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        avg_loss = train_epoch(model, train_loader, optimizer, scaler, criterion, device)
        scheduler.step()
        print(f"Epoch {epoch} train loss {avg_loss:.4f}")
        acc = valid_epoch(model, valid_loader, device)
        if local_rank == 0:
            print(f"Epoch {epoch} valid accuracy {acc:.4f}")
            if acc > best_acc:
                best_acc = acc
                torch.save(model.module.state_dict(), f"{args.model}_best.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
