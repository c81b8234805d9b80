"""A data-parallel workload with known, injected losses of scaling efficiency: the breakdown's test bed.

An MLP on in-memory random data (about 6 ms of compute per step on one core, one small gradient bucket), SGD, --steps
optimizer steps; summary.json in --out. Injected only when the job has more than one rank, so a
1-process baseline of the same command stays clean:

    --data-sleep S --sleep-ranks all|1   the loader sleeps S seconds per batch, on every rank or on rank 1 only
    --comm-sleep S                       a DDP communication hook holds the backward pass S seconds per
                                         gradient bucket (busy, so that the core stays awake), then
                                         all-reduces as DDP would, waiting for it inside the hook

With more than one rank, every variant all-reduces through a communication hook of this script's own (in the
clean, data and one-rank variants it does not sleep), which reads one clock that every process of the machine
shares (CLOCK_MONOTONIC) when a rank arrives with its gradients, and how long it held the backward pass.

Rank 0 writes OUT/injected.json: what was injected per optimizer step (seconds), from the sleeps
that really happened (the hook counts its calls), and the hook's own clock on the steps the sync probe
measured: how long it held the backward pass (the sleep plus this run's all-reduce; with one
gradient bucket, that all-reduce starts after the whole backward pass: all of it is exposed), and how far apart
the ranks arrived (the fastest rank's wait for the slowest: imbalance, whatever made it, the injected sleep or a
core this machine's neighbours slowed down).
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


def shared_clock() -> float:
    """Seconds on the clock every process of this machine reads alike, so that two ranks' readings compare."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def sleeping_allreduce(sleep: float, calls: list[int], held_s: dict[int, float], arrived: dict[int, float]):
    """A DDP communication hook: busy-wait `sleep`, all-reduce the bucket and wait for it; count calls, and time
    each call by the optimizer step it belongs to (the steps the sync probe measures are among them): when the
    step's first bucket arrived (`shared_clock`), and how long the hook held the backward pass."""
    def hook(state, bucket):
        start = shared_clock()
        calls[0] += 1
        step = syncprobe.RECORD.steps  # optimizer steps finished before this one
        arrived.setdefault(step, start)
        busy_wait(sleep)
        tensor = bucket.buffer().div_(dist.get_world_size())
        dist.all_reduce(tensor)
        held_s[step] = held_s.get(step, 0.0) + shared_clock() - start
        done = torch.futures.Future()
        done.set_result(tensor)
        return done
    return hook


def on_probed_steps(per_rank: list[dict[int, float]], over_ranks) -> float | None:
    """A per-step reading of every rank on the probed steps, summarised as the breakdown summarises the probe:
    `over_ranks` of the ranks' readings per step, then the median over the probed steps, the first dropped as
    warm-up when there are three or more."""
    probed = sorted(step for step in set.intersection(*(set(h) for h in per_rank)) if syncprobe.is_probe_step(step))
    if len(probed) >= 3:
        probed = probed[1:]
    return statistics.median(over_ranks([h[step] for h in per_rank]) for step in probed) if probed else None


def probed_hook_seconds(held: list[dict[int, float]]) -> float | None:
    """How long the hook held the backward pass on the probed steps: the least over the ranks (the last rank to
    arrive waits only for the sleep and the all-reduce itself)."""
    return on_probed_steps(held, min)


def probed_arrival_gap(arrived: list[dict[int, float]]) -> float | None:
    """How far apart the ranks arrived at the all-reduce on the probed steps: the last arrival less the first, the
    time the fastest rank waited for the slowest (with one bucket, a rank arrives when its backward pass ends)."""
    return on_probed_steps(arrived, lambda times: max(times) - min(times))


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
    calls, held_s, arrived = [0], {}, {}
    if many:
        training.model.register_comm_hook(None, sleeping_allreduce(args.comm_sleep, calls, held_s, arrived))
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
    held, arrivals = [held_s], [arrived]
    if many:
        held, arrivals = [None] * rt.world_size, [None] * rt.world_size
        dist.all_gather_object(held, held_s)
        dist.all_gather_object(arrivals, arrived)
    if rt.is_main:
        injected = {"data_sleep_per_step_s": data_sleep, "sleep_ranks": args.sleep_ranks if data_sleep else None,
                    "comm_sleep_per_step_s": args.comm_sleep * calls[0] / steps, "hook_calls_per_step": calls[0] / steps,
                    "comm_hook_s_on_probed_steps": probed_hook_seconds(held),
                    "arrival_gap_s_on_probed_steps": probed_arrival_gap(arrivals), "world_size": rt.world_size}
        with open(os.path.join(args.out, "injected.json"), "w") as f:
            json.dump(injected, f)
