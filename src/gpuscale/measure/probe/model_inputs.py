"""Samples counted from what the training model receives: for scripts that feed batches without a DataLoader.

nanoGPT's `get_batch` and many research scripts draw tensors from a memmap or a tensor in memory
and hand them to the model; no DataLoader sees a batch. The probe then counts each forward pass of
the model the script trains (the largest `DistributedDataParallel` it made, found as `ddp_timers`
finds it): a forward pre-hook (public: ``register_forward_pre_hook``) reads the batch dimension of
the first tensor argument, in training mode with gradients on (an evaluation under ``no_grad`` or
``model.eval()`` does not count). One forward is one micro-batch; the merge uses these counts only
for a rank whose training saw no DataLoader (`gpuscale.measure.probe.merge`, ``samples_from``), and only the forwards
up to the last optimizer step (`stepped`): a forward whose step never came (the run failed, or ended in the middle of
an accumulation) trained nothing.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gpuscale.base.batches import batch_len

__all__ = ["ModelInputs"]


class ModelInputs:
    """The forward passes of one model in training: how many, their samples, and the first one's time."""

    def __init__(self) -> None:
        self.calls = 0
        self.samples = 0
        self.sizes: dict[int, int] = {}
        self.unknown: str | None = None  # the type of an input whose batch size could not be read
        self.first_at: float | None = None
        self.stepped_calls = 0  # the forwards and samples up to the last optimizer step
        self.stepped_samples = 0
        self._handle: Any = None

    def watch(self, module: torch.nn.Module) -> None:
        """Count `module`'s forward passes from now on (and no longer those of the module watched before)."""
        if self._handle is not None:
            self._handle.remove()
        # kept out of a compiled graph (`torch.compile(DDP(model))`): counting is host bookkeeping, not the model's
        self._handle = module.register_forward_pre_hook(torch.compiler.disable(self._forward), with_kwargs=True)

    def _forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not module.training or not torch.is_grad_enabled():
            return
        if self.first_at is None:
            self.first_at = time.time()
        self.calls += 1
        first = args if args else tuple(kwargs.values())
        try:
            size = batch_len(first)
        except (ValueError, TypeError, StopIteration):
            self.unknown = type(first[0]).__name__ if first else "nothing"
            return
        self.samples += size
        self.sizes[size] = self.sizes.get(size, 0) + 1

    def stepped(self) -> None:
        """The optimizer stepped: every forward so far trained the model."""
        self.stepped_calls, self.stepped_samples = self.calls, self.samples

    def as_dict(self) -> dict[str, Any] | None:
        """The record's "inputs": None if the model never trained on a forward pass. ``calls`` and ``samples`` are
        those of the forwards up to the last optimizer step (all of them where none stepped); ``after_last_step`` the
        forwards after it."""
        if not self.calls:
            return None
        calls, samples = (self.stepped_calls, self.stepped_samples) if self.stepped_calls else (self.calls, self.samples)
        return {"calls": calls, "samples": None if self.unknown else samples, "unknown_batch": self.unknown,
                "after_last_step": self.calls - calls, "first_at": self.first_at,
                "batch_sizes": {str(k): v for k, v in sorted(self.sizes.items())}}
