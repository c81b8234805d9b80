"""GS109: only a check that the same batch divides by the same number of ranks makes a division exact. The
PyTorch ImageNet example's `int(args.batch_size / ngpus_per_node)` stays a mistake next to an unrelated
`args.rank % ngpus_per_node`, or a check of another batch; a division whose own batch is checked first is right."""

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def per_rank(global_batch, world_size):
    if global_batch % world_size != 0:
        raise ValueError(f"batch {global_batch} does not split over {world_size} ranks")
    return global_batch // world_size


def main_worker(gpu, ngpus_per_node, args):
    args.rank = args.node_rank * ngpus_per_node + gpu
    dist.init_process_group("gloo", world_size=args.world_size, rank=args.rank)
    args.batch_size = int(args.batch_size / ngpus_per_node)  # expect: GS109
    assert args.eval_batch_size % ngpus_per_node == 0, "eval batch must split over the GPUs"
    eval_batch = args.eval_batch_size // ngpus_per_node
    assert args.eval_batch_size % 8 == 0
    test_batch = args.test_batch_size // ngpus_per_node  # expect: GS109
    micro = per_rank(args.micro_batch, args.world_size)
    model = DDP(torch.nn.Linear(4, 1))
    model(torch.randn(args.batch_size, 4)).sum().backward()
    if args.rank % ngpus_per_node == 0:
        print(f"batch {args.batch_size}, eval {eval_batch}, test {test_batch}, micro {micro}")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--eval-batch-size", type=int, default=256)
    parser.add_argument("--test-batch-size", type=int, default=100)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--node-rank", type=int, default=0)
    args = parser.parse_args()
    ngpus_per_node = max(torch.cuda.device_count(), 1)
    args.world_size = ngpus_per_node
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


if __name__ == "__main__":
    main()
