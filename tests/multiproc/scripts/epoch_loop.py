"""A script written the way gpuscale.EpochLoop's docstring writes one: 3 epochs of an MLP, resumable.

argv: OUT [--stop-after-step K] [--epochs E] [--samples N]. 2 micro-batches per optimizer step (gradient accumulation), SGD with
momentum, a step-wise scheduler, Dropout (random state matters), per-epoch mean loss in loop.state.
With --stop-after-step K rank 1 sends itself SIGUSR1 after its K-th optimizer step (StopSignal checks
after every step): the loop must checkpoint and exit 75. Rank 0 writes OUT/final.pt (the weights and
the history) when the epochs are done, and OUT/summary.json.
"""

import argparse
import os
import signal
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import gpuscale

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--stop-after-step", type=int, default=None)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=96, help="96: 6 whole steps an epoch; 104: 13 micro-batches a rank")
args = parser.parse_args()
out = Path(args.out)

with gpuscale.init() as rt:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(args.samples, 8), torch.randint(0, 3, (args.samples,)))
    plan = gpuscale.plan_batch(16, rt.world_size, scaling="strong", max_per_device=4)  # 2 micro-batches per step on 2 ranks
    loader = gpuscale.make_loader(data, plan, seed=3)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))
    training = gpuscale.setup(net, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), plan=plan, precision="fp32")
    scheduler = torch.optim.lr_scheduler.StepLR(training.optimizer, step_size=4, gamma=0.5)
    loop = gpuscale.EpochLoop(training, loader, epochs=args.epochs, checkpoints=out / "checkpoints", scheduler=scheduler,
                              state={"history": []}, stop=gpuscale.StopSignal(every=1))
    loss_avg = loop.average("loss")
    for _epoch in loop:
        for x, y in loop.batches():
            with training.autocast():
                loss = F.cross_entropy(training.model(x), y)
            training.backward(loss)
            if loop.step() and rt.rank == 1 and loop.steps == args.stop_after_step:
                os.kill(os.getpid(), signal.SIGUSR1)
            loss_avg.update(loss.detach() * len(y), len(y))
        loop.state["history"].append(loss_avg.compute())
    summary = loop.meter.write_summary(out, final_loss=loop.state["history"][-1])
    if rt.is_main:
        torch.save({"state": training.module.state_dict(), "history": loop.state["history"], "steps": loop.steps,
                    "lr": scheduler.get_last_lr()}, out / "final.pt")
