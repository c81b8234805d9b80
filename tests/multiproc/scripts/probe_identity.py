"""Train 31 optimizer steps of a model with BatchNorm and Dropout through gpuscale.setup; save the final state.

argv: OUT [--max-per-device M]. Every rank writes OUT/final-rank<R>.pt (parameters, buffers, the
optimizer's momentum, the next random number); rank 0 writes OUT/summary.json (gpuscale.Meter).
Run it with and without GPUSCALE_SYNC_PROBE=0: the sync probe's replays must leave every byte of
training unchanged, on every rank. (31 steps: the last probe, step 29, is followed by one more
step, whose forward pass would skip DDP's buffer broadcast if a replay left DDP's flags changed.)
"""

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import gpuscale

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--max-per-device", type=int, default=None)
args = parser.parse_args()

with gpuscale.init() as rt:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(31 * 16, 12), torch.randint(0, 3, (31 * 16,)))
    plan = gpuscale.plan_batch(16, rt.world_size, scaling="strong", max_per_device=args.max_per_device)
    loader = gpuscale.make_loader(data, plan, seed=1)
    net = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    training = gpuscale.setup(net, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), plan=plan, precision="fp32")
    meter = gpuscale.Meter(plan, monitor=False)
    for x, y in meter.iter(loader):
        with training.autocast():
            loss = F.cross_entropy(training.model(x), y)
        training.backward(loss)
        training.step()
    meter.write_summary(args.out, final_loss=float(loss.detach()))
    Path(args.out).mkdir(parents=True, exist_ok=True)  # rank 0's summary made it, but maybe not yet
    momentum = [training.optimizer.state[p]["momentum_buffer"] for p in training.optimizer.param_groups[0]["params"]]
    torch.save({"state": training.module.state_dict(), "momentum": momentum, "next_random": torch.rand(4)},
               Path(args.out) / f"final-rank{rt.rank}.pt")
