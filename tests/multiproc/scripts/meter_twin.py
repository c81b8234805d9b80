"""The plain-DDP client's workload measured by gpuscale.Meter: the probe's record of the same run must agree.

Under `gpuscale run` the probe records this script too (its record says "meter": true, so no
summary is merged from it): the test merges the records itself and compares them with the
Meter's summary.json of the very same run. Two epochs, an evaluation pass after each.
"""

import argparse

import torch
from torch import nn

import gpuscale

parser = argparse.ArgumentParser()
parser.add_argument("--scaling", choices=("weak", "strong"), default="weak")
parser.add_argument("--out", required=True)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--samples", type=int, default=2048)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

torch.manual_seed(0)
with gpuscale.init() as rt:
    plan = gpuscale.plan_batch(args.batch_size, rt.world_size, scaling=args.scaling)
    model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    training = gpuscale.setup(model, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), plan=plan)
    x, y = torch.randn(args.samples, 256), torch.randint(0, 10, (args.samples,))
    train = gpuscale.make_loader(torch.utils.data.TensorDataset(x, y), plan, seed=0)
    val = gpuscale.make_loader(torch.utils.data.TensorDataset(x[:512], y[:512]), plan, train=False)
    meter = gpuscale.Meter(plan)
    for _epoch in range(args.epochs):
        for xb, yb in meter.iter(train):
            with training.autocast():
                loss = nn.functional.cross_entropy(training.model(xb), yb)
            training.backward(loss)
            training.step()
        with meter.phase("eval"), torch.no_grad():
            for xb, _ in val:
                training.model(xb)
    meter.write_summary(args.out, final_loss=float(loss))
