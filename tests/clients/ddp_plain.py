"""A plain PyTorch DistributedDataParallel training script (test client).

Written the way the PyTorch DDP tutorial writes it: one process per device,
``init_process_group``, a ``DistributedSampler`` feeding a ``DataLoader``, the
model wrapped in ``DDP``, ``sampler.set_epoch(epoch)`` every epoch and an
ordinary zero_grad / backward / step loop.  It knows nothing of whoever
launches or measures it.

The data are synthetic and deterministic (fixed seed): 256 features, 10
classes, labelled by a fixed random linear "teacher" so the loss goes down.

Run it:

    python tests/clients/ddp_plain.py --epochs 1
    torchrun --standalone --nproc-per-node 2 tests/clients/ddp_plain.py --batch-size 16 --epochs 2 --samples 2048

Without torchrun (no RANK in the environment) it trains as a single process
with no process group and no DDP wrapper.  At the end every rank prints one
line:

    CLIENT rank=<rank> world_size=<world size> steps=<optimizer steps> samples=<training samples> train_s=<seconds>

where train_s is the rank's own training time, timed with ``time.perf_counter``
from just before the first training batch is requested to just after the last
``optimizer.step()`` (the script has no evaluation loop to leave out).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

IN_FEATURES = 256
HIDDEN = 1536  # ~9 ms per optimizer step at batch 16 on one CPU core
CLASSES = 10
SEED = 0


def parse_args():
    parser = argparse.ArgumentParser(description="plain DDP test client")
    parser.add_argument("--batch-size", type=int, default=16, help="per-process batch size")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048, help="training set size")
    return parser.parse_args()


def make_dataset(n):
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, IN_FEATURES, generator=gen)
    teacher = torch.randn(IN_FEATURES, CLASSES, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    return TensorDataset(x, y)


def make_model():
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def setup():
    """Join the process group when launched by torchrun; else run alone."""
    if "RANK" not in os.environ:
        return False, 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl")
        device = torch.device("cuda", local_rank)
    else:
        dist.init_process_group(backend="gloo")
        device = torch.device("cpu")
    return True, dist.get_rank(), dist.get_world_size(), device


def main():
    args = parse_args()
    distributed, rank, world_size, device = setup()
    torch.manual_seed(SEED)

    dataset = make_dataset(args.samples)
    # Without a process group the sampler needs to be told the world explicitly.
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, pin_memory=device.type == "cuda")

    model = make_model().to(device)
    if distributed:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    steps = 0
    samples = 0
    model.train()
    start = end = time.perf_counter()  # the training time: first batch requested .. last optimizer step
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            end = time.perf_counter()
            steps += 1
            samples += inputs.shape[0]

    # One write call, so lines from concurrent ranks never interleave.
    sys.stdout.write(
        f"CLIENT rank={rank} world_size={world_size} steps={steps} samples={samples} train_s={end - start:.4f}\n"
    )
    sys.stdout.flush()

    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
