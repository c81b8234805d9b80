"""GS109: the PyTorch ImageNet example's split of the batch over the GPUs of a node (mp.spawn, one
process per GPU): a batch of 250 on 8 GPUs per node trains with 8 x 31 = 248."""

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main_worker(gpu, ngpus_per_node, args):
    rank = args.node_rank * ngpus_per_node + gpu
    dist.init_process_group("gloo", world_size=args.world_size, rank=rank)
    args.batch_size = int(args.batch_size / ngpus_per_node)  # expect: GS109
    eval_batch = args.eval_batch_size // args.nproc_per_node  # expect: GS109
    args.workers = int((args.workers + ngpus_per_node - 1) / ngpus_per_node)
    node = rank // ngpus_per_node
    dataset = TensorDataset(torch.randn(100, 8), torch.randn(100, 1))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    if rank == 0:
        print(f"node {node}, eval batch {eval_batch}")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--eval-batch-size", type=int, default=250)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--node-rank", type=int, default=0)
    args = parser.parse_args()
    ngpus_per_node = max(torch.cuda.device_count(), 1)
    args.world_size = ngpus_per_node
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


if __name__ == "__main__":
    main()
