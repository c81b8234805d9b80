"""Train STEPS steps, stopping cleanly on USR1/TERM (gpuscale.StopSignal) and resuming from the checkpoint.

argv: OUT [--steps N] [--sleep S]. Regular checkpoints are never due (every 1000 steps), so a
resumed run can only continue from the checkpoint written when it was told to stop. The model has
dropout and the loader shuffles and crosses epoch boundaries, so an exact resume needs the loader
position and every rank's random state. Rank 0 writes OUT/progress (the last finished step),
appends to OUT/events.jsonl (start, stop, finish with the job id and restart count), and at the
end OUT/final.pt (weights) and OUT/losses.json.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import gpuscale

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step, so a signal lands mid-run")
args = parser.parse_args()
out = Path(args.out)


def event(rt, kind: str, **fields) -> None:
    if rt.is_main:
        record = {"event": kind, "job": os.environ.get("SLURM_JOB_ID"), "restarts": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
                  "world_size": rt.world_size, "launcher": rt.env.launcher, **fields}
        with (out / "events.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")


with gpuscale.init() as rt:
    out.mkdir(parents=True, exist_ok=True)
    stop = gpuscale.StopSignal()
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 6), torch.randn(48, 1))
    plan = gpuscale.plan_batch(8, rt.world_size, scaling="strong")
    loader = gpuscale.make_loader(data, plan, seed=3)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    training = gpuscale.setup(net, lambda params: torch.optim.Adam(params, lr=0.01), plan=plan, strategy="ddp", precision="fp32")
    model, opt = training.model, training.optimizer
    ckpt = gpuscale.Checkpointer(out / "ckpt", keep=2)
    state = ckpt.resume(model=model, optimizer=opt, loader=loader)
    step = state.step if state else 0
    losses = state.extra["losses"] if state else {}
    event(rt, "start", step=step)
    while step < args.steps:
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            training.backward(loss)
            training.step()
            step += 1
            losses[str(step)] = gpuscale.all_reduce_sum([loss.item()])[0] / rt.world_size
            if rt.is_main:
                (out / "progress").write_text(str(step))
            if stop.requested():
                ckpt.save(step=step, model=model, optimizer=opt, loader=loader, extra={"losses": losses})
                event(rt, "stop", step=step, signal=stop.signal_name)
                stop.exit()
            if step % 1000 == 0:
                ckpt.save(step=step, model=model, optimizer=opt, loader=loader, extra={"losses": losses})
            if step == args.steps:
                break
            time.sleep(args.sleep)
    if rt.is_main:
        torch.save(gpuscale.full_state_dict(model), out / "final.pt")
        (out / "losses.json").write_text(json.dumps(losses))
    event(rt, "finish", step=step)
