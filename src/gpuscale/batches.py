"""How many samples a collated batch holds: one answer for the loaders, the Meter and the probe."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["batch_len"]


def batch_len(batch: Any) -> int:
    """Number of samples in a collated batch (a tensor, or a tuple/list/mapping of them)."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    if isinstance(batch, Mapping):
        return batch_len(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        return batch_len(batch[0])
    raise ValueError(f"cannot tell how many samples a batch of type {type(batch).__name__} holds")
