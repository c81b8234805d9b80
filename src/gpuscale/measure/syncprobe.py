"""What gradient synchronisation costs a step, measured: the sync probe.

Data parallelism adds one gradient all-reduce per optimizer step. Part of it runs while the
backward pass still computes; the rest, and any time spent waiting for a slower rank, makes the
step longer. A model cannot say how much (overlap depends on the hardware, the bucket order, the
cores gloo's threads share with compute); so gpuscale measures it, on a few steps of the real run:

1. On a probed step, `Training.backward` times the real, synchronised backward pass of the step's
   last micro-batch (the one whose backward all-reduces).
2. It then replays that micro-batch: the same inputs through the same model with synchronisation
   switched off (DDP's ``no_sync``), and the same gradients flowing into the model's outputs
   (captured during the real backward), so the replayed backward does exactly the real one's
   arithmetic, without the all-reduce. Forward and backward are timed.
3. Gradients, buffers (BatchNorm's statistics) and the random number generators are put back bit
   for bit. No optimizer step runs and the loader is not touched, so the training that follows
   is exactly what it would have been without the probe (the tests compare final weights).

``synced_backward_s - backward_s`` is then what synchronising cost this rank on that step: the
communication that compute did not hide plus the time it waited for the others. Over the ranks,
the smallest of these is the exposed communication (the last rank to arrive still waits that
long) and the spread between largest and smallest is imbalance (the fastest rank waiting for the
slowest). `gpuscale.Meter` gathers every rank's probes into summary.json (``sync_probe`` and
``step_breakdown_s``); `gpuscale.study` turns them into the loss-of-efficiency breakdown.

Cost: a probed step holds one more copy of the gradients and runs one more forward and backward
pass (its activations are those of a normal step: the real backward has freed its own by then),
so its peak memory is a normal step's plus the gradients'. A model that fits its GPU with less
room than that to spare needs ``GPUSCALE_SYNC_PROBE=0``.

When: the optimizer steps `PROBE_STEPS` lists (the 6th, then every 8th up to 12 probes, then every
100th), the same steps on every rank, so that their timings can be compared step by step. The
replay itself is not collective (no all-reduce, no buffer broadcast). Its time is charged to the
run's "probe" phase, not to training: throughput excludes it. ``GPUSCALE_SYNC_PROBE=0`` turns the
probe off.

What it cannot measure, said plainly in the summary (``sync_probe.status`` "not measured" and
``why``): fsdp (switching its reduce-scatter off leaves unsharded gradients behind that the next
step would reduce), deepspeed (the engine owns backward and its buckets), compiled models (the
capture hooks would run inside the compiled graph), and scripts that call the model more than
once per micro-batch (the replay could not repeat the loss).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

__all__ = ["ProbeSample", "ProbeRecord", "RECORD", "probe_enabled", "is_probe_step", "unsupported_reason",
           "Capture", "replay", "synchronize"]

FIRST_PROBE_STEP = 5
"""Optimizer steps before the first probe: the very first steps build DDP's buckets and warm allocators up."""
EARLY_EVERY = 8
EARLY_PROBES = 12
LATE_EVERY = 100


def is_probe_step(step: int) -> bool:
    """Whether optimizer step `step` (0-based, counted over the whole process) is probed.

    Steps 5, 13, 21, ... (12 probes, 8 apart), then every 100th: enough probes for a median in
    short runs, a bounded cost (about one extra forward and backward per 8 steps early on, per 100
    later) in long ones.
    """
    if step < FIRST_PROBE_STEP:
        return False
    offset = step - FIRST_PROBE_STEP
    early_span = EARLY_EVERY * (EARLY_PROBES - 1)
    if offset <= early_span:
        return offset % EARLY_EVERY == 0
    return (offset - early_span) % LATE_EVERY == 0


PROBE_STEPS = (f"{FIRST_PROBE_STEP}, {FIRST_PROBE_STEP + EARLY_EVERY}, ..., {FIRST_PROBE_STEP + EARLY_EVERY * (EARLY_PROBES - 1)} "
               f"(the first {EARLY_PROBES}, {EARLY_EVERY} steps apart), then every {LATE_EVERY}th step")
"""The schedule, in words (a run's summary says how many probes it took: ``probes``)."""


def probe_enabled() -> bool:
    """False when ``GPUSCALE_SYNC_PROBE=0`` (or "off", "false", "no")."""
    return os.environ.get("GPUSCALE_SYNC_PROBE", "1").strip().lower() not in ("0", "off", "false", "no")


@dataclass(frozen=True)
class ProbeSample:
    """One probed micro-batch on this rank (seconds)."""

    step: int
    """The optimizer step (0-based, over the process)."""
    forward_s: float
    """The replayed forward pass, without synchronisation."""
    backward_s: float
    """The replayed backward pass, without synchronisation: the step's backward compute."""
    synced_backward_s: float
    """The real backward pass of the same micro-batch, synchronised."""
    micro_batches: int
    """Micro-batches per optimizer step (gradient accumulation): compute per step is this times forward + backward."""

    @property
    def sync_wait_s(self) -> float:
        """What synchronising cost this rank on this step: exposed communication plus waiting for others."""
        return max(self.synced_backward_s - self.backward_s, 0.0)

    @property
    def compute_s(self) -> float:
        """Forward and backward compute of one optimizer step (all its micro-batches)."""
        return (self.forward_s + self.backward_s) * self.micro_batches


@dataclass
class ProbeRecord:
    """This process's probes, counted optimizer steps and the seconds the replays took."""

    samples: list[ProbeSample] = field(default_factory=list)
    seconds: float = 0.0
    """Wall time spent replaying (charged to the run's 'probe' phase, not to training)."""
    steps: int = 0
    """Optimizer steps taken so far by every `Training` of this process (the probe schedule's clock)."""
    unsupported: str | None = None
    """Why the probe could not measure this run (the last reason given), or None."""

    def mark(self) -> tuple[int, float]:
        """Where a measuring window starts: (samples so far, seconds so far)."""
        return len(self.samples), self.seconds

    def as_rows(self, since: int = 0) -> list[dict[str, Any]]:
        return [asdict(s) for s in self.samples[since:]]


RECORD = ProbeRecord()
"""The process-wide record: a script may build several `Training` objects (fine-tuning builds a second)."""


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the probe cannot measure this model whatever its strategy, or None when it can.

    What a strategy rules out it says itself (`Strategy.sync_probe_blocker`)."""
    if getattr(model, "_compiled_call_impl", None) is not None:
        return "compiled model: capturing the inputs of a compiled forward pass would change what is compiled"
    return None


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA), so that wall-clock times charge it to the right phase."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Capture:
    """Records one forward call of `model` (its inputs) and, during the real backward, the gradients
    that flow into its outputs; `replay` repeats that micro-batch with them.

    Installed for the last micro-batch of a probed step and removed after it; a second forward
    call in the same micro-batch makes it unusable (`valid` False): the replay could not repeat
    a loss built from two calls.
    """

    def __init__(self, model: nn.Module) -> None:
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.calls = 0
        self.output_grads: dict[int, torch.Tensor] = {}
        self.num_outputs = 0
        self._tensor_hooks: list[Any] = []
        self._module_hooks = [
            model.register_forward_pre_hook(self._before, with_kwargs=True),
            model.register_forward_hook(self._after),
        ]

    def _before(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls += 1
        if self.calls == 1:
            self.args, self.kwargs = args, dict(kwargs)

    def _after(self, _module: nn.Module, _args: Any, output: Any) -> None:
        if self.calls != 1:
            return
        leaves, _ = pytree.tree_flatten(output)
        self.num_outputs = len(leaves)
        for index, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                self._tensor_hooks.append(leaf.register_hook(self._grad_saver(index)))

    def _grad_saver(self, index: int) -> Callable[[torch.Tensor], None]:
        def save(grad: torch.Tensor) -> None:
            self.output_grads[index] = grad.detach().clone()
        return save

    @property
    def valid(self) -> bool:
        """One forward call whose outputs received gradients in the real backward."""
        return self.calls == 1 and bool(self.output_grads)

    def stop_recording(self) -> None:
        """Take the forward hooks off (the forward is over); the output-gradient hooks stay for the backward."""
        for hook in self._module_hooks:
            hook.remove()
        self._module_hooks = []

    def remove(self) -> None:
        """Take every hook off (the captured inputs and gradients stay for the replay)."""
        self.stop_recording()
        for hook in self._tensor_hooks:
            hook.remove()
        self._tensor_hooks = []


def _rng_states(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_states(states: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state(states[1], device)


def _restore(params: list[nn.Parameter], grads: list[torch.Tensor | None], buffers: list[torch.Tensor],
             saved_buffers: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for param, grad in zip(params, grads, strict=True):
            if grad is None:
                param.grad = None
            elif param.grad is None:
                param.grad = grad
            else:
                param.grad.copy_(grad)  # in place: DDP's gradients are views into its buckets
        for buffer, saved in zip(buffers, saved_buffers, strict=True):
            buffer.copy_(saved)


@contextmanager
def _local_forward(model: nn.Module) -> Iterator[None]:
    """No collective in the replay's forward pass, and DDP's forward flags as they were afterwards.

    DDP broadcasts buffers (BatchNorm's statistics) from rank 0 at the start of a forward pass while
    ``require_forward_param_sync`` is set, and a forward under ``no_sync`` clears that flag, which
    would make the next real forward skip its broadcast. The replay needs no broadcast (its buffers
    are restored anyway) and must not hang if one rank skipped its replay, so the flag is off during
    it and put back after.
    """
    flag = getattr(model, "require_forward_param_sync", None)
    if flag is None:
        yield
        return
    model.require_forward_param_sync = False
    try:
        yield
    finally:
        model.require_forward_param_sync = flag


def replay(model: nn.Module, capture: Capture, *, unsynchronised: Callable[[], AbstractContextManager[Any]],
           autocast: Callable[[], AbstractContextManager[Any]], device: torch.device) -> tuple[float, float]:
    """Repeat the captured micro-batch without synchronisation; return (forward_s, backward_s).

    Nothing in it is collective. Gradients, buffers, random states and DDP's forward flags are
    restored afterwards, so the caller's optimizer step sees exactly the gradients of the real
    backward and the next forward pass runs as it would have.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad.detach().clone() if p.grad is not None else None for p in params]
    buffers = list(model.buffers())
    saved_buffers = [b.detach().clone() for b in buffers]
    rng = _rng_states(device)
    try:
        with unsynchronised(), _local_forward(model):
            synchronize(device)
            start = time.perf_counter()
            with autocast():
                output = model(*capture.args, **capture.kwargs)
            synchronize(device)
            forwarded = time.perf_counter()
            leaves, _ = pytree.tree_flatten(output)
            pairs = [(leaves[i], g) for i, g in capture.output_grads.items()
                     if i < len(leaves) and isinstance(leaves[i], torch.Tensor) and leaves[i].requires_grad]
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
            synchronize(device)
            done = time.perf_counter()
    finally:
        _restore(params, grads, buffers, saved_buffers)
        _set_rng_states(rng, device)
    return forwarded - start, done - forwarded

