"""Random-number states of this process, captured and put back: what makes a resumed run end bit for
bit like an uninterrupted one.

torch's (CPU and the current GPU), Python's and NumPy's generators, in types that a checkpoint
loaded with ``weights_only=True`` accepts (tensors, tuples, numbers). Used by `gpuscale.train.checkpoint`
for every rank's state and by `gpuscale.runtime.sample_seeds` for the seeds of loader workers. A leaf:
it imports nothing of gpuscale.
"""

from __future__ import annotations

import random
from typing import Any

import torch

__all__ = ["capture_rng", "restore_rng"]


def capture_rng(device: torch.device) -> dict[str, Any]:
    """This process's random-number states, in types `weights_only` loading accepts."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    try:
        import numpy as np

        legacy: Any = np.random.get_state()  # the tuple form, numpy's default (its stubs say tuple or dict)
        kind, keys, pos, has_gauss, cached = legacy
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    except ImportError:
        pass
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Put back states captured by `capture_rng`."""
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def _as_tuple(value: Any) -> Any:
    """Lists back to tuples, nested (a checkpoint may have turned Python's state tuple into lists)."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
