"""Data: exact batch sizing for weak and strong scaling, and sharded loaders that resume.

Weak scaling keeps the per-device batch: N GPUs see N times the samples per step. Strong scaling
keeps the global batch: each of N GPUs sees 1/N of it, so the optimisation is the same as on one
GPU and only the speed changes. The global batch is exact: 25 samples on 2 ranks is refused with
the nearest valid choices instead of silently training with 2 x 12 = 24 (docs/classic-bugs.md, bug 7).

    plan = gpuscale.plan_batch(32, world_size=rt.world_size, scaling="strong")
    train = gpuscale.make_loader(train_set, plan, shuffle=True)
    for epoch in range(epochs):
        for x, y in train:          # the sampler's epoch is set for you
            ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from gpuscale.base import wrapped
from gpuscale.base.batches import batch_len
from gpuscale.base.batches import to_device as move_to_device
from gpuscale.base.batchplan import BatchPlan, plan_batch
from gpuscale.detect.log import get_logger
from gpuscale.runtime.init import Runtime, current
from gpuscale.runtime.sample_seeds import SeededSamples

log = get_logger("data")

__all__ = ["BatchPlan", "plan_batch", "make_loader", "ShardedLoader", "ResumableDistributedSampler", "EvalShardSampler"]


class ResumableDistributedSampler(DistributedSampler):
    """A DistributedSampler that can start an epoch part-way, at `start_index` of this rank's share, and end it
    early, at `stop_index` (None: the share's end).

    Resuming a checkpoint taken mid-epoch then continues with exactly the samples that were next,
    without loading the ones already seen; an epoch of whole optimizer steps loads none it leaves out
    (`ShardedLoader`). keyed=True yields ``(epoch, index)`` pairs instead of
    indices, for a dataset wrapped in `gpuscale.runtime.sample_seeds.SeededSamples`.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, shuffle: bool, seed: int, drop_last: bool,
                 keyed: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)  # type: ignore[arg-type]
        self.start_index = 0
        self.stop_index: int | None = None
        self.keyed = keyed

    def __iter__(self) -> Iterator[Any]:
        indices = list(super().__iter__())[self.start_index : self.stop_index]
        if self.keyed:
            return iter([(self.epoch, index) for index in indices])
        return iter(indices)

    def __len__(self) -> int:
        end = self.num_samples if self.stop_index is None else min(self.stop_index, self.num_samples)
        return max(0, end - self.start_index)


class EvalShardSampler(Sampler[int]):
    """Every index exactly once over all ranks: rank r takes r, r+N, r+2N, ...

    DistributedSampler pads the last ranks with repeated samples, which biases an accuracy summed
    over ranks; evaluation wants each sample counted once. So by default shards are not padded
    and may differ by one sample (and so by one batch).

    even=True pads every shard to the same length with repeats of its own first samples, for
    models whose forward pass is itself collective (FSDP, ZeRO-3): every rank must run the same
    number of forward passes or the last one waits forever. The padding is marked, not hidden:
    `num_real` samples come first, and `ShardedLoader.masked()` yields the mask to count only them.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, even: bool = False) -> None:
        self.size, self.num_replicas, self.rank, self.even = len(dataset), num_replicas, rank, even
        self.num_real = len(range(rank, self.size, num_replicas))
        self.num_samples = math.ceil(self.size / num_replicas) if even else self.num_real

    def __iter__(self) -> Iterator[int]:
        indices = list(range(self.rank, self.size, self.num_replicas))
        missing = self.num_samples - len(indices)
        padding = (indices or [0]) * missing  # repeats of real samples: same shapes, never counted
        return iter(indices + padding[:missing])

    def __len__(self) -> int:
        return self.num_samples


class ShardedLoader:
    """A DataLoader over this rank's shard that sets the sampler's epoch itself and can resume.

    Each complete pass (``for batch in loader``) is one epoch: the sampler is reshuffled with the
    epoch number before the pass, so every epoch has a new order (docs/classic-bugs.md, bug 2), the same on
    all ranks. `state_dict()` records the epoch and the batches already taken in it; after
    `load_state_dict()` the next pass resumes with the next batch.

    A training pass that drops incomplete batches (make_loader's default) also ends on a whole optimizer step: with
    gradient accumulation it leaves out the micro-batches of a last incomplete step, as it leaves out a last incomplete
    batch. Otherwise their gradients would be added into the next epoch's first step, and the checkpoint at the epoch's
    end, which holds no gradients, would resume without them.
    """

    def __init__(self, loader: DataLoader, sampler: Sampler[int], plan: BatchPlan, train: bool,
                 device: torch.device | None = None) -> None:
        self.loader, self.sampler, self.plan, self.train = loader, sampler, plan, train
        self.device = device
        """Where each batch is moved before it is handed out (None: left where the collate function made it)."""
        self.epoch = 0
        self.batches_done = 0

    def __len__(self) -> int:
        """The batches of a whole pass, from the epoch's start (a resumed pass hands out those after its position)."""
        share = self.sampler.num_samples if isinstance(self.sampler, ResumableDistributedSampler) else len(self.sampler)  # type: ignore[arg-type]
        batch = self.plan.per_device_batch
        batches = share // batch if self.loader.drop_last else math.ceil(share / batch)
        if self.train and self.loader.drop_last:
            batches -= batches % self.plan.grad_accum_steps  # whole optimizer steps (see the class docstring)
        return batches

    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at the beginning of `epoch` (rarely needed: passes count themselves)."""
        self.epoch, self.batches_done = epoch, 0

    def __iter__(self) -> Iterator[Any]:
        if isinstance(self.sampler, EvalShardSampler) and self.sampler.even:
            raise ValueError("this evaluation loader pads shards to equal length (even=True); iterate it with "
                             "`for batch, mask in loader.masked():` and count only the samples where mask is True")
        _check_even_batches(self)
        return self._passes()

    def masked(self) -> Iterator[tuple[Any, torch.Tensor]]:
        """One pass yielding (batch, mask): mask is a CPU bool tensor, False for padding samples.

        For evaluation loaders made with even=True; for any other loader the mask is all True.
        """
        _check_even_batches(self)
        real = self.sampler.num_real if isinstance(self.sampler, EvalShardSampler) else None
        position = 0
        for batch in self._passes():
            count = batch_len(batch)
            mask = torch.ones(count, dtype=torch.bool) if real is None else torch.arange(position, position + count) < real
            position += count
            yield batch, mask

    def _passes(self) -> Iterator[Any]:
        if isinstance(self.sampler, ResumableDistributedSampler):
            self.sampler.set_epoch(self.epoch)
            self.sampler.start_index = self.batches_done * self.plan.per_device_batch
            self.sampler.stop_index = len(self) * self.plan.per_device_batch  # whole steps: none loaded to be left out
        for batch in self.loader:
            self.batches_done += 1
            yield batch if self.device is None else move_to_device(batch, self.device)
        if isinstance(self.sampler, ResumableDistributedSampler):
            self.sampler.start_index = 0
        self.epoch += 1
        self.batches_done = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches_done": self.batches_done, "per_device_batch": self.plan.per_device_batch,
                "world_size": self.plan.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at the saved position, kept in samples over all ranks: a job with another batch or another number of
        ranks continues the interrupted epoch after the samples it had trained. A training sampler deals the epoch's
        one shuffled order out rank by rank, so the samples trained first are its first ones whatever the number of
        ranks, and the rest of the epoch is the samples not yet trained (but for the few a sampler repeats to even out the
        ranks' shares). Where that position is not a whole number of this job's optimizer steps (its batches over all
        ranks, times its accumulation), it resumes at the step that holds it (and says how many samples are trained
        twice). A state from before the world size was saved is taken as this job's."""
        self.epoch, self.batches_done = int(state["epoch"]), int(state["batches_done"])
        saved_batch = int(state.get("per_device_batch", self.plan.per_device_batch))
        saved_world = int(state.get("world_size", self.plan.world_size))
        # a training position (another plan's, or this plan's inside an accumulation: a checkpoint from before epochs
        # ended on a whole step) resumes at the start of the step that holds it; a whole step's stays where it is
        if self.train or (saved_batch, saved_world) != (self.plan.per_device_batch, self.plan.world_size):
            trained = self.batches_done * saved_batch * saved_world
            per_step = self.plan.per_device_batch * self.plan.world_size * self.plan.grad_accum_steps
            steps, again = divmod(trained, per_step)  # at an optimizer step's start: its micro-batches whole
            self.batches_done = steps * self.plan.grad_accum_steps
            if again and getattr(self.sampler, "rank", 0) == 0:
                log.warning("resuming epoch %d after %d samples, not a whole number of this job's optimizer steps (%d "
                            "samples over all ranks): the last %d are trained again", self.epoch + 1, trained, per_step, again)
        self.batches_done = min(self.batches_done, len(self))


def _check_even_batches(loader: ShardedLoader) -> None:
    """Refuse, before it hangs, an uneven evaluation pass under a strategy whose forward pass is collective."""
    sampler = loader.sampler
    if not isinstance(sampler, EvalShardSampler) or sampler.even:
        return
    batch = loader.plan.per_device_batch
    most, fewest = math.ceil(sampler.size / sampler.num_replicas), sampler.size // sampler.num_replicas
    if math.ceil(most / batch) == math.ceil(fewest / batch):
        return  # shards differ by a sample at most, but every rank runs the same number of batches
    facts = wrapped.latest()
    if facts is not None and facts.collective_forward:
        raise ValueError(f"evaluation shards differ by one batch and under {facts.strategy} every forward pass is "
                         "collective, so the ranks would wait on each other forever; make the loader with "
                         "make_loader(..., train=False, even=True) and iterate `loader.masked()`")


def default_num_workers(num_cores: int, device: torch.device) -> int:
    """Loader workers for a rank bound to `num_cores` cores.

    On a GPU the main process only feeds the device, so the other bound cores load data (the
    course's SLURM_CPUS_PER_TASK / GPUs per task, minus the main process), at most 8. On a CPU the
    bound cores are busy computing, so loading happens in the main process.
    """
    if device.type == "cpu":
        return 0
    return max(0, min(num_cores - 1, 8))


def _check_loader_arguments(dataset: Dataset, plan: BatchPlan, world: int, *, train: bool, even: bool,
                            seed_samples: bool | None) -> None:
    """Refuse, with the fix, what `make_loader` cannot load from."""
    if not isinstance(dataset, Sized):
        raise ValueError("make_loader needs a dataset with a length (a map-style Dataset)")
    if len(dataset) == 0:
        raise ValueError("the dataset is empty; check the data path")
    if plan.world_size != world:
        raise ValueError(f"the batch plan is for {plan.world_size} ranks but this job has {world}; plan with world_size={world}")
    if train and even:
        raise ValueError("even=True is for evaluation loaders (train=False); training shards are always equal")
    if seed_samples and not train:
        raise ValueError("seed_samples=True is for training loaders; an evaluation loader should not transform at random")


def make_loader(
    dataset: Dataset,
    plan: BatchPlan,
    *,
    train: bool = True,
    shuffle: bool | None = None,
    drop_last: bool | None = None,
    seed: int = 0,
    num_workers: int | None = None,
    pin_memory: bool | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    even: bool = False,
    seed_samples: bool | None = None,
    to_device: bool = True,
    rt: Runtime | None = None,
) -> ShardedLoader:
    """A loader of this rank's shard with the plan's per-device batch.

    train=True: shuffled (unless shuffle=False), padded to equal shares and dropping the last
    incomplete batch (unless drop_last=False) so every step has exactly the global batch; with gradient
    accumulation, an epoch is a whole number of optimizer steps (see `ShardedLoader`). What is left out is the
    end of each epoch's order: other samples every epoch when shuffled, the same ones with shuffle=False.
    train=False: every sample exactly once over all ranks, in order; reduce metrics with
    `gpuscale.measure.metrics` to get the whole-dataset value.
    even (train=False only): pad the shards to equal length, as FSDP and ZeRO-3 need; iterate
    with `loader.masked()` to skip the padding (see `EvalShardSampler`).
    num_workers: default from the cores this rank is bound to (`default_num_workers`).
    pin_memory: page-locked batches for faster, asynchronous copies to the GPU (default: on GPUs).
    to_device: hand out each batch on the rank's device (`rt.device`), as Accelerate's and Lightning's loaders do, so a
    first GPU run does not fail on a forgotten ``.to(device)``: every tensor in the batch (tuples, lists, named tuples,
    dicts, transformers' BatchEncoding) is copied asynchronously from pinned memory, which overlaps the computation.
    A ``.to(device)`` of your own then costs nothing. False leaves batches where the collate function made them
    (the CPU). On a CPU rank nothing moves either way. `masked()`'s mask stays a CPU tensor.
    seed_samples (train=True only): seed the random generators from (seed, epoch, sample index)
    before each sample, so random transforms in the dataset resume exactly from a checkpoint
    (`gpuscale.runtime.sample_seeds`). Default: on when workers load the samples, whose generators no
    checkpoint holds; in the main process the checkpoint's random state already suffices.
    """
    rt = rt or current()
    _check_loader_arguments(dataset, plan, rt.world_size, train=train, even=even, seed_samples=seed_samples)
    world, rank = rt.world_size, rt.rank
    sampler: Sampler[int]
    workers = default_num_workers(len(rt.cores), rt.device) if num_workers is None else num_workers
    if train:
        drop_last = True if drop_last is None else drop_last
        keyed = workers > 0 if seed_samples is None else seed_samples
        sampler = ResumableDistributedSampler(dataset, world, rank, shuffle=True if shuffle is None else shuffle, seed=seed,
                                              drop_last=False, keyed=keyed)
        if keyed:
            dataset = SeededSamples(dataset, seed)
    else:
        drop_last = bool(drop_last)
        sampler = EvalShardSampler(dataset, world, rank, even=even)
    # No more workers than the shard has batches: an evaluation set of 3 batches gets 3, not 8 idle processes, each
    # a fork of a process that may hold CUDA and NCCL threads (an FSDP test hung forking them on one GPU)
    batches = math.ceil(len(sampler) / plan.per_device_batch)  # type: ignore[arg-type]
    workers = min(workers, max(batches, 1)) if num_workers is None else workers
    loader = DataLoader(
        dataset,
        batch_size=plan.per_device_batch,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=rt.device.type == "cuda" if pin_memory is None else pin_memory,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(seed + rank),
    )
    if train and len(loader) == 0:
        raise ValueError(
            f"each rank gets {math.ceil(len(dataset) / world)} samples, fewer than one batch of "
            f"{plan.per_device_batch}; use a smaller batch or more data"
        )
    sharded = ShardedLoader(loader, sampler, plan, train, device=rt.device if to_device and rt.device.type != "cpu" else None)
    if train and len(sharded) == 0:
        raise ValueError(
            f"each rank gets {len(loader)} batch(es) of {plan.per_device_batch} an epoch, fewer than one optimizer step's "
            f"{plan.grad_accum_steps} (gradient accumulation); use a smaller global batch, a larger per-device maximum, "
            "or more data"
        )
    return sharded
