"""A data-parallel workload with known, injected losses of scaling efficiency: the breakdown's test bed.

An MLP on in-memory random data (about 6 ms of compute per step on one core, one small gradient bucket), SGD, --steps
optimizer steps; summary.json in --out. Injected only when the job has more than one rank, so a
1-process baseline of the same command stays clean:

    --data-sleep S --sleep-ranks all|1   the loader sleeps S seconds per batch, on every rank or on rank 1 only
    --comm-sleep S                       a DDP communication hook holds the backward pass S seconds per
                                         gradient bucket (busy, so that the core stays awake), then
                                         all-reduces as DDP would, waiting for it inside the hook

Rank 0 writes OUT/injected.json: what was injected per optimizer step (seconds), from the sleeps
that really happened (the hook counts its calls), and the hook's own clock on the steps the sync probe
measured: how long it held the backward pass (the sleep plus this run's all-reduce). With one
gradient bucket, that all-reduce starts after the whole backward pass: all of it is exposed.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

import gpuscale
from gpuscale.measure import syncprobe

parser = argparse.ArgumentParser()
parser.add_argument("--scaling", choices=("weak", "strong"), default="weak")
parser.add_argument("--out", required=True)
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--hidden", type=int, default=512)
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--data-sleep", type=float, default=0.0)
parser.add_argument("--sleep-ranks", choices=("all", "1"), default="all")
parser.add_argument("--comm-sleep", type=float, default=0.0)
args = parser.parse_args()


class SleepyTensors(Dataset):
    """In-memory samples, fetched a batch at a time; each batch fetch sleeps `sleep` seconds."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, sleep: float) -> None:
        self.x, self.y, self.sleep = x, y, sleep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]

    def __getitems__(self, indices: list[int]):
        if self.sleep:
            time.sleep(self.sleep)
        return [(self.x[i], self.y[i]) for i in indices]


def busy_wait(seconds: float) -> None:
    """Hold the core for `seconds`: a sleeping core of this VM wakes up slowly, which would slow the all-reduce too."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def sleeping_allreduce(sleep: float, calls: list[int], held_s: dict[int, float]):
    """A DDP communication hook: busy-wait `sleep`, all-reduce the bucket and wait for it; count calls, and time
    each call by the optimizer step it belongs to (the steps the sync probe measures are among them)."""
    def hook(state, bucket):
        start = time.perf_counter()
        calls[0] += 1
        busy_wait(sleep)
        tensor = bucket.buffer().div_(dist.get_world_size())
        dist.all_reduce(tensor)
        step = syncprobe.RECORD.steps  # optimizer steps finished before this one
        held_s[step] = held_s.get(step, 0.0) + time.perf_counter() - start
        done = torch.futures.Future()
        done.set_result(tensor)
        return done
    return hook


def probed_hook_seconds(held: list[dict[int, float]]) -> float | None:
    """The hook's own clock on the probed steps, summarised as the breakdown summarises the probe: the least over
    the ranks (the last rank to arrive waits only for the sleep and the all-reduce itself), then the median over
    the probed steps, the first dropped as warm-up when there are three or more."""
    probed = sorted(step for step in set.intersection(*(set(h) for h in held)) if syncprobe.is_probe_step(step))
    if len(probed) >= 3:
        probed = probed[1:]
    return statistics.median(min(h[step] for h in held) for step in probed) if probed else None


torch.manual_seed(0)
with gpuscale.init() as rt:
    many = rt.world_size > 1
    plan = gpuscale.plan_batch(args.batch_size, rt.world_size, scaling=args.scaling)
    # The middle layers are frozen (as in transfer learning): the backward pass still runs through them
    # to reach the first layer, but the gradients stay small (one bucket), so the all-reduce itself is
    # a short, steady part of the step and the injected delays stand out against it.
    middle = nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU())
    middle.requires_grad_(False)
    model = nn.Sequential(nn.Linear(128, args.hidden), nn.ReLU(), middle, nn.Linear(args.hidden, 10))
    training = gpuscale.setup(model, lambda p: torch.optim.SGD(p, lr=0.01), plan=plan)
    calls, held_s = [0], {}
    if many and args.comm_sleep:
        training.model.register_comm_hook(None, sleeping_allreduce(args.comm_sleep, calls, held_s))
    sleeps_here = many and (args.sleep_ranks == "all" or rt.rank == 1)
    data_sleep = args.data_sleep if many else 0.0  # what the injection is, reported by rank 0
    dataset_sleep = args.data_sleep if sleeps_here else 0.0
    total = args.steps * plan.global_batch
    data = SleepyTensors(torch.randn(total, 128), torch.randint(0, 10, (total,)), dataset_sleep)
    loader = gpuscale.make_loader(data, plan, seed=0)
    meter = gpuscale.Meter(plan)
    steps = 0
    for xb, yb in meter.iter(loader):
        with training.autocast():
            loss = nn.functional.cross_entropy(training.model(xb), yb)
        training.backward(loss)
        steps += training.step()
    meter.write_summary(args.out, final_loss=float(loss.detach()))
    held = [held_s]
    if many:
        held = [None] * rt.world_size
        dist.all_gather_object(held, held_s)
    if rt.is_main:
        injected = {"data_sleep_per_step_s": data_sleep, "sleep_ranks": args.sleep_ranks if data_sleep else None,
                    "comm_sleep_per_step_s": args.comm_sleep * calls[0] / steps, "hook_calls_per_step": calls[0] / steps,
                    "comm_hook_s_on_probed_steps": probed_hook_seconds(held), "world_size": rt.world_size}
        with open(os.path.join(args.out, "injected.json"), "w") as f:
            json.dump(injected, f)
