"""GS113: the DeepSpeed config's batches disagree with the loader."""

import argparse

import deepspeed
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

BATCH_SIZE = 16


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    deepspeed.init_distributed()
    config = {
        "train_batch_size": args.batch_size,
        "train_micro_batch_size_per_gpu": 8,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
    }
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)  # expect: GS113
    fixed = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)
    small = DataLoader(dataset, batch_size=4, sampler=sampler)  # expect: GS113
    engine, _, _, _ = deepspeed.initialize(model=torch.nn.Linear(8, 1), config=config)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in [*loader, *fixed, *small]:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()


if __name__ == "__main__":
    main()
