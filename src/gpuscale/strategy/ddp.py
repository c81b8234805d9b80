"""Strategy ``ddp``: every rank holds the whole model; gradients are averaged by all-reduce.

DistributedDataParallel registers, when it is built, the parameters that require gradients and
synchronises only those. Parameters unfrozen later train on each rank's own data and drift apart
silently. So the wrap remembers which parameters were trainable and the wrapped model refuses a
forward pass once that set changed, naming the parameters and the fix (`gpuscale.wrap` again).
The check also runs with a single process, where nothing would go wrong yet, so that the script
fails on the laptop instead of on the cluster.

Checkpoints hold the user's own keys: `state_dict` unwraps first, so ``module.`` never reaches a
file, and `load_state_dict` strips it from files written by other tools.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpuscale.base.precision import Precision
from gpuscale.runtime.init import Runtime
from gpuscale.strategy.base import ScriptStep, no_sync

__all__ = ["DDPStrategy", "install_trainable_guard"]

_GUARD = "_gpuscale_trainable_guard"


def _trainable(module: nn.Module) -> tuple[str, ...]:
    return tuple(name for name, p in module.named_parameters() if p.requires_grad)


def install_trainable_guard(wrapper: nn.Module, module: nn.Module) -> None:
    """Make `wrapper` refuse to run once `module`'s trainable parameters differ from now."""
    expected = _trainable(module)
    flags = [p.requires_grad for _, p in module.named_parameters()]

    def check(_wrapper: nn.Module, _args: Any) -> None:
        if [p.requires_grad for _, p in module.named_parameters()] == flags:
            return
        now = set(_trainable(module))
        unfrozen = sorted(now - set(expected))
        frozen = sorted(set(expected) - now)
        changed = "; ".join(
            part for part in (
                f"unfrozen: {', '.join(unfrozen[:5])}{' ...' if len(unfrozen) > 5 else ''}" if unfrozen else "",
                f"frozen: {', '.join(frozen[:5])}{' ...' if len(frozen) > 5 else ''}" if frozen else "",
            ) if part
        )
        raise RuntimeError(
            f"trainable parameters changed after gpuscale.wrap ({changed}); their gradients would not be "
            "synchronised across ranks. Call `model = gpuscale.wrap(model)` after changing requires_grad, "
            "then build the optimizer on the new model's parameters"
        )

    old = getattr(module, _GUARD, None)
    if old is not None:
        old.remove()
    handle = wrapper.register_forward_pre_hook(check)
    if wrapper is module:
        setattr(module, _GUARD, handle)


class DDPStrategy(ScriptStep):
    """Replicate the model on every rank; all-reduce gradients (torch DistributedDataParallel)."""

    name = "ddp"
    sharded = False
    reshards = True  # a full state dict loads on any number of ranks
    channels_last_ok = True
    fused_by_default = True

    def wrap(self, module: nn.Module, rt: Runtime, precision: Precision | None = None) -> nn.Module:
        """Replicate `module`; `precision` is applied by autocast in the forward pass, not here."""
        module = module.to(rt.device)
        if not any(p.requires_grad for p in module.parameters()):
            raise ValueError("the model has no trainable parameters; unfreeze some before gpuscale.wrap")
        if not rt.is_distributed:
            install_trainable_guard(module, module)
            return module
        old = getattr(module, _GUARD, None)
        if old is not None:  # the module was wrapped for one process before: drop that guard
            old.remove()
            delattr(module, _GUARD)
        ddp = DistributedDataParallel(
            module,
            device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
            # Gradients as views into the all-reduce buckets: one copy less per step.
            gradient_as_bucket_view=True,
        )
        install_trainable_guard(ddp, module)
        return ddp

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        return self.unwrap(model).state_dict()

    def load_state_dict(self, model: nn.Module, state: dict[str, Any]) -> None:
        if state and all(key.startswith("module.") for key in state):
            state = {key[len("module.") :]: value for key, value in state.items()}
        self.unwrap(model).load_state_dict(state)

    def optimizer_state_dict(self, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        return optimizer.state_dict()  # replicated: every rank holds the same, complete state

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)

    def writes_checkpoint(self, rt: Runtime) -> bool:
        return rt.rank == 0

    def save_sharded(self, model: nn.Module, optimizer: Any, directory: str) -> None:
        raise TypeError("ddp replicates the model: its checkpoint is one full state file, not shards")

    def load_sharded(self, model: nn.Module, optimizer: Any, directory: str) -> None:
        raise TypeError("ddp replicates the model: its checkpoint is one full state file, not shards")

    def sync_probe_blocker(self, model: nn.Module) -> str | None:
        return None  # a replay under no_sync leaves DDP's gradients and flags as they were

    def forward_context(self, model: nn.Module, last_micro_batch: bool) -> AbstractContextManager[Any]:
        """DDP decides in the forward pass whether the backward all-reduces: not before the last micro-batch."""
        return no_sync(model, skip=not last_micro_batch)
