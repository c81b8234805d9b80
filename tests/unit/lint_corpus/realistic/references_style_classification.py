"""Image classification in the style of the torchvision reference scripts: small distributed helpers,
a metric logger, `torchrun --nproc_per_node=8 references_style_classification.py --data-path /imagenet`."""
import builtins
import datetime
import os
import time
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.utils.data
import torchvision
from torch import nn
from torchvision.transforms import v2 as T


def setup_for_distributed(is_master):
    """Silence print() on every process but the master (print(..., force=True) still prints)."""
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def is_dist_avail_and_initialized():
    return dist.is_available() and dist.is_initialized()


def get_rank():
    return dist.get_rank() if is_dist_avail_and_initialized() else 0


def is_main_process():
    return get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    else:
        print("Not using distributed mode")
        args.distributed = False
        return
    args.distributed = True
    torch.cuda.set_device(args.gpu)
    print(f"| distributed init (rank {args.rank})", flush=True)
    dist.init_process_group(backend="nccl", init_method="env://", world_size=args.world_size, rank=args.rank)
    dist.barrier()
    setup_for_distributed(args.rank == 0)


class SmoothedValue:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def update(self, value, n=1):
        self.total += value * n
        self.count += n

    def synchronize_between_processes(self):
        if not is_dist_avail_and_initialized():
            return
        t = torch.tensor([self.count, self.total], dtype=torch.float64, device="cuda")
        dist.barrier()
        dist.all_reduce(t)
        self.count, self.total = int(t[0].item()), t[1].item()

    @property
    def global_avg(self):
        return self.total / max(self.count, 1)


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, print_freq):
    model.train()
    meters = defaultdict(SmoothedValue)
    start = time.time()
    for i, (image, target) in enumerate(data_loader):
        image, target = image.to(device, non_blocking=True), target.to(device, non_blocking=True)
        loss = criterion(model(image), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        meters["loss"].update(loss.item(), image.shape[0])
        if i % print_freq == 0:
            print(f"Epoch [{epoch}] [{i}/{len(data_loader)}] loss {meters['loss'].global_avg:.4f}")
    print(f"Epoch [{epoch}] took {datetime.timedelta(seconds=int(time.time() - start))}")


def evaluate(model, criterion, data_loader, device):
    model.eval()
    meters = defaultdict(SmoothedValue)
    with torch.inference_mode():
        for image, target in data_loader:
            image, target = image.to(device, non_blocking=True), target.to(device, non_blocking=True)
            output = model(image)
            acc1 = (output.argmax(1) == target).float().mean().item() * 100
            meters["loss"].update(criterion(output, target).item(), image.shape[0])
            meters["acc1"].update(acc1, image.shape[0])
    for meter in meters.values():
        meter.synchronize_between_processes()
    print(f"Test: Acc@1 {meters['acc1'].global_avg:.3f} loss {meters['loss'].global_avg:.4f}")
    return meters["acc1"].global_avg


def load_data(traindir, valdir, args):
    train_tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToImage(), T.ToDtype(torch.float, scale=True)])
    val_tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToImage(), T.ToDtype(torch.float, scale=True)])
    dataset = torchvision.datasets.ImageFolder(traindir, train_tf)
    dataset_test = torchvision.datasets.ImageFolder(valdir, val_tf)
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    else:
        train_sampler = torch.utils.data.RandomSampler(dataset)
    test_sampler = torch.utils.data.SequentialSampler(dataset_test)
    return dataset, dataset_test, train_sampler, test_sampler


def main(args):
    init_distributed_mode(args)
    print(args)
    device = torch.device(args.device)
    dataset, dataset_test, train_sampler, test_sampler = load_data(
        os.path.join(args.data_path, "train"), os.path.join(args.data_path, "val"), args)
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler,
                                              num_workers=args.workers, pin_memory=True)
    data_loader_test = torch.utils.data.DataLoader(dataset_test, batch_size=args.batch_size, sampler=test_sampler,
                                                   num_workers=args.workers, pin_memory=True)
    model = torchvision.models.get_model(args.model, num_classes=len(dataset.classes)).to(device)
    model_without_ddp = model
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
        model_without_ddp = model.module
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)

    best_acc = 0.0
    for epoch in range(args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        train_one_epoch(model, criterion, optimizer, data_loader, device, epoch, args.print_freq)
        scheduler.step()
        acc = evaluate(model, criterion, data_loader_test, device)
        checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "lr_scheduler": scheduler.state_dict(), "epoch": epoch, "args": args}
        save_on_master(checkpoint, os.path.join(args.output_dir, f"model_{epoch}.pth"))
        if acc > best_acc:
            best_acc = acc
            save_on_master(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))
    print(f"best Acc@1 {best_acc:.3f}")
    if args.distributed:
        dist.destroy_process_group()


def get_args_parser():
    import argparse
    parser = argparse.ArgumentParser(description="Classification training", add_help=True)
    parser.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("-b", "--batch-size", default=32, type=int, help="images per gpu")
    parser.add_argument("--epochs", default=90, type=int)
    parser.add_argument("-j", "--workers", default=16, type=int)
    parser.add_argument("--lr", default=0.1, type=float)
    parser.add_argument("--print-freq", default=10, type=int)
    parser.add_argument("--output-dir", default=".")
    return parser


if __name__ == "__main__":
    main(get_args_parser().parse_args())
