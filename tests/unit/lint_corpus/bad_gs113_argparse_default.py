"""GS113: the loader's batch is a command-line option whose default (64) disagrees with the DeepSpeed
config's micro batch (32): a run with the defaults is refused or trains another batch."""

import argparse

import deepspeed
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CONFIG = {"train_micro_batch_size_per_gpu": 32, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--eval-batch-size", type=int, default=256)
    args = parser.parse_args()
    deepspeed.init_distributed()
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)  # expect: GS113
    val_loader = DataLoader(data, batch_size=args.eval_batch_size, sampler=DistributedSampler(data, shuffle=False))
    engine, _, _, _ = deepspeed.initialize(model=torch.nn.Linear(8, 2), model_parameters=[], config=CONFIG)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            engine.backward(torch.nn.functional.cross_entropy(engine(x), y))
            engine.step()
    del val_loader


if __name__ == "__main__":
    main()
