"""A vision-transformer training main in the style of DeiT-like research code: every process evaluates, and the
validation set is sharded only when --dist-eval is given (it is off by default). Its helpers module is not
here: `print(..., force=True)` shows that it replaced print."""

import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist
import torchvision.datasets as datasets
import torchvision.transforms as transforms
from torchvision.models import vit_b_16

import utils  # the project's helpers (not in this corpus): init_distributed_mode replaces print, as DeiT's does


def get_args_parser():
    parser = argparse.ArgumentParser("DeiT-style training and evaluation script", add_help=False)
    parser.add_argument("--batch-size", default=64, type=int)
    parser.add_argument("--epochs", default=300, type=int)
    parser.add_argument("--data-path", default="/datasets01/imagenet_full_size/061417/", type=str)
    parser.add_argument("--dist-eval", action="store_true", default=False, help="enable distributed evaluation")
    parser.add_argument("--num_workers", default=10, type=int)
    parser.add_argument("--output_dir", default="")
    return parser


@torch.no_grad()
def evaluate(data_loader, model, device):
    criterion = torch.nn.CrossEntropyLoss()
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for images, target in data_loader:
        images, target = images.to(device, non_blocking=True), target.to(device, non_blocking=True)
        output = model(images)
        loss_sum += criterion(output, target).item() * images.shape[0]
        correct += (output.argmax(1) == target).sum().item()
        total += images.shape[0]
    stats = torch.tensor([correct, total, loss_sum], device=device)
    dist.all_reduce(stats)
    return {"acc1": 100.0 * stats[0].item() / stats[1].item(), "loss": stats[2].item() / stats[1].item()}


def main(args):
    utils.init_distributed_mode(args)
    rank, world_size = utils.get_rank(), utils.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.manual_seed(0 + rank)

    transform = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
    dataset_train = datasets.ImageFolder(f"{args.data_path}/train", transform=transform)
    dataset_val = datasets.ImageFolder(f"{args.data_path}/val", transform=transforms.Compose([
        transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor()]))
    sampler_train = torch.utils.data.DistributedSampler(dataset_train, num_replicas=world_size, rank=rank, shuffle=True)
    sampler_val = (torch.utils.data.DistributedSampler(dataset_val, num_replicas=world_size, rank=rank, shuffle=False)
                   if args.dist_eval else torch.utils.data.SequentialSampler(dataset_val))
    data_loader_train = torch.utils.data.DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size,
                                                    num_workers=args.num_workers, pin_memory=True, drop_last=True)
    data_loader_val = torch.utils.data.DataLoader(dataset_val, sampler=sampler_val, batch_size=int(1.5 * args.batch_size),
                                                  num_workers=args.num_workers, pin_memory=True, drop_last=False)

    model = vit_b_16(num_classes=1000).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4 * args.batch_size * world_size / 512.0, weight_decay=0.05)
    criterion = torch.nn.CrossEntropyLoss()

    print(f"Start training for {args.epochs} epochs", force=True)
    start_time = time.time()
    max_accuracy = 0.0
    for epoch in range(args.epochs):
        sampler_train.set_epoch(epoch)
        model.train()
        for samples, targets in data_loader_train:
            samples, targets = samples.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            loss = criterion(model(samples), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        test_stats = evaluate(data_loader_val, model, device)
        print(f"Accuracy of the network on the {len(dataset_val)} test images: {test_stats['acc1']:.1f}%")
        max_accuracy = max(max_accuracy, test_stats["acc1"])
        print(f"Max accuracy: {max_accuracy:.2f}%")
        if args.output_dir and rank == 0:
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, f"{args.output_dir}/checkpoint.pth")
            with open(f"{args.output_dir}/log.txt", "a") as f:
                f.write(json.dumps({"epoch": epoch, **test_stats}) + "\n")
    total_time = time.time() - start_time
    print("Training time {}".format(str(datetime.timedelta(seconds=int(total_time)))))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(get_args_parser().parse_args())
