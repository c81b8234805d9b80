"""ImageNet training in the style of the classic example: one GPU, or one process per GPU by mp.spawn.

    python spawn_or_single_imagenet.py /data/imagenet --multiprocessing-distributed --world-size 1 --rank 0
"""
import argparse
import os
import shutil
import time

import torch
import torch.backends.cudnn as cudnn
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.utils.data
import torch.utils.data.distributed
import torchvision.datasets as datasets
import torchvision.models as models
import torchvision.transforms as transforms

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("data", metavar="DIR")
parser.add_argument("-a", "--arch", default="resnet18")
parser.add_argument("-j", "--workers", default=4, type=int)
parser.add_argument("--epochs", default=90, type=int)
parser.add_argument("-b", "--batch-size", default=256, type=int, help="total over all GPUs of the node")
parser.add_argument("--lr", default=0.1, type=float)
parser.add_argument("--print-freq", default=10, type=int)
parser.add_argument("--world-size", default=-1, type=int, help="number of nodes")
parser.add_argument("--rank", default=-1, type=int, help="node rank")
parser.add_argument("--dist-url", default="tcp://224.66.41.62:23456", type=str)
parser.add_argument("--dist-backend", default="nccl", type=str)
parser.add_argument("--gpu", default=None, type=int)
parser.add_argument("--multiprocessing-distributed", action="store_true")

best_acc1 = 0


def main():
    args = parser.parse_args()
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    ngpus_per_node = torch.cuda.device_count()
    if args.multiprocessing_distributed:
        args.world_size = ngpus_per_node * args.world_size
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)


def main_worker(gpu, ngpus_per_node, args):
    global best_acc1
    args.gpu = gpu
    if args.distributed:
        if args.multiprocessing_distributed:
            args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
    print(f"=> creating model '{args.arch}'")
    model = models.__dict__[args.arch]()
    torch.cuda.set_device(args.gpu)
    model.cuda(args.gpu)
    if args.distributed:
        args.batch_size = int(args.batch_size / ngpus_per_node)
        args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    cudnn.benchmark = True

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]))
    val_dataset = datasets.ImageFolder(os.path.join(args.data, "val"), transforms.Compose([
        transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize]))
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    else:
        train_sampler = val_sampler = None
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
                                               num_workers=args.workers, pin_memory=True, sampler=train_sampler)
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False,
                                             num_workers=args.workers, pin_memory=True, sampler=val_sampler)

    for epoch in range(args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        adjust_learning_rate(optimizer, epoch, args)
        train(train_loader, model, criterion, optimizer, epoch, args)
        acc1 = validate(val_loader, model, criterion, args)
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if not args.multiprocessing_distributed or args.rank % ngpus_per_node == 0:
            save_checkpoint({"epoch": epoch + 1, "arch": args.arch, "state_dict": model.state_dict(),
                             "best_acc1": best_acc1, "optimizer": optimizer.state_dict()}, is_best)


class AverageMeter:
    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def all_reduce(self):
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        total = torch.tensor([self.sum, self.count], dtype=torch.float32, device=device)
        dist.all_reduce(total, dist.ReduceOp.SUM, async_op=False)
        self.sum, self.count = total.tolist()
        self.avg = self.sum / self.count


def accuracy(output, target, topk=(1,)):
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / target.size(0)) for k in topk]


def train(train_loader, model, criterion, optimizer, epoch, args):
    losses, top1 = AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f")
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        images, target = images.cuda(args.gpu, non_blocking=True), target.cuda(args.gpu, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        acc1, = accuracy(output, target, topk=(1,))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0].item(), images.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % args.print_freq == 0:
            print(f"Epoch [{epoch}][{i}/{len(train_loader)}] time {time.time() - end:.3f} "
                  f"loss {losses.avg:.4f} acc@1 {top1.avg:.2f}")
        end = time.time()


def validate(val_loader, model, criterion, args):
    top1 = AverageMeter("Acc@1", ":6.2f")
    model.eval()
    with torch.no_grad():
        for images, target in val_loader:
            images, target = images.cuda(args.gpu, non_blocking=True), target.cuda(args.gpu, non_blocking=True)
            acc1, = accuracy(model(images), target, topk=(1,))
            top1.update(acc1[0].item(), images.size(0))
    if args.distributed:
        top1.all_reduce()
    print(f" * Acc@1 {top1.avg:.3f}")
    return top1.avg


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


def adjust_learning_rate(optimizer, epoch, args):
    lr = args.lr * (0.1 ** (epoch // 30))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


if __name__ == "__main__":
    main()
