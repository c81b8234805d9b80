"""DDP's own timers as the probe reads them: every iteration timed on CPUs (checked against a real DDP model), and a
long run's sample that stays small and the same on every rank."""

from __future__ import annotations

import time
from collections import deque

import torch
import torch.distributed as dist
from torch import nn

from gpuscale.measure.probe.ddp_timers import (
    MAX_DDP_SAMPLES,
    ddp_sample,
    hook_backward,
    keep_sample,
    split_at_backward_call,
    time_every_iteration,
    timing_every,
)


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


def test_ddp_times_every_iteration_of_a_model_on_cpus(tmp_path, single_process):
    """A real DistributedDataParallel (gloo, one rank): with the probe's rate it has a new timed iteration after
    every step, where by default it would stop after its 10th."""
    assert timing_every(nn.Linear(4, 2)) == 1
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
        assert time_every_iteration(model) == 1
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = []
        for _ in range(25):
            model(torch.randn(8, 16)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            model(torch.randn(8, 16))  # DDP logs the timed iteration at the next forward's start
            sample = ddp_sample(model._get_ddp_logging_data())
            seen.append(sample["iteration"] if sample else None)
            model.zero_grad(set_to_none=True)
        timed = [i for i in seen if i is not None]
        assert len(set(timed)) >= 20 and max(timed) >= 20, seen  # past the 10th, every iteration is timed
    finally:
        dist.destroy_process_group()


def test_work_before_the_backward_call_is_split_from_ddps_backward(tmp_path, single_process, monkeypatch):
    """DDP's backward clock starts when the forward ends: 20 ms of the script's own work before it calls backward
    would count as backward. With the call's time noted (the wrapped torch.autograd.backward) it is host_s."""
    monkeypatch.setattr(torch.autograd, "backward", torch.autograd.backward)  # restored after the test
    calls: deque[int] = deque(maxlen=8)
    hook_backward(calls)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = nn.parallel.DistributedDataParallel(nn.Linear(16, 2))
        time_every_iteration(model)
        samples = []
        for _ in range(4):
            loss = model(torch.randn(8, 16)).sum()
            time.sleep(0.02)  # the script's own work between forward and backward
            loss.backward()
            model(torch.randn(8, 16))
            sample = ddp_sample(model._get_ddp_logging_data())
            split_at_backward_call(sample, calls)
            samples.append(sample)
            model.zero_grad(set_to_none=True)
        for sample in samples[1:]:
            assert 0.018 < sample["host_s"] < 0.1 and sample["backward_s"] < 0.015, sample
            assert "compute_start_ns" not in sample and "compute_end_ns" not in sample
    finally:
        dist.destroy_process_group()
