"""Random transforms that resume exactly: each training sample seeded by (seed, epoch, index).

A random crop or flip inside ``Dataset.__getitem__`` draws from the global generators of the
process that loads the sample. In the main process those are in every checkpoint
(`gpuscale.base.rng.capture_rng`), but DataLoader worker processes have their own, seeded once
when the workers start and never saved: a run resumed from a checkpoint restarts every worker's
stream from its beginning, so from the first resumed batch on, its augmentations (and so its
weights) differ from those of the run that was not interrupted.

`make_loader` therefore wraps a training dataset loaded by workers in `SeededSamples`: before each
sample it seeds torch's, Python's and NumPy's generators from (seed, epoch, sample index) alone.
A sample then gets the same augmentation in a resumed run as in an uninterrupted one, and the same
whatever the number of workers or ranks. A dataset with a batched ``__getitems__`` (Hugging Face
datasets) keeps it: the seed then comes from the batch's first sample, still fixed by the epoch's
order, so resuming stays exact.

Loaded in the main process (``num_workers=0``), a sample's seeding must not disturb the training
loop's own random stream (dropout, the next shuffle): the generators' states are put back afterwards.
"""

from __future__ import annotations

import random
from collections.abc import Sized
from typing import Any

import torch
from torch.utils.data import Dataset, get_worker_info

from gpuscale.base.rng import capture_rng, restore_rng

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
    np = None  # type: ignore[assignment]

__all__ = ["SeededSamples", "sample_seed"]

_MASK64 = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers that scatters nearby inputs far apart."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of sample `index` in `epoch` of a run seeded with `seed`: 63 bits, a pure function."""
    return _mix(_mix(_mix(seed & _MASK64) ^ (epoch & _MASK64)) ^ (index & _MASK64)) >> 1


def _seed_generators(value: int) -> None:
    torch.default_generator.manual_seed(value)
    random.seed(value)
    if np is not None:
        np.random.seed(value & 0xFFFFFFFF)


class SeededSamples(Dataset):
    """`dataset` read with keys ``(epoch, index)``: seeds the generators, then returns ``dataset[index]``.

    The keys come from `gpuscale.runtime.data.ResumableDistributedSampler` with ``keyed=True``.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed
        if callable(getattr(dataset, "__getitems__", None)):
            # DataLoader looks this attribute up on the instance: only datasets that batch keep batching.
            self.__getitems__ = self._getitems

    def __len__(self) -> int:
        assert isinstance(self.dataset, Sized)
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        return self._seeded(sample_seed(self.seed, epoch, index), lambda: self.dataset[index])

    def _getitems(self, keys: list[tuple[int, int]]) -> Any:
        epoch, first = keys[0]
        indices = [index for _, index in keys]
        return self._seeded(sample_seed(self.seed, epoch, first), lambda: self.dataset.__getitems__(indices))  # type: ignore[attr-defined]

    @staticmethod
    def _seeded(value: int, load: Any) -> Any:
        if get_worker_info() is not None:  # a worker's generators are its own: nothing to put back
            _seed_generators(value)
            return load()

        cpu = torch.device("cpu")
        saved = capture_rng(cpu)
        try:
            _seed_generators(value)
            return load()
        finally:
            restore_rng(saved, cpu)
