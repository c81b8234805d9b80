"""The sync probe's schedule and the split of a step from every rank's reports, by hand."""

import pytest
from torch import nn

from gpuscale.measure import syncprobe
from gpuscale.measure.stepsplit import split_step, time_split
from gpuscale.strategy import get_strategy


def test_probes_come_early_then_rarely():
    probed = [s for s in range(400) if syncprobe.is_probe_step(s)]
    assert probed[:13] == [5, 13, 21, 29, 37, 45, 53, 61, 69, 77, 85, 93, 193]
    assert probed[13:] == [293, 393]


def _probe(step, fwd, bwd, synced, micro=1):
    return {"step": step, "forward_s": fwd, "backward_s": bwd, "synced_backward_s": synced, "micro_batches": micro}


def test_exposed_communication_is_the_smallest_wait_and_imbalance_the_spread():
    # rank 1 loads 8 ms longer per step; both compute 10 ms (4 forward + 6 backward); communication exposes 3 ms
    ranks = [
        {"rank": 0, "data_wait_s": 0.1, "probes": [_probe(s, 0.004, 0.006, 0.006 + 0.003 + 0.008) for s in (5, 13, 21)]},
        {"rank": 1, "data_wait_s": 0.9, "probes": [_probe(s, 0.004, 0.006, 0.006 + 0.003) for s in (5, 13, 21)]},
    ]
    split = split_step(0.025, 100, ranks)
    assert split["status"] == "measured" and split["probes"] == 2  # the first of three dropped
    assert split["reference_rank"] == 0  # it waited longest: the fastest rank
    shown = {k: split["per_step_s"][k] for k in ("step", "data_wait", "compute", "exposed_comm", "imbalance", "other")}
    assert shown == pytest.approx({"step": 0.025, "data_wait": 0.001, "compute": 0.010,
                                   "exposed_comm": 0.003, "imbalance": 0.008, "other": 0.003})
    assert [r["data_wait_s"] for r in split["ranks"]] == pytest.approx([0.001, 0.009])
    # rank 1 is slower on every step: all of the imbalance is persistent, and rank 1 is named
    assert split["per_step_s"]["persistent_imbalance"] == pytest.approx(0.008) and split["per_step_s"]["jitter"] == pytest.approx(0.0)
    assert split["slow_rank"] == 1


def test_waiting_that_changes_rank_is_jitter_not_a_slow_rank():
    """Rank 0 waits 4 ms on even steps, rank 1 on odd ones (a jitter of 4 ms per step); exposed communication 2 ms.
    DDP's timers on every step: the mean over the steps after the warm-up (iterations 1-10 left out)."""
    def wait(rank, step):
        return 0.002 + (0.004 if step % 2 == rank else 0.0)
    ranks = [{"rank": r, "data_wait_s": 0.0,
              "probes": [_probe(s, 0.004, 0.006, 0.006 + (0.050 if s <= 10 else wait(r, s))) for s in range(1, 41)]}
             for r in (0, 1)]
    split = split_step(0.02, 40, ranks, average="mean", warmup=10)
    assert split["probes"] == 30 and split["of_steps"] == 40  # the 30 steps after the warm-up, of 40
    per_step = split["per_step_s"]
    assert per_step["exposed_comm"] == pytest.approx(0.002)
    assert per_step["imbalance"] == pytest.approx(0.004) and per_step["jitter"] == pytest.approx(0.004)
    assert per_step["persistent_imbalance"] == pytest.approx(0.0, abs=1e-12) and split["slow_rank"] is None
    # rank 1 lagging 1 ms more on every step (it waits 1 ms less): 1 ms persistent, rank 1 named, the rest jitter
    for probe in ranks[1]["probes"]:
        probe["synced_backward_s"] -= 0.001 if probe["step"] > 10 else 0.0
    lagged = split_step(0.02, 40, ranks, average="mean", warmup=10)
    assert lagged["slow_rank"] == 1 and lagged["per_step_s"]["persistent_imbalance"] == pytest.approx(0.001)
    assert lagged["per_step_s"]["jitter"] == pytest.approx(0.003)  # spreads of 5 and 3 ms: 4 ms on average
    assert lagged["per_step_s"]["imbalance"] == pytest.approx(lagged["per_step_s"]["persistent_imbalance"] + lagged["per_step_s"]["jitter"])


def test_too_few_steps_after_the_warm_up_keep_them():
    ranks = [{"rank": 0, "data_wait_s": 0.0, "probes": [_probe(s, 0.004, 0.006, 0.007) for s in range(1, 15)]}]
    assert split_step(0.02, 14, ranks, average="mean", warmup=10)["probes"] == 13  # 4 after it: all but the first


def test_accumulation_multiplies_compute_and_one_rank_has_nothing_to_wait_for():
    ranks = [{"rank": 0, "data_wait_s": 0.0, "probes": [_probe(5, 0.01, 0.02, 0.021, micro=4)]}]
    split = split_step(0.2, 10, ranks)
    assert split["per_step_s"]["compute"] == pytest.approx(0.12)
    assert split["per_step_s"]["exposed_comm"] == 0.0 and split["per_step_s"]["imbalance"] == 0.0


def test_probes_only_count_when_every_rank_took_them():
    ranks = [{"rank": 0, "data_wait_s": 0.0, "probes": [_probe(5, 0.01, 0.01, 0.012)]},
             {"rank": 1, "data_wait_s": 0.0, "probes": [_probe(13, 0.01, 0.01, 0.012)]}]
    split = split_step(0.05, 20, ranks, unsupported=None)
    assert split["status"] == "not measured" and "fewer optimizer steps" in split["why"]
    assert split["per_step_s"]["data_wait"] == 0.0 and split["per_step_s"]["compute"] is None


def test_unmeasured_strategies_say_why_and_the_time_split_keeps_compute_whole():
    split = split_step(0.05, 20, [{"rank": 0, "data_wait_s": 0.2, "probes": []}], unsupported="fsdp: cannot")
    assert split["why"] == "fsdp: cannot"
    phases = time_split(2.0, 1.0, 20, split, eval_s=0.5, checkpoint_s=0.1, probe_s=0.0)
    assert phases == pytest.approx({"startup": 2.0, "data_wait": 0.2, "compute": 0.8, "exposed_comm": None, "imbalance": None,
                                    "eval": 0.5, "checkpoint": 0.1, "probe": 0.0, "after_training": None})


def test_the_phases_add_up_to_the_time_to_result_with_what_came_after_training():
    """A probe-measured script trained 1 s after 2 s of startup, evaluated 0.5 s, and its last rank wrote its record
    4.3 s after the launch: 0.8 s after training (its own saving and end), by hand 4.3 - 2 - 1 - 0.5."""
    split = split_step(0.05, 20, [{"rank": 0, "data_wait_s": 0.2, "probes": []}], unsupported="not timed")
    phases = time_split(2.0, 1.0, 20, split, eval_s=0.5, checkpoint_s=None, probe_s=0.0, whole_s=4.3)
    assert phases["after_training"] == pytest.approx(0.8)
    assert sum(v or 0.0 for v in phases.values()) == pytest.approx(4.3)
    # a time to result shorter than the phases (clocks of two hosts): nothing after training, never a negative phase
    assert time_split(2.0, 1.0, 20, split, eval_s=0.5, checkpoint_s=None, probe_s=0.0, whole_s=3.0)["after_training"] == 0.0


def test_measured_time_split_charges_communication_and_imbalance_per_step():
    ranks = [{"rank": r, "data_wait_s": 0.1, "probes": [_probe(5, 0.004, 0.006, 0.006 + 0.002 + 0.001 * r)]} for r in range(2)]
    split = split_step(0.02, 50, ranks)
    phases = time_split(1.0, 1.0, 50, split, eval_s=0.0, checkpoint_s=0.0, probe_s=0.05)
    assert phases["exposed_comm"] == pytest.approx(0.1) and phases["imbalance"] == pytest.approx(0.05)
    assert phases["data_wait"] == pytest.approx(0.1) and phases["compute"] == pytest.approx(0.75)


def test_strategies_the_probe_cannot_measure_are_named():
    class Sharded(nn.Linear):  # what FSDP2's fully_shard makes of a module: its sync switch
        def set_requires_gradient_sync(self, flag):
            pass

    assert get_strategy("ddp").sync_probe_blocker(nn.Linear(2, 2)) is None
    assert get_strategy("deepspeed").sync_probe_blocker(nn.Linear(2, 2)).startswith("deepspeed:")
    assert get_strategy("fsdp").sync_probe_blocker(Sharded(2, 2)).startswith("fsdp:")
    assert get_strategy("fsdp").sync_probe_blocker(nn.Linear(2, 2)) is None, "one process: FSDP leaves it unsharded"
    assert syncprobe.unsupported_reason(nn.Linear(2, 2)) is None
    compiled = nn.Linear(2, 2)
    compiled.compile(backend="eager")
    assert syncprobe.unsupported_reason(compiled).startswith("compiled model")


def test_the_backward_the_all_reduce_slowed_is_communication_even_on_the_slow_rank():
    """DDP's timers on two ranks, as a busy rank 1 makes them: rank 1 does 10 ms of host work before each backward
    (host_s) and its backward, with rank 0's all-reduce ready beside it, takes 11 ms; rank 0's takes 7 ms, as it does
    alone (its all-reduce waits for rank 1). Rank 0 waits 10 + 4 ms longer than rank 1 (2 ms exposed): 10 ms is rank
    1's extra work (imbalance), 4 ms its backward slowed by the all-reduce beside it (communication)."""
    def probe(step, rank):
        host, backward = (0.010, 0.011) if rank == 1 else (0.0, 0.007)
        wait = 0.002 + (0.014 if rank == 0 else 0.0)
        return {"step": step, "forward_s": 0.004, "backward_s": backward, "host_s": host, "synced_backward_s": backward + wait}
    ranks = [{"rank": r, "data_wait_s": 0.0, "probes": [probe(s, r) for s in range(11, 41)]} for r in (0, 1)]
    split = split_step(0.04, 40, ranks, average="mean", warmup=10, slowed_backward=True)
    per_step = split["per_step_s"]
    assert split["slow_rank"] == 1 and split["reference_rank"] == 0
    assert per_step["persistent_imbalance"] == pytest.approx(0.010) and per_step["imbalance"] == pytest.approx(0.010)
    assert per_step["comm_slowdown"] == pytest.approx(0.004) and per_step["exposed_comm"] == pytest.approx(0.006)
    assert per_step["compute"] == pytest.approx(0.004 + 0.007)  # rank 0's forward and backward, alone
    without = split_step(0.04, 40, ranks, average="mean", warmup=10)  # the same timers read as a replay's
    assert without["per_step_s"]["imbalance"] == pytest.approx(0.014) and without["per_step_s"]["comm_slowdown"] is None
