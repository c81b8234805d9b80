"""Unit tests for gpuscale.runtime.data: exact batch plans, resumable and evaluation samplers, ShardedLoader."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from gpuscale.runtime.data import (
    BatchPlan,
    EvalShardSampler,
    ResumableDistributedSampler,
    ShardedLoader,
    default_num_workers,
    make_loader,
    plan_batch,
)
from gpuscale.runtime.sample_seeds import sample_seed

# --------------------------------------------------------------------------------------------------
# plan_batch


def test_weak_scaling_keeps_per_device_batch():
    for world in (1, 2, 8):
        plan = plan_batch(32, world, scaling="weak")
        assert plan.per_device_batch == 32
        assert plan.grad_accum_steps == 1
        assert plan.global_batch == 32 * world
        assert plan.world_size == world and plan.scaling == "weak"


def test_weak_is_the_default():
    assert plan_batch(25, 2).scaling == "weak"
    assert plan_batch(25, 2).global_batch == 50


def test_strong_scaling_keeps_global_batch():
    for world in (1, 2, 4, 8, 16, 32):
        plan = plan_batch(32, world, scaling="strong")
        assert plan.global_batch == 32
        assert plan.per_device_batch == 32 // world
        assert plan.grad_accum_steps == 1


def test_strong_scaling_25_over_2_ranks_is_refused_with_nearest_choices():
    with pytest.raises(ValueError) as info:
        plan_batch(25, 2, scaling="strong")
    msg = str(info.value)
    assert "25" in msg and "2 ranks" in msg  # what was asked
    assert "24" in msg and "26" in msg  # the nearest valid global batches
    assert "silently" in msg


@pytest.mark.parametrize("batch,world", [(25, 2), (32, 3), (10, 4), (7, 8), (100, 64)])
def test_strong_scaling_never_integer_divides(batch, world):
    with pytest.raises(ValueError) as info:
        plan_batch(batch, world, scaling="strong")
    lower = batch // world * world
    msg = str(info.value)
    assert str(lower + world) in msg
    if lower:
        assert str(lower) in msg


def test_strong_scaling_batch_smaller_than_world_offers_world():
    with pytest.raises(ValueError) as info:
        plan_batch(2, 4, scaling="strong")
    msg = str(info.value)
    assert "global batch of 4" in msg
    assert "of 0 " not in msg  # a global batch of 0 is no choice


def test_strong_scaling_error_suggests_world_sizes_that_divide():
    with pytest.raises(ValueError) as info:
        plan_batch(25, 2, scaling="strong")
    assert "1, 5" in str(info.value)


@pytest.mark.parametrize("scaling,batch,world,max_dev,per_dev,accum", [
    ("weak", 32, 2, 10, 8, 4),       # 32 -> 4 x 8
    ("weak", 32, 1, 32, 32, 1),      # fits
    ("weak", 32, 1, 16, 16, 2),
    ("weak", 13, 1, 4, 1, 13),       # prime: 13 x 1, never rounded
    ("strong", 256, 4, 48, 32, 2),   # 64 per rank -> 2 x 32
    ("strong", 96, 2, 20, 16, 3),    # 48 per rank -> 3 x 16
    ("strong", 32, 8, 100, 4, 1),
])
def test_gradient_accumulation_gives_exact_equal_micro_batches(scaling, batch, world, max_dev, per_dev, accum):
    plan = plan_batch(batch, world, scaling=scaling, max_per_device=max_dev)
    assert (plan.per_device_batch, plan.grad_accum_steps) == (per_dev, accum)
    assert plan.per_device_batch <= max_dev
    per_rank = batch if scaling == "weak" else batch // world
    assert plan.per_device_batch * plan.grad_accum_steps == per_rank  # exact, nothing dropped
    assert plan.global_batch == per_rank * world


def test_gradient_accumulation_uses_the_fewest_steps():
    # 60 per rank, at most 25 per pass: 3 x 20 (not 4 x 15, 5 x 12, ...)
    plan = plan_batch(60, 1, max_per_device=25)
    assert (plan.per_device_batch, plan.grad_accum_steps) == (20, 3)


@pytest.mark.parametrize("kwargs", [
    dict(batch_size=0, world_size=1),
    dict(batch_size=-4, world_size=1),
    dict(batch_size=32, world_size=0),
    dict(batch_size=32.0, world_size=2),
    dict(batch_size="32", world_size=2),
    dict(batch_size=True, world_size=1),
    dict(batch_size=32, world_size=1.5),
    dict(batch_size=32, world_size=2, scaling="medium"),
    dict(batch_size=32, world_size=2, scaling="Strong"),
    dict(batch_size=32, world_size=2, max_per_device=0),
    dict(batch_size=32, world_size=2, max_per_device=-1),
    dict(batch_size=32, world_size=2, max_per_device=8.0),
])
def test_plan_batch_invalid_inputs(kwargs):
    with pytest.raises(ValueError):
        plan_batch(**kwargs)


def test_plan_batch_invalid_scaling_names_choices():
    with pytest.raises(ValueError) as info:
        plan_batch(32, 2, scaling="medium")
    assert "'medium'" in str(info.value) and "weak" in str(info.value) and "strong" in str(info.value)


def test_plan_batch_rejects_bool_max_per_device():
    with pytest.raises(ValueError):
        plan_batch(32, 2, max_per_device=True)


def test_batch_plan_as_dict():
    plan = plan_batch(64, 2, scaling="strong", max_per_device=16)
    assert plan.as_dict() == {"scaling": "strong", "world_size": 2, "global_batch": 64,
                              "per_device_batch": 16, "grad_accum_steps": 2}


# --------------------------------------------------------------------------------------------------
# samplers


@pytest.mark.parametrize("size,world", [(20, 2), (21, 2), (10, 3), (7, 4)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_resumable_sampler_shards_are_disjoint_and_cover(size, world, shuffle):
    shards = [list(ResumableDistributedSampler(range(size), world, r, shuffle=shuffle, seed=3, drop_last=False))
              for r in range(world)]
    lengths = {len(s) for s in shards}
    assert len(lengths) == 1  # equal shares (padded)
    everything = [i for s in shards for i in s]
    assert set(everything) == set(range(size))  # covers
    if size % world == 0:
        assert sorted(everything) == list(range(size))  # disjoint
    else:
        assert len(everything) - len(set(everything)) == (-size) % world  # only the padding repeats


@pytest.mark.parametrize("start", [0, 1, 4, 9, 10])
def test_resumable_sampler_start_index_skips_exactly_the_seen(start):
    for rank in range(2):
        full = ResumableDistributedSampler(range(20), 2, rank, shuffle=True, seed=7, drop_last=False)
        full.set_epoch(3)
        expected = list(full)
        resumed = ResumableDistributedSampler(range(20), 2, rank, shuffle=True, seed=7, drop_last=False)
        resumed.set_epoch(3)
        resumed.start_index = start
        got = list(resumed)
        assert got == expected[start:]
        assert len(resumed) == len(got) == 10 - start


def test_resumable_sampler_epochs_differ_and_seed_repeats():
    def order(epoch, seed=0):
        s = ResumableDistributedSampler(range(50), 2, 0, shuffle=True, seed=seed, drop_last=False)
        s.set_epoch(epoch)
        return list(s)

    assert order(0) != order(1)
    assert order(1) == order(1)
    assert order(0, seed=1) != order(0, seed=0)


@pytest.mark.parametrize("size,world", [(10, 1), (10, 2), (10, 3), (7, 4), (3, 8), (100, 7)])
def test_eval_shard_sampler_every_index_once(size, world):
    shards = [list(EvalShardSampler(range(size), world, r)) for r in range(world)]
    everything = [i for s in shards for i in s]
    assert sorted(everything) == list(range(size))  # every index exactly once, no padding
    for r, shard in enumerate(shards):
        assert len(EvalShardSampler(range(size), world, r)) == len(shard)
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1  # uneven sizes are fine, but balanced


def test_eval_shard_sampler_uneven_sizes():
    assert [len(EvalShardSampler(range(10), 3, r)) for r in range(3)] == [4, 3, 3]


# --------------------------------------------------------------------------------------------------
# make_loader / ShardedLoader


class Indices(Dataset):
    """Item i is the integer i, so batches show which samples were loaded."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def rt(rank=0, world=1, cores=(0,)):
    return SimpleNamespace(world_size=world, rank=rank, cores=tuple(cores), device=torch.device("cpu"))


def passes(loader, n):
    return [[b.tolist() for b in loader] for _ in range(n)]


def test_loader_batches_have_the_plan_batch_size():
    plan = plan_batch(4, 1)
    loader = make_loader(Indices(18), plan, rt=rt())
    batches = [b.tolist() for b in loader]
    assert isinstance(loader, ShardedLoader)
    assert len(batches) == len(loader) == 4  # last incomplete batch dropped in training
    assert all(len(b) == 4 for b in batches)


def test_loader_consecutive_passes_reshuffle():
    loader = make_loader(Indices(40), plan_batch(4, 1), rt=rt(), seed=5)
    epochs = passes(loader, 3)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    for epoch in epochs:
        assert sorted(i for b in epoch for i in b) == list(range(40))


def test_loader_same_seed_same_order_on_recreation():
    a = passes(make_loader(Indices(40), plan_batch(4, 1), rt=rt(), seed=5), 2)
    b = passes(make_loader(Indices(40), plan_batch(4, 1), rt=rt(), seed=5), 2)
    c = passes(make_loader(Indices(40), plan_batch(4, 1), rt=rt(), seed=6), 2)
    assert a == b
    assert a != c


def test_loader_shuffle_false_keeps_order():
    loader = make_loader(Indices(8), plan_batch(4, 1), rt=rt(), shuffle=False)
    assert passes(loader, 2) == [[[0, 1, 2, 3], [4, 5, 6, 7]]] * 2


def test_loader_two_ranks_disjoint_every_epoch():
    plan = plan_batch(8, 2, scaling="strong")
    loaders = [make_loader(Indices(40), plan, rt=rt(r, 2), seed=1) for r in range(2)]
    for _ in range(3):
        seen = [[i for b in loader for i in b.tolist()] for loader in loaders]
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(40))


def test_loader_state_dict_after_k_batches_resumes_with_the_next_batches():
    plan = plan_batch(4, 2, scaling="weak")
    for rank in range(2):
        reference = passes(make_loader(Indices(50), plan, rt=rt(rank, 2), seed=11), 3)
        for epoch, k in [(0, 0), (0, 1), (0, 3), (1, 2), (2, 5)]:
            first = make_loader(Indices(50), plan, rt=rt(rank, 2), seed=11)
            for _ in range(epoch):
                list(first)
            taken = [b.tolist() for b in itertools.islice(first, k)]
            assert taken == reference[epoch][:k]
            state = first.state_dict()
            assert state == {"epoch": epoch, "batches_done": k, "per_device_batch": first.plan.per_device_batch, "world_size": 2}

            resumed = make_loader(Indices(50), plan, rt=rt(rank, 2), seed=11)
            resumed.load_state_dict(state)
            rest = passes(resumed, 3 - epoch)
            assert rest[0] == reference[epoch][k:]  # exactly the next batches
            assert rest[1:] == reference[epoch + 1:]  # and the following epochs are whole again


def test_loader_state_dict_after_the_last_batch_resumes_with_the_next_epoch():
    plan = plan_batch(4, 1)
    reference = passes(make_loader(Indices(16), plan, rt=rt(), seed=2), 2)
    first = make_loader(Indices(16), plan, rt=rt(), seed=2)
    for _ in itertools.islice(first, 4):  # a checkpoint written inside the loop body, on the last batch
        pass
    resumed = make_loader(Indices(16), plan, rt=rt(), seed=2)
    resumed.load_state_dict(first.state_dict())
    assert [b.tolist() for b in resumed] == []
    assert [b.tolist() for b in resumed] == reference[1]


def test_loader_full_pass_state_points_at_next_epoch():
    loader = make_loader(Indices(16), plan_batch(4, 1), rt=rt())
    list(loader)
    assert loader.state_dict() == {"epoch": 1, "batches_done": 0, "per_device_batch": 4, "world_size": 1}


def test_loader_set_epoch():
    plan = plan_batch(4, 1)
    reference = passes(make_loader(Indices(40), plan, rt=rt(), seed=3), 3)
    loader = make_loader(Indices(40), plan, rt=rt(), seed=3)
    loader.set_epoch(2)
    assert [b.tolist() for b in loader] == reference[2]


def test_eval_loader_every_sample_once_over_ranks_in_order():
    plan = plan_batch(4, 3)
    got = []
    for rank in range(3):
        loader = make_loader(Indices(10), plan, train=False, rt=rt(rank, 3))
        batches = [b.tolist() for b in loader]
        flat = [i for b in batches for i in b]
        assert flat == sorted(flat)
        got += flat
    assert sorted(got) == list(range(10))  # no padding, no drop, uneven shards OK


def test_eval_loader_same_every_pass():
    loader = make_loader(Indices(10), plan_batch(3, 1), train=False, rt=rt())
    assert passes(loader, 2) == [[[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]] * 2


def test_a_training_pass_with_accumulation_ends_on_a_whole_optimizer_step():
    """232 samples, global batch 64 in micro-batches of 16 (accumulation 4): 14 micro-batches an epoch, of which the
    last 2 would be half a step; the pass hands out 12 (3 steps), the next pass starts a fresh epoch, and a pass
    resumed after its first step hands out the other 8 of those 12."""
    plan = plan_batch(64, 1, scaling="strong", max_per_device=16)
    assert (plan.per_device_batch, plan.grad_accum_steps) == (16, 4)
    loader = make_loader(Indices(232), plan, rt=rt(), shuffle=False)
    first, second = passes(loader, 2)
    assert len(loader) == len(first) == len(second) == 12 and first == [list(range(16 * i, 16 * i + 16)) for i in range(12)]
    assert loader.epoch == 2 and loader.batches_done == 0
    stopped = make_loader(Indices(232), plan, rt=rt(), shuffle=False)
    taken = list(itertools.islice(iter(stopped), 4))
    resumed = make_loader(Indices(232), plan, rt=rt(), shuffle=False)
    resumed.load_state_dict(stopped.state_dict())
    rest = [b.tolist() for b in resumed]
    assert [b.tolist() for b in taken] + rest == first and len(resumed) == 12


class LoggedIndices(Indices):
    """Indices that note, in a file, every item a loader worker (a process of its own) loaded."""

    def __init__(self, n: int, log) -> None:
        super().__init__(n)
        self.log = log

    def __getitem__(self, i: int) -> int:
        with open(self.log, "a") as f:
            f.write(f"{i}\n")
        return i


def test_a_pass_cut_to_whole_steps_loads_none_of_the_samples_it_leaves_out(tmp_path):
    """The cut is the sampler's, so a loader worker, which fetches ahead, never loads the left-out micro-batches."""
    plan = plan_batch(64, 1, scaling="strong", max_per_device=16)
    loader = make_loader(LoggedIndices(232, tmp_path / "loaded"), plan, rt=rt(), shuffle=False, num_workers=1)
    yielded = [i for batch in loader for i in batch.tolist()]
    assert yielded == list(range(192))
    assert sorted(int(line) for line in (tmp_path / "loaded").read_text().split()) == yielded


def test_a_position_inside_an_accumulation_resumes_at_the_start_of_its_step(warnings_seen):
    """A checkpoint written before epochs ended on whole steps can sit 2 micro-batches into a step of 4: the resumed
    epoch starts at that step's first batch (its 2 batches trained again, and said), so it ends on a whole step."""
    plan = plan_batch(64, 1, scaling="strong", max_per_device=16)
    loader = make_loader(Indices(232), plan, rt=rt(), shuffle=False)
    loader.load_state_dict({"epoch": 1, "batches_done": 6, "per_device_batch": 16, "world_size": 1})
    assert loader.batches_done == 4 and warnings_seen == [
        "resuming epoch 2 after 96 samples, not a whole number of this job's optimizer steps (64 samples over all ranks): "
        "the last 32 are trained again"]
    assert [b.tolist()[0] for b in loader] == [16 * i for i in range(4, 12)]


def test_a_loader_of_fewer_batches_than_one_optimizer_step_is_refused():
    plan = plan_batch(64, 1, scaling="strong", max_per_device=16)  # 4 micro-batches a step
    with pytest.raises(ValueError, match=r"each rank gets 3 batch\(es\) of 16 an epoch, fewer than one optimizer step's 4"):
        make_loader(Indices(60), plan, rt=rt())


def test_an_accumulating_loader_that_keeps_incomplete_batches_hands_out_all():
    """drop_last=False asks for every sample: nothing is left out, whole step or not."""
    plan = plan_batch(8, 1, scaling="strong", max_per_device=4)
    loader = make_loader(Indices(10), plan, rt=rt(), drop_last=False, shuffle=False)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and len(loader) == 3


def test_loader_drop_last_false_keeps_partial_batch():
    loader = make_loader(Indices(10), plan_batch(4, 1), rt=rt(), drop_last=False, shuffle=False)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_loader_plan_for_other_world_size_fails():
    with pytest.raises(ValueError) as info:
        make_loader(Indices(10), plan_batch(4, 2), rt=rt(0, 4))
    msg = str(info.value)
    assert "2 ranks" in msg and "4" in msg and "world_size=4" in msg


def test_loader_empty_dataset_fails():
    with pytest.raises(ValueError, match="empty"):
        make_loader(Indices(0), plan_batch(4, 1), rt=rt())


def test_loader_dataset_without_length_fails():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueError, match="length"):
        make_loader(Stream(), plan_batch(4, 1), rt=rt())


def test_loader_fewer_samples_than_one_batch_fails():
    with pytest.raises(ValueError) as info:
        make_loader(Indices(6), plan_batch(4, 2), rt=rt(0, 2))
    msg = str(info.value)
    assert "3 samples" in msg and "batch of 4" in msg


def test_loader_on_cpu_loads_in_main_process():
    loader = make_loader(Indices(8), plan_batch(4, 1), rt=rt(cores=(0, 1, 2, 3)))
    assert loader.loader.num_workers == 0
    assert loader.loader.pin_memory is False


def test_default_num_workers():
    assert default_num_workers(16, torch.device("cpu")) == 0
    assert default_num_workers(7, torch.device("cuda", 0)) == 6
    assert default_num_workers(1, torch.device("cuda", 0)) == 0
    assert default_num_workers(64, torch.device("cuda", 0)) == 8


def test_batch_plan_global_batch():
    assert BatchPlan(scaling="weak", world_size=4, per_device_batch=8, grad_accum_steps=2).global_batch == 64


def test_resume_with_another_batch_size_keeps_the_sample_position():
    old = make_loader(Indices(64), plan_batch(4, 1), rt=rt())
    it = iter(old)
    for _ in range(6):  # 24 samples into epoch 0
        next(it)
    new = make_loader(Indices(64), plan_batch(8, 1), rt=rt())
    new.load_state_dict(old.state_dict())
    assert new.state_dict() == {"epoch": 0, "batches_done": 3, "per_device_batch": 8, "world_size": 1}
    assert len(list(new)) == 8 - 3


@pytest.mark.parametrize(("before", "after", "batch", "steps"), [(2, 1, 16, 6), (1, 2, 16, 6), (2, 4, 8, 4), (4, 2, 8, 3)])
def test_resume_on_another_number_of_ranks_trains_the_rest_of_the_epoch_once(before, after, batch, steps):
    """A checkpoint `steps` global batches (of `batch` samples) into an epoch of 256 samples, written by `before` ranks and
    resumed by `after` (strong scaling: the same global batch): the samples trained after the resume are exactly the
    epoch's samples not trained before it, none twice, none left out; the next epoch is whole again."""
    def loaders(world):
        return [make_loader(Indices(256), plan_batch(batch, world, scaling="strong"), rt=rt(r, world), seed=5) for r in range(world)]

    first = loaders(before)
    iters = [iter(loader) for loader in first]
    trained = [i for _ in range(steps) for it in iters for i in next(it).tolist()]
    assert len(trained) == steps * batch
    resumed = loaders(after)
    for loader in resumed:
        loader.load_state_dict(first[0].state_dict())
    rest = [[i for b in loader for i in b.tolist()] for loader in resumed]
    assert sorted(trained + [i for shard in rest for i in shard]) == list(range(256))
    assert len({len(shard) for shard in rest}) == 1  # every rank the same number of batches: no rank waits at the end
    assert sorted(i for loader in resumed for b in loader for i in b.tolist()) == list(range(256))  # the next epoch: whole


def test_resume_between_batches_of_this_job_retrains_the_batch_that_holds_the_position_and_says_so(warnings_seen):
    """3 global batches of 8 on 2 ranks (24 samples) resumed on 4 ranks with batches of 16 over all: the position lies in
    this job's second batch, which is trained whole: 8 samples twice, none skipped, and a warning says so."""
    first = [make_loader(Indices(64), plan_batch(8, 2, scaling="strong"), rt=rt(r, 2), seed=5) for r in range(2)]
    iters = [iter(loader) for loader in first]
    trained = [i for _ in range(3) for it in iters for i in next(it).tolist()]
    resumed = [make_loader(Indices(64), plan_batch(16, 4, scaling="strong"), rt=rt(r, 4), seed=5) for r in range(4)]
    for loader in resumed:
        loader.load_state_dict(first[0].state_dict())
    rest = [i for loader in resumed for b in loader for i in b.tolist()]
    assert len(rest) == 64 - 16 and set(trained + rest) == set(range(64))
    assert len(set(trained) & set(rest)) == 8
    assert warnings_seen == ["resuming epoch 1 after 24 samples, not a whole number of this job's optimizer steps (16 "
                             "samples over all ranks): the last 8 are trained again"]  # rank 0's, not one per rank


def test_resume_with_accumulation_starts_at_an_optimizer_steps_first_micro_batch():
    """Weak scaling, 4 samples per device in 2 micro-batches of 2: 3 steps on 2 ranks (24 samples) resumed on 4 ranks
    (16 samples a step) start at the second step's first micro-batch, not in the middle of a step (micro-batch 3 of 4,
    which would leave an accumulation half done at the epoch's end)."""
    first = make_loader(Indices(64), plan_batch(4, 2, scaling="weak", max_per_device=2), rt=rt(0, 2), seed=5)
    it = iter(first)
    for _ in range(3 * 2):
        next(it)
    resumed = make_loader(Indices(64), plan_batch(4, 4, scaling="weak", max_per_device=2), rt=rt(0, 4), seed=5)
    resumed.load_state_dict(first.state_dict())
    assert resumed.plan.grad_accum_steps == 2 and resumed.state_dict()["batches_done"] == 2


# --------------------------------------------------------------------------------------------------
# even evaluation shards (FSDP, ZeRO-3)


def test_even_eval_shards_have_equal_batches_and_masks_mark_each_sample_once():
    plan = plan_batch(2, 3)
    seen, batch_counts = [], []
    for rank in range(3):
        loader = make_loader(Indices(10), plan, train=False, even=True, rt=rt(rank=rank, world=3))
        passes_ = list(loader.masked())
        batch_counts.append(len(passes_))
        for batch, mask in passes_:
            assert mask.dtype == torch.bool and len(mask) == len(batch)
            seen += batch[mask].tolist()
    assert batch_counts == [2, 2, 2]  # 4, 3 and 3 samples padded to 4 each
    assert sorted(seen) == list(range(10)), "every sample counted once, padding never"


def test_even_eval_loader_refuses_plain_iteration():
    loader = make_loader(Indices(5), plan_batch(2, 2), train=False, even=True, rt=rt(rank=1, world=2))
    with pytest.raises(ValueError, match=r"loader.masked\(\)"):
        list(loader)


def test_even_is_for_evaluation_loaders_only():
    with pytest.raises(ValueError, match="even=True is for evaluation loaders"):
        make_loader(Indices(8), plan_batch(2, 1), train=True, even=True, rt=rt())


def test_masked_on_training_loader_is_all_true():
    loader = make_loader(Indices(8), plan_batch(4, 1), rt=rt())
    assert all(bool(mask.all()) for _, mask in loader.masked())


def test_even_sampler_on_more_ranks_than_samples_pads_with_real_indices():
    shards = [list(EvalShardSampler(range(2), 3, r, even=True)) for r in range(3)]
    assert shards == [[0], [1], [0]]
    assert [EvalShardSampler(range(2), 3, r, even=True).num_real for r in range(3)] == [1, 1, 0]


# --------------------------------------------------------------------------------------------------
# Random transforms in the dataset: seeded per sample, so a resumed run augments exactly alike


class Augmented(Dataset):
    """Item i is (i, a torch draw, a Python draw, a NumPy draw): what random crops and flips consume."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float, float, float]:
        return i, torch.rand(()).item(), random.random(), float(np.random.rand())


class BatchedAugmented(Augmented):
    """A dataset with a batched fetch, as Hugging Face datasets have: one draw for the whole batch."""

    def __getitems__(self, indices: list[int]) -> list[tuple[int, float, float, float]]:
        shift = torch.rand(()).item()
        return [(i, shift, 0.0, 0.0) for i in indices]


def samples(loader, epochs=1):
    """{(epoch, index): the sample's draws} over whole passes."""
    seen = {}
    for epoch in range(epochs):
        for batch in loader:
            for i, *draws in zip(*(part.tolist() for part in batch), strict=True):
                seen[(epoch, i)] = tuple(draws)
    return seen


def interrupted_then_resumed(dataset, workers, k, **options):
    """Batches of 2 epochs, the run checkpointing the loader after k batches of epoch 1 and resuming in a new loader."""
    plan = plan_batch(4, 1)
    first = make_loader(dataset, plan, rt=rt(), seed=3, num_workers=workers, **options)
    taken = [b for b in first]
    taken += list(itertools.islice(first, k))
    state = first.state_dict()
    del first  # the interrupted run ends, its workers with it
    resumed = make_loader(dataset, plan, rt=rt(), seed=3, num_workers=workers, **options)
    resumed.load_state_dict(state)
    return [[part.tolist() for part in b] for b in taken + list(resumed)]


@pytest.mark.parametrize("dataset", [Augmented(24), BatchedAugmented(24)], ids=["per-sample", "batched"])
def test_random_transforms_in_loader_workers_resume_exactly(dataset):
    plan = plan_batch(4, 1)
    straight = make_loader(dataset, plan, rt=rt(), seed=3, num_workers=2)
    reference = [[part.tolist() for part in b] for _ in range(2) for b in straight]
    assert interrupted_then_resumed(dataset, 2, k=3) == reference


def test_without_seeded_samples_loader_workers_do_not_resume_exactly():
    """Why the seeding exists: the workers' own generators restart, and with them the augmentations."""
    plan = plan_batch(4, 1)
    straight = make_loader(Augmented(24), plan, rt=rt(), seed=3, num_workers=2, seed_samples=False)
    reference = [[part.tolist() for part in b] for _ in range(2) for b in straight]
    resumed = interrupted_then_resumed(Augmented(24), 2, k=3, seed_samples=False)
    assert [b[0] for b in resumed] == [b[0] for b in reference]  # the same samples ...
    assert resumed != reference  # ... transformed differently


def test_a_samples_transform_depends_on_seed_epoch_and_index_only():
    def over(world, workers, seed=3):
        seen = {}
        for rank in range(world):
            loader = make_loader(Augmented(24), plan_batch(4, world), rt=rt(rank, world), seed=seed, num_workers=workers,
                                 seed_samples=True)
            seen.update(samples(loader, epochs=2))
        return seen

    one = over(1, 0)
    assert len(one) == 48 and len({draws for draws in one.values()}) == 48  # every (epoch, sample) its own draws
    assert over(1, 1) == over(1, 2) == over(2, 2) == one
    assert over(1, 0, seed=4) != one


def test_seeding_samples_in_the_main_process_leaves_the_training_generators_alone():
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    expected = (torch.rand(3).tolist(), random.random(), float(np.random.rand()))
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    loader = make_loader(Augmented(24), plan_batch(4, 1), rt=rt(), seed=3, num_workers=0, seed_samples=True)
    samples(loader)
    assert (torch.rand(3).tolist(), random.random(), float(np.random.rand())) == expected


def test_seeded_samples_are_for_training_loaders():
    with pytest.raises(ValueError, match="seed_samples=True is for training loaders"):
        make_loader(Augmented(8), plan_batch(4, 1), train=False, rt=rt(), seed_samples=True)


def test_sample_seeds_differ_for_neighbours_and_fit_63_bits():
    seeds = {sample_seed(seed, epoch, index) for seed in range(3) for epoch in range(3) for index in range(100)}
    assert len(seeds) == 900
    assert all(0 <= s < 2**63 for s in seeds)
    assert sample_seed(1, 2, 3) == sample_seed(1, 2, 3)


# --------------------------------------------------------------------------------------------------
# Batches arrive on the rank's device (the meta device stands in for a GPU: tensors really move there)


class Reviews(Dataset):
    """Samples as a tokenised text dataset gives them: a dict of tensors, a label and the text."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return {"input_ids": torch.full((4,), index), "label": index % 2, "text": f"review {index}"}


def test_batches_arrive_on_the_ranks_device_with_their_structure():
    gpu = SimpleNamespace(world_size=1, rank=0, cores=(0,), device=torch.device("meta"))
    batches = list(make_loader(Reviews(), plan_batch(4, 1), rt=gpu, num_workers=0, pin_memory=False))
    assert len(batches) == 2
    for batch in batches:
        assert set(batch) == {"input_ids", "label", "text"}
        assert batch["input_ids"].device.type == "meta" and batch["input_ids"].shape == (4, 4)
        assert batch["label"].device.type == "meta"
        assert len(batch["text"]) == 4 and all(text.startswith("review ") for text in batch["text"])  # strings stay
    kept = next(iter(make_loader(Reviews(), plan_batch(4, 1), rt=gpu, num_workers=0, pin_memory=False, to_device=False)))
    assert kept["input_ids"].device.type == "cpu"
    on_cpu = next(iter(make_loader(Reviews(), plan_batch(4, 1), rt=rt(), num_workers=0)))
    assert on_cpu["input_ids"].device.type == "cpu"


def test_to_device_keeps_each_container_type_and_lets_an_object_move_itself():
    from collections import namedtuple

    from gpuscale.base.batches import to_device

    Pair = namedtuple("Pair", "x y")

    class Encoding:  # like transformers' BatchEncoding: moves itself with .to(device)
        def __init__(self, ids):
            self.ids = ids

        def to(self, device):
            return Encoding(self.ids.to(device))

    meta = torch.device("meta")
    moved = to_device([Pair(torch.ones(2), (torch.zeros(1), "a", 3)), {"e": Encoding(torch.ones(3))}], meta)
    assert isinstance(moved, list) and isinstance(moved[0], Pair) and isinstance(moved[0].y, tuple)
    assert moved[0].x.device == meta and moved[0].y[0].device == meta and moved[0].y[1:] == ("a", 3)
    assert isinstance(moved[1]["e"], Encoding) and moved[1]["e"].ids.device == meta
