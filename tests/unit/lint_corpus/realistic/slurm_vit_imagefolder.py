"""Fine-tune a ViT-B/16 on an ImageFolder dataset, one task per GPU started by srun (SLURM variables).

    srun --ntasks-per-node=8 --gpus-per-node=8 python slurm_vit_imagefolder.py --data /flash/images
"""
import argparse
import os
import subprocess
import time

import torch
import torch.distributed as dist
import torchvision.transforms as transforms
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, random_split
from torch.utils.data.distributed import DistributedSampler
from torchvision.datasets import ImageFolder
from torchvision.models import vit_b_16


def parse_args():
    parser = argparse.ArgumentParser(description="ViT fine-tuning under SLURM")
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per GPU")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--workers", type=int, default=7)
    parser.add_argument("--output", default="vit_finetuned.pth")
    return parser.parse_args()


def master_address():
    nodes = subprocess.check_output(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]])
    return nodes.decode().split()[0]


def init_distributed():
    rank = int(os.environ["SLURM_PROCID"])
    world_size = int(os.environ["SLURM_NTASKS"])
    local_rank = int(os.environ["SLURM_LOCALID"])
    dist.init_process_group(backend="nccl", init_method=f"tcp://{master_address()}:29500",
                            rank=rank, world_size=world_size)
    torch.cuda.set_device(local_rank)
    return rank, world_size, local_rank


def make_datasets(root):
    transform = transforms.Compose([
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ])
    full = ImageFolder(root, transform=transform)
    n_train = int(0.8 * len(full))
    return random_split(full, [n_train, len(full) - n_train], generator=torch.Generator().manual_seed(42))


def train(model, criterion, optimizer, train_loader, train_sampler, val_loader, epochs, rank, device):
    start = time.time()
    for epoch in range(epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        running_loss = 0.0
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
        if rank == 0:
            print(f"Epoch {epoch + 1}, loss: {running_loss / len(train_loader):.4f}")

        model.eval()
        correct, total = 0, 0
        with torch.no_grad():
            for images, labels in val_loader:
                images, labels = images.to(device), labels.to(device)
                _, predicted = torch.max(model(images), 1)
                total += labels.size(0)
                correct += (predicted == labels).sum().item()
        if rank == 0:
            print(f"Validation accuracy: {100 * correct / total:.2f}%")
    if rank == 0:
        print(f"Time elapsed (s): {time.time() - start:.1f}")


def main():
    args = parse_args()
    rank, world_size, local_rank = init_distributed()
    device = torch.device("cuda", local_rank)
    print(f"rank {rank}/{world_size} on {os.uname().nodename}, GPU {local_rank}")

    train_set, val_set = make_datasets(args.data)
    train_sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, sampler=train_sampler, batch_size=args.batch_size, num_workers=args.workers)
    val_sampler = DistributedSampler(val_set, shuffle=False)
    val_loader = DataLoader(val_set, sampler=val_sampler, batch_size=args.batch_size, num_workers=args.workers)

    model = vit_b_16(weights="DEFAULT")
    model.heads.head = torch.nn.Linear(model.heads.head.in_features, len(train_set.dataset.classes))
    model = DistributedDataParallel(model.to(device), device_ids=[local_rank])
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    train(model, criterion, optimizer, train_loader, train_sampler, val_loader, args.epochs, rank, device)
    if rank == 0:
        torch.save(model.module.state_dict(), args.output)


if __name__ == "__main__":
    main()
