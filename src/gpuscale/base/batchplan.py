"""Exact batch sizing for weak and strong scaling: how one optimizer step's samples divide among ranks.

Pure arithmetic, no torch: the study's planner (`gpuscale study`, `predict`) uses it without a
training process. `gpuscale.runtime.data` builds the loaders on it and exports the same names.

    plan = plan_batch(32, world_size=4, scaling="strong")   # 8 per device, global batch 32 exactly
    plan = plan_batch(25, world_size=2, scaling="strong")   # ValueError naming 24 or 26, or 1 or 5 ranks
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SCALINGS", "BatchPlan", "plan_batch"]

SCALINGS = ("weak", "strong")


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """How one optimizer step's samples are divided. global = per_device x accumulation x world."""

    scaling: str
    """'weak' (per-device batch fixed) or 'strong' (global batch fixed)."""
    world_size: int
    """Number of ranks sharing each step."""
    per_device_batch: int
    """Samples each rank loads per forward/backward pass (the loader's batch size)."""
    grad_accum_steps: int = 1
    """Forward/backward passes per optimizer step on each rank."""

    def __post_init__(self) -> None:
        assert self.scaling in SCALINGS, self.scaling
        assert self.world_size >= 1 and self.per_device_batch >= 1 and self.grad_accum_steps >= 1, self

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.per_device_batch * self.grad_accum_steps * self.world_size

    def as_dict(self) -> dict[str, Any]:
        return {
            "scaling": self.scaling,
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "per_device_batch": self.per_device_batch,
            "grad_accum_steps": self.grad_accum_steps,
        }


def _smallest_accumulation(samples_per_rank: int, max_per_device: int | None) -> int:
    if max_per_device is None or samples_per_rank <= max_per_device:
        return 1
    for accum in range(2, samples_per_rank + 1):
        if samples_per_rank % accum == 0 and samples_per_rank // accum <= max_per_device:
            return accum
    raise AssertionError("unreachable: accum = samples_per_rank always fits")


def plan_batch(batch_size: int, world_size: int, scaling: str = "weak", max_per_device: int | None = None) -> BatchPlan:
    """Plan the batch of each rank from the batch of the one-GPU job.

    batch_size: for 'weak', the batch each device processes; for 'strong', the global batch.
    max_per_device: the most samples one device can hold per pass; above it the per-rank share is
    split into equal gradient-accumulation steps (never rounded).
    """
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not one of {', '.join(SCALINGS)}")
    for name, value in (("batch size", batch_size), ("world size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} {value!r} must be a positive integer")
    if max_per_device is not None and (not isinstance(max_per_device, int) or isinstance(max_per_device, bool) or max_per_device < 1):
        raise ValueError(f"max per-device batch {max_per_device!r} must be a positive integer")

    if scaling == "weak":
        per_rank = batch_size
    else:
        if batch_size % world_size:
            lower = batch_size // world_size * world_size
            choices = " or ".join(str(c) for c in (lower, lower + world_size) if c > 0)
            dividers = [n for n in range(1, min(batch_size, 4 * world_size) + 1) if batch_size % n == 0]
            raise ValueError(
                f"global batch {batch_size} does not divide among {world_size} ranks "
                f"({batch_size} // {world_size} = {batch_size // world_size} would silently train with "
                f"{lower}); use a global batch of {choices}, or run on {', '.join(map(str, dividers))} ranks"
            )
        per_rank = batch_size // world_size
    accum = _smallest_accumulation(per_rank, max_per_device)
    return BatchPlan(scaling=scaling, world_size=world_size, per_device_batch=per_rank // accum, grad_accum_steps=accum)
