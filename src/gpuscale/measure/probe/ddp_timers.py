"""Read DDP's own timers: note every DistributedDataParallel made, and turn its logging data into timing samples.

DDP times iterations 1-10 and then one in every ``sample rate`` (100 by default): forward and backward compute,
and when its gradient all-reduce ended after the backward's last gradient was ready, which is the rank's **sync
wait** (exposed communication, plus waiting for the slowest rank). The recorder (`gpuscale.measure.probe.recorder`)
follows the largest DDP model, asks it to time every iteration where that costs nothing (`timing_every`: a model on
CPUs, whose timers read the host's clock; a GPU's timers synchronise with the device, so a model on GPUs keeps
DDP's own rate), and reads its logging data after each optimizer step, with the step's wall time beside it.

A long run keeps a sample of its timed iterations that stays the same on every rank (`keep_sample`): the first
10, then every ``stride``-th iteration, the stride doubling whenever MAX_DDP_SAMPLES are held, so the ranks'
samples still meet step by step.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

__all__ = ["MAX_DDP_SAMPLES", "ddp_sample", "keep_sample", "hook_ddp", "hook_backward", "split_at_backward_call", "timing_every",
           "time_every_iteration"]

MAX_DDP_SAMPLES = 2048
"""DDP timer samples kept per rank: the first 10 iterations, then an evenly spaced sample of the rest."""

DDP_DEFAULT_RATE = 100
"""DDP's own sample rate: after its first 10 iterations it times one in this many."""


def ddp_sample(data: dict[str, Any]) -> dict[str, Any] | None:
    """One timed DDP iteration from DDP's logging data (nanoseconds), in seconds; None before the first.

    sync_wait_s is from the moment the backward's last gradient was ready to the end of the last
    bucket's all-reduce: communication the backward did not hide, plus waiting for slower ranks.
    """
    try:
        compute_end, comm_start, comm_end = (int(data[k]) for k in ("backward_compute_time_end", "backward_comm_time_start",
                                                                     "backward_comm_time_end"))
        forward, backward = int(data["forward_compute_time"]), int(data["backward_compute_time"])
        iteration = int(data["iteration"])
    except (KeyError, TypeError, ValueError):
        return None
    if iteration < 1 or comm_end <= 0 or comm_start <= 0:
        return None
    return {"iteration": iteration, "forward_s": forward / 1e9, "backward_s": backward / 1e9,
            "sync_wait_s": max(comm_end - compute_end, 0) / 1e9, "comm_start_ns": comm_start,
            "compute_end_ns": compute_end, "compute_start_ns": compute_end - backward}


def split_at_backward_call(sample: dict[str, Any], calls_ns: Iterable[int]) -> None:
    """Split DDP's "backward" of `sample` at the script's call of backward (in place).

    DDP starts its backward clock when the forward ends, so its backward time holds whatever the script does
    before it calls backward (the loss, logging, a busy rank's extra work). With the call's time (`hook_backward`),
    ``host_s`` is that stretch and ``backward_s`` the backward itself; without one in the window both stay as DDP
    gave them (``host_s`` None). The raw clock readings are dropped either way."""
    start, end = sample.pop("compute_start_ns", None), sample.pop("compute_end_ns", None)
    if start is None or end is None:
        return
    call = max((c for c in calls_ns if start <= c <= end), default=None)
    if call is not None:
        sample["host_s"], sample["backward_s"] = (call - start) / 1e9, (end - call) / 1e9
    else:
        sample["host_s"] = None


def hook_backward(calls_ns: deque[int]) -> None:
    """Note the wall clock (the clock DDP's CPU timers read: time.time_ns) of every call of torch.autograd.backward,
    through which ``Tensor.backward`` goes, in `calls_ns`."""
    import torch.autograd

    original = torch.autograd.backward
    if getattr(original, "_gpuscale_probe", False):
        return

    def backward(*args: Any, **kwargs: Any) -> Any:
        calls_ns.append(time.time_ns())
        return original(*args, **kwargs)

    backward._gpuscale_probe = True  # type: ignore[attr-defined]
    backward.__wrapped__ = original  # type: ignore[attr-defined]
    torch.autograd.backward = backward


def keep_sample(samples: list[dict[str, Any]], sample: dict[str, Any], stride: int = 1) -> int:
    """Add `sample` to `samples` if it is a new timed iteration that the sample keeps; returns the stride from now on.

    The first 10 timed iterations are kept; after them, those whose iteration is a multiple of `stride`. When
    MAX_DDP_SAMPLES are held, the stride doubles and the kept iterations after the first 10 that are not multiples
    of it are dropped: a choice by iteration number alone, so every rank keeps the same steps.
    """
    last = samples[-1] if samples else None
    if last is not None and (last["iteration"] == sample["iteration"] or last["comm_start_ns"] == sample["comm_start_ns"]):
        return stride  # not a new timed iteration (or one with no all-reduce, under no_sync)
    if len(samples) >= 10 and sample["iteration"] % stride:
        return stride
    samples.append(sample)
    if len(samples) > MAX_DDP_SAMPLES:
        stride *= 2
        samples[10:] = [s for s in samples[10:] if s["iteration"] % stride == 0]
    return stride


def timing_every(module: Any) -> int | None:
    """The sample rate that makes DDP time every iteration of `module` where its timers cost nothing (parameters
    on CPUs: 1), else None: on GPUs DDP's timers wait for the device's events at the next forward, so DDP's
    own rate stays (its first 10 iterations and every 100th)."""
    try:
        device = next(module.parameters()).device.type
    except (StopIteration, AttributeError, TypeError):
        return None
    return 1 if device == "cpu" else None


def time_every_iteration(module: Any) -> int:
    """Ask `module` (a DistributedDataParallel) to time every iteration where that is free; the rate it times at."""
    rate = timing_every(module)
    if rate is None:
        return DDP_DEFAULT_RATE
    try:
        module._set_ddp_runtime_logging_sample_rate(rate)  # a prototype API: if it goes, DDP's own rate stays
    except Exception:
        return DDP_DEFAULT_RATE
    return rate


class DdpListener(Protocol):
    """What the DDP hook tells: a DistributedDataParallel module was made."""

    def ddp_created(self, module: Any) -> None: ...


def hook_ddp(recorder: DdpListener) -> None:
    """Wrap ``DistributedDataParallel.__init__`` to tell `recorder` of every DDP model made."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # a torch built without distributed: nothing to time
        return

    original = DistributedDataParallel.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        recorder.ddp_created(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    DistributedDataParallel.__init__ = __init__  # type: ignore[method-assign]
