"""GS103: a worker started by mp.spawn runs on every rank, even where the script also calls it directly for
the single-GPU case (the PyTorch ImageNet example's `main_worker`): its prints, and those of the functions
it calls, are printed once per rank. The launching function's own prints run once."""

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def train_epoch(model, opt, epoch):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")  # expect: GS103


def main_worker(gpu, ngpus_per_node, args):
    if args.distributed:
        dist.init_process_group("gloo", world_size=ngpus_per_node, rank=gpu)
    print("=> creating model")  # expect: GS103
    model = torch.nn.Linear(4, 1)
    if args.distributed:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        train_epoch(model, opt, epoch)
    if args.distributed:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    args = parser.parse_args()
    args.distributed = args.multiprocessing_distributed
    ngpus_per_node = max(torch.cuda.device_count(), 1)
    print(f"{ngpus_per_node} GPUs on this node")
    if args.multiprocessing_distributed:
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(0, ngpus_per_node, args)


if __name__ == "__main__":
    main()
