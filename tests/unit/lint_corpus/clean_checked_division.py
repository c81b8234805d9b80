"""Clean: every division of a batch by the number of ranks is checked, for the same batch and the same
divisor: an assert, an `if ... != 0: raise` (also through a name that holds the world size), a check in the
launching function before the batch is handed to the workers, `share * ranks == batch`, or a remainder handed
out explicitly."""

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def main_worker(rank, world_size, args):
    dist.init_process_group("gloo", world_size=world_size, rank=rank)
    ws = dist.get_world_size()
    if args.batch_size % ws != 0:
        raise SystemExit(f"--batch-size {args.batch_size} must divide by {ws}")
    batch = args.batch_size // dist.get_world_size()
    per_node = args.eval_batch_size // args.gpus
    extra = 1 if rank < args.test_batch_size % world_size else 0
    test_batch = args.test_batch_size // world_size + extra
    micro = args.micro_batch // world_size
    assert micro * world_size == args.micro_batch, "the micro batch must split over the ranks"
    model = DDP(torch.nn.Linear(4, 1))
    model(torch.randn(batch, 4)).sum().backward()
    if rank == 0:
        print(f"batch {batch}, eval {per_node}, test {test_batch}, micro {micro}")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--eval-batch-size", type=int, default=256)
    parser.add_argument("--test-batch-size", type=int, default=100)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args()
    assert args.eval_batch_size % args.gpus == 0, "the eval batch must split over the GPUs"
    mp.spawn(main_worker, nprocs=args.gpus, args=(args.gpus, args))


if __name__ == "__main__":
    main()
