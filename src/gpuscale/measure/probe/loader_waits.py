"""Time a rank's waits for DataLoader batches: the pass over a loader each batch belongs to, and the hook on the loaders' iterators.

torch has no public hook for a batch leaving a DataLoader: the ``__next__`` of
``torch.utils.data.dataloader._BaseDataLoaderIter`` is wrapped, timing the wait for each batch and
counting its samples. One pass over a loader (an epoch, an evaluation) is a `Pass`; the recorder
(`gpuscale.measure.probe.recorder`) decides which pass a batch belongs to and whether it trained.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from gpuscale.base.batches import batch_len

__all__ = ["MAX_PASSES", "Pass", "next_pass", "hook_loaders"]

MAX_PASSES = 10_000
"""Loader passes kept one by one; later ones are folded into the last (a record stays small)."""


class Pass:
    """One pass over a DataLoader: its first request, last batch, waits, samples, and the steps taken during it."""

    __slots__ = ("first_at", "last_at", "ended", "batches", "samples", "unknown", "wait_s", "steps", "sizes")

    def __init__(self, now: float) -> None:
        self.first_at = self.last_at = now
        self.ended = False
        self.batches = self.samples = self.steps = 0
        self.unknown: str | None = None  # the type of a batch whose samples could not be counted
        self.wait_s = 0.0
        self.sizes: dict[int, int] = {}

    def add(self, waited: float, batch: Any) -> None:
        """`batch` came after `waited` seconds: count it, its wait and its samples."""
        self.last_at = time.time()
        self.batches += 1
        self.wait_s += waited
        size = _batch_len(batch)
        if size is None:
            self.unknown = type(batch).__name__
        else:
            self.samples += size
            self.sizes[size] = self.sizes.get(size, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"first_at": self.first_at, "last_at": self.last_at, "ended": self.ended, "batches": self.batches,
                "samples": None if self.unknown else self.samples, "unknown_batch": self.unknown,
                "wait_s": self.wait_s, "steps": self.steps, "batch_sizes": {str(k): v for k, v in sorted(self.sizes.items())}}


def next_pass(passes: list[Pass], start: float) -> Pass:
    """A new pass begun at `start`, added to `passes`; once MAX_PASSES are kept, the last one, reopened."""
    if len(passes) >= MAX_PASSES:
        state = passes[-1]
        state.ended = False
    else:
        state = Pass(start)
        passes.append(state)
    return state


def _batch_len(batch: Any) -> int | None:
    try:
        return batch_len(batch)
    except (ValueError, TypeError, StopIteration):
        return None


class LoaderListener(Protocol):
    """What the loader hook tells: a batch came out of an iterator, or the iterator is exhausted."""

    def batch(self, iterator: Any, fresh: bool, start: float, waited: float, batch: Any) -> None: ...

    def loader_end(self, iterator: Any) -> None: ...


def hook_loaders(recorder: LoaderListener) -> None:
    """Wrap every DataLoader iterator's ``__next__`` to time each batch's wait and tell `recorder`."""
    from torch.utils.data import dataloader

    iterator_class = dataloader._BaseDataLoaderIter
    original = iterator_class.__next__
    clock = time.perf_counter

    def __next__(self: Any) -> Any:
        fresh = getattr(self, "_num_yielded", 1) == 0  # a persistent-workers iterator starts a new pass
        start, wall = clock(), time.time()
        try:
            batch = original(self)
        except StopIteration:
            recorder.loader_end(self)
            raise
        recorder.batch(self, fresh, wall, clock() - start, batch)
        return batch

    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    iterator_class.__next__ = __next__  # type: ignore[method-assign]
