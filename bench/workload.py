"""The one workload the overhead and start-up benchmarks train three ways (plain DDP, Accelerate, gpuscale).

An MLP (256 -> 1024 -> 1024 -> 10, 1.3 M parameters, 5.3 MB of gradients) on 16,384 in-memory random
samples, batch 64 per rank, SGD with momentum, fp32, no data-loader workers: a step of a few tens of
milliseconds on one core, about half of it gradient synchronisation over gloo on 2 processes, so a
framework's per-step overhead would show. Every loop records the same things (`Recorder`) into one
JSON file written by rank 0.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

PER_RANK_BATCH = 64
SAMPLES = 16384


def make_data() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 256, generator=generator)
    y = torch.randint(0, 10, (SAMPLES,), generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def args() -> tuple[Path, int, int]:
    """OUT.json, steps, warm-up steps from argv."""
    out = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 120
    warmup = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    return out, steps, warmup


class Recorder:
    """Wall-clock marks of a training loop: the first step's end, and the steady steps after the warm-up."""

    def __init__(self, steps: int, warmup: int) -> None:
        self.steps, self.warmup = steps, warmup
        self.done = 0
        self.first_step_at: float | None = None  # time.time(), comparable across processes
        self.warm_at: float | None = None  # time.perf_counter()
        self.end_at: float | None = None
        self.losses: list[float] = []

    def step_done(self, loss: torch.Tensor) -> bool:
        """Call after each optimizer step; False when the run should stop."""
        self.done += 1
        now = time.time()
        if self.done == 1:
            self.first_step_at = now
        if self.done == self.warmup:
            self.warm_at = time.perf_counter()
        if self.done == self.steps:
            self.end_at = time.perf_counter()
        if self.done % 20 == 0:
            self.losses.append(float(loss.detach()))
        return self.done < self.steps

    def write(self, out: Path, rank: int, world_size: int, **extra) -> None:
        if rank != 0:
            return
        if self.warm_at is None or self.end_at is None:
            raise RuntimeError(f"the loop stopped after {self.done} of {self.steps} steps: no steady time to write")
        record = {
            "world_size": world_size,
            "steps": self.steps,
            "warmup": self.warmup,
            "step_s": (self.end_at - self.warm_at) / (self.steps - self.warmup),
            "first_step_at": self.first_step_at,
            "losses": self.losses,
            "threads": torch.get_num_threads(),
            "affinity": sorted(os.sched_getaffinity(0)),
            **extra,
        }
        out.write_text(json.dumps(record))
