"""What every strategy answers: the `Strategy` protocol, and the training step DDP and FSDP share.

The rest of gpuscale asks a strategy, never its name: whether its state is sharded (checkpoints
become directories of shards) and whether such shards load on another number of ranks; whether
channels-last weights and fused optimizers suit it; why the sync probe cannot replay its steps;
and how one micro-batch goes backward and when the optimizer steps. `Training`
(`gpuscale.train.step`) runs the loop over these answers; `Checkpointer` saves and loads through them.

`ScriptStep` is the step of strategies whose optimizer the script's `Training` drives (DDP and
FSDP): the loss divided over the micro-batches and scaled for fp16, gradients synchronised on
the last micro-batch only, unscaled before clipping, zeroed after the step. DeepSpeed's engine
does all of that itself (`gpuscale.strategy.deepspeed`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

import torch
from torch import nn

from gpuscale.base.precision import Precision
from gpuscale.runtime.init import Runtime

__all__ = ["Strategy", "ScriptStep", "no_sync"]


class Strategy(Protocol):
    """How a model is spread over the ranks, and everything that follows from it."""

    name: str
    """The name the switch takes (``--strategy``)."""
    sharded: bool
    """Whether a distributed run's state is spread over the ranks: its checkpoints are directories of shards."""
    reshards: bool
    """Whether such sharded checkpoints load on another number of ranks."""
    channels_last_ok: bool
    """Whether convolution weights may take channels-last strides (sharding strategies keep flat shards)."""
    fused_by_default: bool
    """Whether ``fused=auto`` fuses the optimizer on a GPU."""
    builds_engine: bool
    """Whether the model and its optimizer are built together by `gpuscale.setup` (`wrap` alone refuses)."""

    def wrap(self, module: nn.Module, rt: Runtime, precision: Precision | None = None) -> nn.Module:
        """Return the model to train with, built around `module` (already unwrapped).

        `precision` is for strategies that cast parameters themselves (FSDP); the others leave it to autocast."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever `wrap` returned."""

    def gathers_parameters(self, model: nn.Module) -> bool:
        """Whether, on several ranks, `model`'s parameters are sharded and gathered for every forward pass
        (FSDP, ZeRO-3): forward passes are collectives then, and a step moves about 1.5x DDP's bytes."""

    def sync_probe_blocker(self, model: nn.Module) -> str | None:
        """Why the sync probe cannot replay a step of `model` without changing training (None: it can)."""

    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        """A full state dict with the user's own keys (no ``module.`` prefix)."""

    def load_state_dict(self, model: nn.Module, state: dict[str, Any]) -> None:
        """Load a state dict written by `state_dict` (or a plain one) into the model."""

    def optimizer_state_dict(self, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        """The optimizer's complete state (gathered if sharded); collective for sharding strategies."""

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
        """Load a state written by `optimizer_state_dict` (each rank keeps its part)."""

    def writes_checkpoint(self, rt: Runtime) -> bool:
        """Whether this rank writes a full-state checkpoint file (rank 0)."""

    def save_sharded(self, model: nn.Module, optimizer: Any, directory: str) -> None:
        """Every rank writes its shards into `directory` (collective); only when `sharded`."""

    def load_sharded(self, model: nn.Module, optimizer: Any, directory: str) -> None:
        """Every rank reads its shards back from `directory` (collective); only when `sharded`."""

    def grad_scaler(self, precision: Precision) -> torch.amp.GradScaler | None:
        """The gradient scaler the script's step uses (fp16), or None where the strategy scales itself."""

    def forward_context(self, model: nn.Module, last_micro_batch: bool) -> AbstractContextManager[Any]:
        """Around one micro-batch's forward pass: DDP decides there whether its backward synchronises."""

    def scale_loss(self, loss: torch.Tensor, micro_batches: int, scaler: torch.amp.GradScaler | None) -> torch.Tensor:
        """One micro-batch's mean loss made ready for `backward` (divided over the micro-batches, scaled)."""

    def backward(self, model: nn.Module, loss: torch.Tensor, last_micro_batch: bool) -> None:
        """Back-propagate `loss` (from `scale_loss`); gradients are synchronised on the last micro-batch."""

    def step(self, model: nn.Module, optimizer: Any, *, due: bool, scaler: torch.amp.GradScaler | None,
             clip_grad_norm: float | None) -> tuple[bool, Any]:
        """Step the optimizer if an optimizer step is `due` (its last micro-batch went backward).

        Returns whether it stepped, and the gradient norm before clipping where one was computed (a number, or a
        tensor left on the device: reading it waits for the GPU, so `Training.grad_norm` reads it only when asked)."""


class ScriptStep:
    """The training step of strategies whose optimizer the script's `Training` drives (DDP, FSDP)."""

    builds_engine = False

    def gathers_parameters(self, model: nn.Module) -> bool:
        return self.sharded  # type: ignore[attr-defined]

    def grad_scaler(self, precision: Precision) -> torch.amp.GradScaler | None:
        return precision.grad_scaler()

    def scale_loss(self, loss: torch.Tensor, micro_batches: int, scaler: torch.amp.GradScaler | None) -> torch.Tensor:
        if micro_batches > 1:
            loss = loss / micro_batches
        return scaler.scale(loss) if scaler is not None else loss

    def backward(self, model: nn.Module, loss: torch.Tensor, last_micro_batch: bool) -> None:
        with no_sync(model, skip=not last_micro_batch):
            loss.backward()

    def step(self, model: nn.Module, optimizer: Any, *, due: bool, scaler: torch.amp.GradScaler | None,
             clip_grad_norm: float | None) -> tuple[bool, Any]:
        if not due:
            return False, None
        norm = None
        if scaler is not None:
            scaler.unscale_(optimizer)
        if clip_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)  # on the device: Training reads it
            if hasattr(norm, "full_tensor"):  # FSDP: a DTensor, made whole here on every rank (a collective, not a wait)
                norm = norm.full_tensor()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return True, norm


def no_sync(model: nn.Module, skip: bool = True) -> AbstractContextManager[Any]:
    """Within this block, backward passes accumulate gradients without synchronising them.

    Use it for every micro-batch of a gradient-accumulation step except the last, around the
    forward pass and the backward pass (DDP decides in the forward, FSDP2 in the backward):
    ``with gpuscale.no_sync(model, skip=not last_micro_batch): loss_fn(model(x), y).backward()``.
    Under DDP the all-reduce waits; under FSDP2 the reduce-scatter waits (gradients stay unsharded
    meanwhile). `gpuscale.setup`'s `Training` does this for you.
    """
    if not skip:
        return nullcontext()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        return _fsdp_no_sync(model)
    if hasattr(model, "no_sync"):
        return model.no_sync()
    return nullcontext()


@contextmanager
def _fsdp_no_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
