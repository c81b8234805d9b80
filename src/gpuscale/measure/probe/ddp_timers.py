"""Read DDP's own timers: note every DistributedDataParallel made, and turn its logging data into timing samples.

DDP times iterations 1-10 and every 100th: forward and backward compute, and when its gradient
all-reduce ended after the backward's last gradient was ready, which is the rank's **sync wait**
(exposed communication, plus waiting for the slowest rank). The recorder (`gpuscale.measure.probe.recorder`)
follows the largest DDP model and reads its logging data after each optimizer step.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["MAX_DDP_SAMPLES", "ddp_sample", "keep_sample", "hook_ddp"]

MAX_DDP_SAMPLES = 200
"""DDP timer samples kept: the first 10 iterations and the latest ones (every 100th iteration)."""


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
            "sync_wait_s": max(comm_end - compute_end, 0) / 1e9, "comm_start_ns": comm_start}


def keep_sample(samples: list[dict[str, Any]], sample: dict[str, Any]) -> None:
    """Add `sample` to `samples` if it is a new timed iteration; past MAX_DDP_SAMPLES, drop the oldest after the first 10."""
    last = samples[-1] if samples else None
    if last is not None and (last["iteration"] == sample["iteration"] or last["comm_start_ns"] == sample["comm_start_ns"]):
        return  # not a new timed iteration (or one with no all-reduce, under no_sync)
    samples.append(sample)
    if len(samples) > MAX_DDP_SAMPLES:
        del samples[10]


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
