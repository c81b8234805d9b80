"""DDP's own timers as the probe reads them: every iteration timed on CPUs and the work before the backward call split
off (both checked against a real DDP model), and a long run's sample that stays small and the same on every rank.

The real DDP model runs in a child process (gloo, one rank) that leaves with os._exit: freeing a gloo group in the
test process can deadlock its worker threads (docs/traps.md), and a unit test must not be able to hang the tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscale.measure.probe.ddp_timers import MAX_DDP_SAMPLES, keep_sample

ROOT = Path(__file__).resolve().parents[2]


def _sample(iteration: int) -> dict:
    return {"iteration": iteration, "forward_s": 0.001, "backward_s": 0.002, "sync_wait_s": 0.0, "comm_start_ns": iteration}


def test_a_long_runs_sample_is_bounded_evenly_spaced_and_the_same_on_every_rank():
    kept: list[list[dict]] = [[], []]
    strides = [1, 1]
    for iteration in range(1, 20_001):
        for rank in (0, 1):
            strides[rank] = keep_sample(kept[rank], _sample(iteration), strides[rank])
    iterations = [[s["iteration"] for s in samples] for samples in kept]
    assert iterations[0] == iterations[1]  # the ranks' samples meet step by step
    assert len(iterations[0]) <= MAX_DDP_SAMPLES and len(iterations[0]) > MAX_DDP_SAMPLES // 2
    assert iterations[0][:10] == list(range(1, 11))
    rest = iterations[0][10:]
    assert all(i % strides[0] == 0 for i in rest) and strides[0] == 16  # 20,000 / 16 = 1,250 kept
    assert rest[-1] == 20_000 and {b - a for a, b in zip(rest, rest[1:], strict=False)} == {strides[0]}


def test_a_repeated_reading_of_one_iteration_is_kept_once():
    kept: list[dict] = []
    assert keep_sample(kept, _sample(3)) == 1 and keep_sample(kept, _sample(3)) == 1
    assert len(kept) == 1


CHILD = """
import json, os, sys, time
from collections import deque
import torch, torch.distributed as dist
from torch import nn
from gpuscale.measure.probe.ddp_timers import ddp_sample, hook_backward, split_at_backward_call, time_every_iteration, timing_every

dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
calls = deque(maxlen=8)
hook_backward(calls)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
found = {"cpu_rate": timing_every(nn.Linear(4, 2)), "rate": time_every_iteration(model), "iterations": [], "samples": []}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(25):
    loss = model(torch.randn(8, 16)).sum()
    if step >= 20:
        time.sleep(0.02)  # the script's own work between forward and backward, on the last 5 steps
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    model(torch.randn(8, 16))  # DDP logs the timed iteration at the next forward's start
    sample = ddp_sample(model._get_ddp_logging_data())
    if sample is not None:
        split_at_backward_call(sample, calls)
    found["iterations"].append(sample and sample["iteration"])
    found["samples"].append(sample)
    model.zero_grad(set_to_none=True)
print(json.dumps(found), flush=True)
os._exit(0)
"""


@pytest.fixture(scope="module")
def real_ddp(tmp_path_factory):
    """What a real DistributedDataParallel (gloo, one rank, in a child process) gave the probe's readers."""
    store = tmp_path_factory.mktemp("ddp") / "store"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", CHILD, str(store)], capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_ddp_times_every_iteration_of_a_model_on_cpus(real_ddp):
    """With the probe's rate DDP has a new timed iteration after every step, where by default it stops after its 10th."""
    assert real_ddp["cpu_rate"] == 1 and real_ddp["rate"] == 1
    timed = [i for i in real_ddp["iterations"] if i is not None]
    assert len(set(timed)) >= 20 and max(timed) >= 20, real_ddp["iterations"]


def test_work_before_the_backward_call_is_split_from_ddps_backward(real_ddp):
    """DDP's backward clock starts when the forward ends: 20 ms of the script's own work before it calls backward
    would count as backward. With the call's time noted (the wrapped torch.autograd.backward) it is host_s."""
    slept = [s for s in real_ddp["samples"][-4:] if s is not None]  # iterations 21-24, logged one step late
    assert len(slept) >= 3
    for sample in slept:
        assert 0.018 < sample["host_s"] < 0.1 and sample["backward_s"] < 0.015, sample
        assert "compute_start_ns" not in sample and "compute_end_ns" not in sample
    quiet = [s for s in real_ddp["samples"][12:18] if s is not None]
    assert quiet and all(s["host_s"] < 0.005 for s in quiet), quiet
