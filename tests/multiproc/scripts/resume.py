"""Train 12 steps with checkpoints every step; optionally die right after the checkpoint of step K.

argv: OUT [--crash-at K]. Rank 0 writes OUT/final.pt (weights) and OUT/losses.json (step -> loss).
Model and optimizer come from gpuscale.setup (--strategy ddp|fsdp|deepspeed). The model has dropout (random numbers),
the loader shuffles and the run crosses epoch boundaries and stops mid-epoch, so resuming exactly needs the model,
optimizer, scheduler, loader position and every rank's RNG state.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

import gpuscale

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--crash-at", type=int, default=None)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--strategy", default="ddp")
parser.add_argument("--dropout", type=float, default=0.3)
parser.add_argument("--zero-stage", type=int, default=None)
parser.add_argument("--precision", default="fp32")
args = parser.parse_args()
out = Path(args.out)

with gpuscale.init() as rt:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 6), torch.randn(40, 1))
    plan = gpuscale.plan_batch(8, rt.world_size, scaling="strong")
    loader = gpuscale.make_loader(data, plan, seed=3)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(args.dropout), torch.nn.Linear(16, 1))
    deepspeed = {"zero_stage": args.zero_stage} if args.strategy == "deepspeed" else {}
    training = gpuscale.setup(net, lambda params: torch.optim.Adam(params, lr=0.01), plan=plan,
                              strategy=args.strategy, precision=args.precision, **deepspeed)
    model, opt = training.model, training.optimizer
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    ckpt = gpuscale.Checkpointer(out / "ckpt", keep=2)
    state = ckpt.resume(model=model, optimizer=opt, scheduler=sched, loader=loader)
    step = state.step if state else 0
    losses = state.extra["losses"] if state else {}
    while step < args.steps:
        for x, y in loader:
            with training.autocast():
                loss = F.mse_loss(model(x), y)
            training.backward(loss)
            assert training.step()  # no accumulation: every batch is a step
            sched.step()
            step += 1
            losses[str(step)] = gpuscale.all_reduce_sum([loss.item()])[0] / rt.world_size
            ckpt.save(step=step, model=model, optimizer=opt, scheduler=sched, loader=loader, extra={"losses": losses})
            if step == args.crash_at:
                os._exit(17)  # as abrupt as a kill: no teardown, no flush
            if step == args.steps:
                break
    final = gpuscale.full_state_dict(model)  # collective: gathers shards under fsdp
    if rt.is_main:
        torch.save(final, out / "final.pt")
        (out / "losses.json").write_text(json.dumps(losses))
        (out / "checkpoints.json").write_text(json.dumps(sorted(p.name for p in ckpt.checkpoints())))
