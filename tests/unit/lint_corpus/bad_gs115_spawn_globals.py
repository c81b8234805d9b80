"""GS115: mp.spawn's children import the script as __mp_main__: names assigned only under
`if __name__ == "__main__":` do not exist in them. Module-level names, parameters and the
launching process's own functions are right."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

CHECKPOINT_EVERY = 2


def describe(world_size):
    return f"{world_size} processes, seed {args.seed}"


class Trainer:
    def __init__(self, rank):
        self.model = DDP(torch.nn.Linear(4, 1))
        self.rank = rank

    def save(self, epoch):
        if self.rank == 0 and epoch % CHECKPOINT_EVERY == 0:
            torch.save(self.model.module.state_dict(), os.path.join(args.out, "last.pt"))  # expect: GS115


def worker(rank, world_size, port, lr):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(args.seed)  # expect: GS115
    trainer = Trainer(rank)
    opt = torch.optim.SGD(trainer.model.parameters(), lr=lr)
    for epoch in range(args.epochs):
        trainer.model(torch.randn(8, 4)).sum().backward()
        opt.step()
        trainer.save(epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    print(describe(2))
    mp.spawn(worker, args=(2, args.port, 0.1), nprocs=2)
