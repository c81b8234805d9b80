"""Collated batches: how many samples one holds (one answer for the loaders, the Meter and the probe), and moving
one to a device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["batch_len", "to_device"]


def batch_len(batch: Any) -> int:
    """Number of samples in a collated batch (a tensor, or a tuple/list/mapping of them)."""
    if isinstance(batch, torch.Tensor):
        return len(batch)
    if isinstance(batch, Mapping):
        return batch_len(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        return batch_len(batch[0])
    raise ValueError(f"cannot tell how many samples a batch of type {type(batch).__name__} holds")


def to_device(batch: Any, device: torch.device) -> Any:
    """`batch` with every tensor in it on `device`: a tensor, or tuples, lists, named tuples and mappings of them (their
    types kept; an object with its own ``to(device)``, like transformers' BatchEncoding, moves itself; anything else,
    a string or a number, stays as it is). Copies to a GPU are asynchronous (non_blocking): from the loader's pinned
    memory they overlap the computation, and CUDA orders them before any kernel that reads the batch."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type != "cpu")
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(item, device) for item in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(item, device) for item in batch)
    if isinstance(batch, Mapping):
        moved = {key: to_device(value, device) for key, value in batch.items()}
        try:
            return type(batch)(moved)  # type: ignore[call-arg]  # dict and its kind take the items; others land below
        except TypeError:  # a mapping type that cannot be built from a dict
            return moved
    move = getattr(batch, "to", None)
    if callable(move):
        return move(device)
    return batch
