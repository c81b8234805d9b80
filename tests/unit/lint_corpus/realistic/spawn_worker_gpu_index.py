"""ImageNet-style training with one process per GPU started by mp.spawn; the worker's first parameter is the GPU
index spawn passes (called `gpu` here, as in many research mains), and the first process logs and saves."""

import argparse
import os
import shutil
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torchvision.datasets as datasets
import torchvision.models as models
import torchvision.transforms as transforms

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("data", metavar="DIR")
parser.add_argument("--arch", default="resnet18")
parser.add_argument("--epochs", default=90, type=int)
parser.add_argument("--batch-size", default=256, type=int, help="total over all GPUs of the node")
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("--workers", default=4, type=int)
parser.add_argument("--dist-url", default="env://")


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


def main():
    args = parser.parse_args()
    ngpus_per_node = torch.cuda.device_count()
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


def main_worker(gpu, ngpus_per_node, args):
    dist.init_process_group(backend="nccl", init_method=args.dist_url, world_size=ngpus_per_node, rank=gpu)
    torch.cuda.set_device(gpu)
    if gpu == 0:
        print("=> creating model '{}'".format(args.arch))
    model = models.__dict__[args.arch]().cuda(gpu)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
    batch_size = int(args.batch_size / ngpus_per_node)
    workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
    criterion = nn.CrossEntropyLoss().cuda(gpu)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]))
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                                               pin_memory=True, sampler=train_sampler)

    best_loss = float("inf")
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        end = time.time()
        running = 0.0
        for i, (images, target) in enumerate(train_loader):
            images, target = images.cuda(gpu, non_blocking=True), target.cuda(gpu, non_blocking=True)
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += loss.item()
            if gpu == 0 and i % 100 == 0:
                print("Epoch [{}][{}/{}] loss {:.3f} time {:.3f}".format(epoch, i, len(train_loader), loss.item(),
                                                                          time.time() - end))
            end = time.time()
        epoch_loss = running / len(train_loader)
        if gpu == 0:
            is_best = epoch_loss < best_loss
            best_loss = min(epoch_loss, best_loss)
            save_checkpoint({"epoch": epoch + 1, "arch": args.arch, "state_dict": model.state_dict(),
                             "best_loss": best_loss, "optimizer": optimizer.state_dict()}, is_best)
            print("epoch {} mean loss {:.4f}".format(epoch, epoch_loss))


if __name__ == "__main__":
    main()
