"""A data-parallel workload whose step is compute plus a sizeable gradient all-reduce: the prediction's test bed.

In-memory random data (no loader time), an MLP of --hidden units (about 2 * hidden^2 parameters),
SGD, --steps optimizer steps after --warmup unmeasured ones; summary.json in --out.
"""

import argparse

import torch
from torch import nn

import gpuscale

parser = argparse.ArgumentParser()
parser.add_argument("--scaling", choices=("weak", "strong"), default="weak")
parser.add_argument("--out", required=True)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--hidden", type=int, default=768)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--strategy", default="ddp")
args = parser.parse_args()

torch.manual_seed(0)
with gpuscale.init() as rt:
    plan = gpuscale.plan_batch(args.batch_size, rt.world_size, scaling=args.scaling)
    model = nn.Sequential(nn.Linear(256, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    training = gpuscale.setup(model, lambda p: torch.optim.SGD(p, lr=0.01), plan=plan, strategy=args.strategy)
    total = (args.steps + args.warmup) * plan.global_batch
    x = torch.randn(total, 256)
    y = torch.randint(0, 10, (total,))
    loader = gpuscale.make_loader(torch.utils.data.TensorDataset(x, y), plan, seed=0)

    def steps(batches):
        for xb, yb in batches:
            with training.autocast():
                loss = nn.functional.cross_entropy(training.model(xb), yb)
            training.backward(loss)
            training.step()
        return loss

    iterator = iter(loader)
    steps(next(iterator) for _ in range(args.warmup * plan.grad_accum_steps))  # warm up: buckets, allocator
    rt.barrier()
    meter = gpuscale.Meter(plan)
    loss = steps(meter.iter(iterator))
    meter.write_summary(args.out, final_loss=float(loss))
