"""A Hugging Face Accelerate training script (test client).

Written the way the Accelerate documentation writes it: build the model,
optimizer and DataLoader as usual, hand them to ``Accelerator.prepare``, and
replace ``loss.backward()`` with ``accelerator.backward(loss)``.  Gradient
accumulation goes through ``Accelerator(gradient_accumulation_steps=N)`` and
``with accelerator.accumulate(model):``.  It knows nothing of whoever launches
or measures it.

The data are synthetic and deterministic (fixed seed): 256 features, 10
classes, labelled by a fixed random linear "teacher".

Run it:

    python tests/clients/accelerate_script.py --epochs 1
    torchrun --standalone --nproc-per-node 2 tests/clients/accelerate_script.py --batch-size 16 --epochs 2 --samples 2048
    torchrun --standalone --nproc-per-node 2 tests/clients/accelerate_script.py --grad-accum 4

At the end every process prints one line:

    CLIENT rank=<rank> world_size=<world size> steps=<optimizer steps> samples=<training samples> train_s=<seconds>

where steps counts the optimizer steps really taken (micro-batches that ended
an accumulation window, i.e. ``accelerator.sync_gradients`` was true), and
train_s is the process's own training time, timed with ``time.perf_counter``
from just before the first training batch is requested to just after the last
optimizer step really taken (the script has no evaluation loop to leave out).
"""

import argparse
import sys
import time

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

IN_FEATURES = 256
HIDDEN = 1536  # ~9 ms per optimizer step at batch 16 on one CPU core
CLASSES = 10
SEED = 0


def parse_args():
    parser = argparse.ArgumentParser(description="Accelerate test client")
    parser.add_argument("--batch-size", type=int, default=16, help="per-process batch size")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048, help="training set size")
    parser.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
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


def main():
    args = parse_args()
    # As Accelerate's docs write it. On a machine without a GPU, Accelerator()
    # under a plain torchrun leaves each process on its own unless told to use
    # the CPU (ACCELERATE_USE_CPU=1, or cpu=True); gpuscale's launchers set
    # the variable there, as `accelerate launch --cpu` does.
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum)
    set_seed(SEED)

    loader = DataLoader(make_dataset(args.samples), batch_size=args.batch_size, shuffle=True)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    # prepare() moves everything to the right device, wraps the model for DDP
    # and shards the DataLoader's batches across processes.
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    steps = 0
    samples = 0
    model.train()
    start = end = time.perf_counter()  # the training time: first batch requested .. last optimizer step
    for _epoch in range(args.epochs):
        for inputs, targets in loader:
            with accelerator.accumulate(model):
                loss = loss_fn(model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            samples += inputs.shape[0]
            # Inside accumulate() the prepared optimizer only really steps on
            # the micro-batch that closes an accumulation window.
            if accelerator.sync_gradients:
                end = time.perf_counter()
                steps += 1

    accelerator.wait_for_everyone()
    # One write call, so lines from concurrent processes never interleave.
    sys.stdout.write(
        f"CLIENT rank={accelerator.process_index} world_size={accelerator.num_processes} "
        f"steps={steps} samples={samples} train_s={end - start:.4f}\n"
    )
    sys.stdout.flush()
    accelerator.end_training()


if __name__ == "__main__":
    main()
