"""GS114: random splits and shuffles that decide what each rank or split gets, with an unseeded or
per-rank generator; the same done right (own seed, a global seed on every rank, data already sharded,
a mixup permutation of a batch, rank 0 only) is left alone."""

import random

import numpy as np
import torch
import torch.distributed as dist
from datasets import load_dataset
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, Subset, TensorDataset, random_split
from torch.utils.data.distributed import DistributedSampler


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def splits(data):
    train, val = random_split(data, [48, 16])  # expect: GS114
    seeded = random_split(data, [48, 16], generator=torch.Generator().manual_seed(0))
    return train, val, seeded


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    train, val, seeded = splits(data)
    set_seed(7 + rank)
    rows = list(range(64))
    fit_rows, held_rows = train_test_split(rows, test_size=0.25)  # expect: GS114
    random.shuffle(rows)  # expect: GS114
    first, rest = rows[:16], rows[16:]
    mine = rows[rank::world]
    random.shuffle(mine)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    picked = Subset(data, order[:32].tolist())
    reviews = load_dataset("imdb", split="train").shuffle().select(range(1000))  # expect: GS114
    kept = load_dataset("imdb", split="test").shuffle(seed=0).select(range(100))
    if rank == 0:
        random.shuffle(rows)
        preview = rows[:4]
        print(preview)
    loader = DataLoader(train, batch_size=8, sampler=DistributedSampler(train))
    loader.sampler.set_epoch(0)
    for x, y in loader:
        index = torch.randperm(x.size(0))
        mixed = 0.5 * x + 0.5 * x[index]
        del mixed, y
    del val, seeded, fit_rows, held_rows, first, rest, picked, reviews, kept
    dist.destroy_process_group()


def seeded_everywhere():
    set_seed(1234)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    return random_split(data, [48, 16])


if __name__ == "__main__":
    main()
