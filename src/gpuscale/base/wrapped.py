"""What this process trains: the strategy its model was wrapped with, and what follows for measuring.

`gpuscale.wrap` and `gpuscale.setup` announce it once the model is built (`announce`), and the HF
callback does when the Trainer wrapped the model itself; the
`Meter`'s summary (the strategy, and the gradient bytes the prediction's traffic model starts
from) and the evaluation loaders' hang check (is every forward pass a collective?) read it
(`latest`). These readers are not handed the model, so the record is process-wide, like the
runtime; it lives in its own module, below everything that reads it, so that no module writes
into another's objects. `gpuscale.init` forgets it when its runtime ends: a later `init` in the
same process starts blank (and `init` forgets it on entry too).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Wrapped", "announce", "latest", "forget"]


@dataclass(frozen=True)
class Wrapped:
    """The facts of the model this process trains."""

    strategy: str
    """The strategy's name (``ddp``, ``fsdp``, ``deepspeed``)."""
    gradient_bytes: int | None
    """Bytes of gradients one data-parallel step synchronises (trainable parameters in their dtype); None if unknown."""
    gathers_parameters: bool = False
    """True for strategies that shard the parameters and gather them in every forward pass on several ranks
    (FSDP, ZeRO-3), whatever this run's world size: the prediction counts 1.5x the gradient bytes for them."""
    collective_forward: bool = False
    """True when every forward pass is a collective (FSDP, ZeRO-3 on several ranks): all ranks must run the same number."""


_latest: Wrapped | None = None


def announce(facts: Wrapped) -> None:
    """Record the facts of the model just built (a later wrap, e.g. after unfreezing, replaces them)."""
    global _latest
    _latest = facts


def latest() -> Wrapped | None:
    """The facts of the last model built in this process's runtime, or None before any."""
    return _latest


def forget() -> None:
    """Drop the record (the runtime ended)."""
    global _latest
    _latest = None
