"""The probe's merge: rank records written by hand, every figure of the summary computed by hand."""

from __future__ import annotations

import json

import pytest

from gpuscale.measure.probe import SITE_DIR, collect, describe, probe_enabled, probe_environ
from gpuscale.measure.probe.merge import merge_records, rank_account
from gpuscale.measure.probe.recorder import ddp_sample
from gpuscale.study import runner
from gpuscale.study.matrix import Cell

T0 = 1_000_000.0  # launch


def _pass(first, last, batches, samples, wait, steps, size=16):
    return {"first_at": T0 + first, "last_at": T0 + last, "ended": True, "batches": batches, "samples": samples,
            "unknown_batch": None, "wait_s": wait, "steps": steps, "batch_sizes": {str(size): batches}}


def _record(rank, *, passes, steps=20, first_step=3.0, warm=5.0, last_step=12.0, ended="exit", **extra):
    record = {
        "version": 1, "rank": rank, "host": "h0", "pid": 100 + rank, "env": {"WORLD_SIZE": "2"},
        "launched_at": T0, "loaded_at": T0 + 0.5, "written_at": T0 + 14.0, "ended": ended, "error": None, "signal": None,
        "launcher": "torchrun", "world": {"world_size": 2, "rank": rank, "backend": "gloo"}, "device": "cpu",
        "device_name": None, "meter": False,
        "optimizers": [{"name": "SGD", "steps": steps, "first_step_at": T0 + first_step, "warm_at": T0 + warm,
                        "last_step_at": T0 + last_step, "gradient_bytes": 4000},
                       {"name": "Adam", "steps": 5, "first_step_at": T0 + 4, "warm_at": None, "last_step_at": T0 + 6,
                        "gradient_bytes": 10}],
        "passes": passes, "warmup_steps": 10, "peak_memory_bytes": 1000 + rank, "series": None, "torch_version": "x",
    }
    record.update(extra)
    return record


def _two_epochs_with_eval(wait=0.5):
    # epoch 1: 2.0 .. 6.0, eval 6.0 .. 7.0 (no step), epoch 2: 7.0 .. 12.0; 40 batches of 16 in all
    return [_pass(2.0, 6.0, 20, 320, wait, 10), _pass(6.0, 7.0, 8, 128, 0.2, 0), _pass(7.0, 12.0, 20, 320, wait, 10)]


def test_one_rank_account_by_hand():
    account = rank_account(_record(0, passes=_two_epochs_with_eval()))
    assert account["steps"] == 20  # the optimizer that stepped most; the second one does not add
    assert account["samples"] == 640 and account["batches"] == 40 and account["epochs"] == 2
    assert account["start"] == T0 + 2.0 and account["end"] == T0 + 12.0
    assert account["eval_s"] == pytest.approx(1.0)
    assert account["train_s"] == pytest.approx(9.0)  # 10 s window less 1 s of evaluation
    assert account["data_wait_s"] == pytest.approx(1.0)  # the evaluation pass's wait is not training's
    # steady: from the 10th step (5.0) to the last (12.0), less the evaluation inside (6..7), over 10 steps
    assert account["steady_step_s"] == pytest.approx(6.0 / 10)
    assert account["batch_size"] == 16


def test_two_ranks_merge_like_meter():
    slow = _two_epochs_with_eval()
    slow[2] = _pass(7.0, 13.0, 20, 320, 0.5, 10)
    records = [_record(0, passes=_two_epochs_with_eval()), _record(1, passes=slow, last_step=13.0)]
    summary, timeline = merge_records(records, world_size=2, scaling="strong")
    assert summary["measured_by"] == "probe" and summary["complete"] is True and summary["probe"]["why"] is None
    assert summary["world_size"] == 2 and summary["backend"] == "gloo" and summary["scaling"] == "strong"
    assert summary["samples"] == 1280 and summary["steps"] == 20
    assert summary["samples_per_s"] == pytest.approx(1280 / 10.0)  # the slower rank's training time: 11 s - 1 s eval
    assert summary["step_time_s"] == pytest.approx(10.0 / 20)
    assert summary["per_device_batch"] == 16 and summary["grad_accum_steps"] == 2 and summary["global_batch"] == 64
    split = summary["time_split_s"]
    assert split["startup"] == pytest.approx(2.0) and split["eval"] == pytest.approx(1.0)
    assert split["data_wait"] == pytest.approx(1.0)  # both ranks waited 1 s over the 20 steps
    assert split["compute"] == pytest.approx(10.0 - 1.0)
    assert split["exposed_comm"] is None and split["imbalance"] is None and split["checkpoint"] is None
    assert summary["time_to_result_s"] == pytest.approx(14.0)
    assert split["after_training"] == pytest.approx(14.0 - 2.0 - 1.0 - 10.0)  # the last record came 1 s after training
    assert sum(v or 0.0 for v in split.values()) == pytest.approx(summary["time_to_result_s"])
    assert summary["gradient_bytes"] == 4000 and summary["peak_memory_bytes"] == 1001
    assert summary["sync_probe"]["status"] == "not measured" and "no DDP model" in summary["sync_probe"]["why"]
    assert any("exposed communication" in text for text in summary["probe"]["not_measured"])
    assert timeline is None and summary["utilisation"] is None
    assert runner.summary_problem(summary) is None  # the study reads it like a Meter's


def test_a_ddp_timer_sample_by_hand():
    ns = 1_000_000_000
    data = {"iteration": 7, "forward_compute_time": 4_000_000, "backward_compute_time": 9_000_000,
            "backward_compute_time_start": 100 * ns, "backward_compute_time_end": 100 * ns + 9_000_000,
            "backward_comm_time_start": 100 * ns + 2_000_000, "backward_comm_time_end": 100 * ns + 21_000_000,
            "backward_comm_time": 19_000_000, "backward_compute_comm_overlap_time": 7_000_000}
    sample = ddp_sample(data)
    assert sample["iteration"] == 7 and sample["forward_s"] == pytest.approx(0.004) and sample["backward_s"] == pytest.approx(0.009)
    assert sample["sync_wait_s"] == pytest.approx(0.012)  # the all-reduce ended 12 ms after the last gradient was ready
    assert ddp_sample({"iteration": 0}) is None and ddp_sample({}) is None  # before DDP's first timed iteration


def _ddp(waits, forward=0.004, backward=0.009):
    """DDP timer samples of iterations 1..len(waits), each with the sync wait given."""
    return {"parameters": 1000, "samples": [{"iteration": i, "forward_s": forward, "backward_s": backward, "sync_wait_s": w,
                                             "comm_start_ns": i} for i, w in enumerate(waits, 1)]}


def test_ddp_timers_split_the_step_like_the_sync_probe():
    # rank 1 is 30 ms slower every step: rank 0 waits 31 ms in the all-reduce, rank 1 only the exposed 1 ms
    # (iteration 1 is warm-up and dropped: its waits are off on purpose)
    records = [_record(0, passes=_two_epochs_with_eval(), ddp=_ddp([0.5] + [0.031] * 9)),
               _record(1, passes=_two_epochs_with_eval(), ddp=_ddp([0.0] + [0.001] * 9, forward=0.005))]
    summary, _ = merge_records(records, world_size=2, scaling="weak")
    probe = summary["sync_probe"]
    assert probe["status"] == "measured" and probe["source"] == "ddp_timers" and probe["probes"] == 9
    assert probe["reference_rank"] == 0  # the rank that waited longest, i.e. the fastest
    part = summary["step_breakdown_s"]
    assert part["exposed_comm"] == pytest.approx(0.001) and part["imbalance"] == pytest.approx(0.030)
    assert part["compute"] == pytest.approx(2 * (0.004 + 0.009))  # rank 0's forward + backward, 2 batches per step
    assert part["step"] == pytest.approx(9.0 / 20) and part["data_wait"] == pytest.approx(1.0 / 20)
    assert part["other"] == pytest.approx(9.0 / 20 - 0.05 - 0.026 - 0.001 - 0.030)
    split = summary["time_split_s"]
    assert split["exposed_comm"] == pytest.approx(20 * 0.001) and split["imbalance"] == pytest.approx(20 * 0.030)
    assert not any("exposed communication" in text for text in summary["probe"]["not_measured"])
    # ranks whose timed iterations do not meet cannot be compared
    records[1]["ddp"]["samples"] = [dict(d, iteration=d["iteration"] + 1000) for d in records[1]["ddp"]["samples"]]
    none_common, _ = merge_records(records, world_size=2)
    assert none_common["sync_probe"]["status"] == "not measured"
    assert none_common["sync_probe"]["why"] == "the ranks' DDP timers have no timed iteration in common"


def test_incomplete_runs_say_which_rank_did_what():
    good = _record(0, passes=_two_epochs_with_eval())
    summary, _ = merge_records([good], world_size=2)
    assert summary["complete"] is False and "rank 1 left no record" in summary["probe"]["why"]
    raised = _record(1, passes=_two_epochs_with_eval(), ended="exception", error="ValueError: bad batch")
    killed = _record(1, passes=_two_epochs_with_eval(), ended="signal", signal="SIGTERM")
    lost = _record(1, passes=_two_epochs_with_eval(), ended=None)
    assert "rank 1 raised ValueError: bad batch" in merge_records([good, raised])[0]["probe"]["why"]
    assert "rank 1 was ended by SIGTERM" in merge_records([good, killed])[0]["probe"]["why"]
    assert "last periodic record" in merge_records([good, lost])[0]["probe"]["why"]
    failed, _ = merge_records([good, _record(1, passes=_two_epochs_with_eval())], failure="the run failed")
    assert failed["complete"] is False and failed["probe"]["why"].startswith("the run failed")


def test_uncountable_batches_and_no_steps_leave_no_throughput():
    passes = _two_epochs_with_eval()
    passes[0] |= {"samples": None, "unknown_batch": "MyBatch"}
    summary, _ = merge_records([_record(0, passes=passes)], world_size=1)
    assert summary["samples_per_s"] is None and "type MyBatch" in summary["probe"]["why"]
    assert runner.summary_problem(summary) is not None  # not a finished cell
    idle, _ = merge_records([_record(0, passes=[_pass(1.0, 2.0, 4, 64, 0.1, 0)], optimizers=[])], world_size=1)
    assert idle["complete"] is False and "no optimizer step" in idle["probe"]["why"]


def test_utilisation_is_counted_from_the_training_start():
    series = {"rank": 0, "host": "h0", "device": "cpu", "name": "cores 0", "source": "proc",
              "t": [T0 + 1.0, T0 + 3.0, T0 + 5.0], "util_pct": [10.0, 90.0, 70.0], "mem_bytes": [5, 9, 7], "power_w": [None] * 3}
    summary, timeline = merge_records([_record(0, passes=_two_epochs_with_eval(), series=series)], world_size=1)
    device = summary["utilisation"]["devices"][0]
    assert device["util_mean"] == pytest.approx(80.0)  # the sample before training (t = -1) is not in the mean
    assert device["mem_peak_bytes"] == 9
    assert timeline["series"][0]["t"] == [-1.0, 1.0, 3.0]


def test_collect_writes_the_summary_and_leaves_meter_scripts_alone(tmp_path):
    records, out = tmp_path / "probe", tmp_path / "out"
    records.mkdir()
    for rank in (0, 1):
        (records / f"rank-{rank}.json").write_text(json.dumps(_record(rank, passes=_two_epochs_with_eval())))
    (records / "rank-7.json").write_text("{broken")
    summary = collect(records, out, world_size=2, scaling="weak")
    assert json.loads((out / "summary.json").read_text()) == summary
    assert runner.read_summary(out, Cell("weak", 1, 2)) == summary
    assert "2 ranks (gloo), 20 optimizer steps, 1280 samples" in describe(summary)
    (records / "rank-1.json").write_text(json.dumps(_record(1, passes=[], meter=True)))
    assert collect(records, tmp_path / "other") is None and not (tmp_path / "other").exists()
    assert collect(tmp_path / "empty", None) is None


def test_an_incomplete_summary_is_not_a_finished_cell(tmp_path):
    summary, _ = merge_records([_record(0, passes=_two_epochs_with_eval())], world_size=2, scaling="weak")
    (tmp_path / "summary.json").write_text(json.dumps(summary))  # by hand: collect never names it so
    assert runner.read_summary(tmp_path, Cell("weak", 1, 2)) is None


def test_an_incomplete_merge_is_kept_beside_and_never_as_summary_json(tmp_path):
    records, out = tmp_path / "probe", tmp_path / "run"
    records.mkdir()
    (records / "rank-0.json").write_text(json.dumps(_record(0, passes=_two_epochs_with_eval())))
    (records / "rank-1.json").write_text(json.dumps(_record(1, passes=_two_epochs_with_eval())))
    assert collect(records, out, world_size=2)["complete"] and (out / "summary.json").is_file()
    (records / "rank-1.json").unlink()  # the same folder, run again, and rank 1 is lost this time
    again = collect(records, out, world_size=2)
    assert again["complete"] is False and "rank 1 left no record" in again["probe"]["why"]
    assert not (out / "summary.json").exists()  # the earlier, complete summary is not left to pass for this run's
    assert json.loads((out / "summary-incomplete.json").read_text()) == again


def test_probe_environment(monkeypatch):
    env = probe_environ("/r", {"PYTHONPATH": f"/a:{SITE_DIR}:/b"})
    assert env == {"PYTHONPATH": f"{SITE_DIR}:/a:/b", "GPUSCALE_PROBE_DIR": "/r"}
    assert probe_enabled({}) and not probe_enabled({"GPUSCALE_PROBE": "0"})
    with pytest.raises(ValueError, match="GPUSCALE_PROBE=0"):
        probe_enabled({"GPUSCALE_PROBE": "off"})


def test_a_script_without_a_dataloader_is_counted_from_its_models_inputs_or_the_studys_batch():
    """nanoGPT-style batches: no DataLoader pass. The DDP model's training forwards count the samples (each rank's
    own: 40 forwards of 12 on rank 0, of 12 on rank 1); training starts at the first forward."""
    inputs = {"calls": 40, "samples": 480, "unknown_batch": None, "first_at": T0 + 2.0, "batch_sizes": {"12": 40}}
    records = [_record(rank, passes=[], inputs=inputs) for rank in (0, 1)]
    summary, _ = merge_records(records, world_size=2, scaling="weak")
    assert summary["complete"] and summary["samples"] == 960 and summary["samples_from"] == "model inputs"
    assert summary["train_time_s"] == pytest.approx(10.0)  # first forward at 2.0 to the last step at 12.0
    assert summary["samples_per_s"] == pytest.approx(96.0)
    assert summary["per_device_batch"] == 12 and summary["grad_accum_steps"] == 2 and summary["global_batch"] == 48
    assert any(text.startswith("data wait") for text in summary["probe"]["not_measured"])
    assert "counted from: model inputs" in describe(summary)

    # neither a DataLoader nor a DDP model: the study's batch per step (its --global-batch carried into the script)
    bare = [_record(rank, passes=[]) for rank in (0, 1)]
    told, _ = merge_records(bare, world_size=2, scaling="weak", step_samples=64)
    assert told["complete"] and told["samples"] == 20 * 64 and told["samples_from"] == "study batch"
    assert told["global_batch"] == 64
    # and without it, no samples: the run says what this kind of script is missing, not "0 samples"
    lost, _ = merge_records(bare, world_size=2, scaling="weak")
    assert lost["complete"] is False and lost["samples"] is None
    assert "no DistributedDataParallel model" in lost["probe"]["why"] and "--global-batch" in lost["probe"]["why"]
    assert runner.summary_problem(lost) is not None


def test_model_inputs_count_training_forwards_only():
    import torch

    from gpuscale.measure.probe.model_inputs import ModelInputs

    model, counted = torch.nn.Linear(4, 2), ModelInputs()
    counted.watch(model)
    model(torch.zeros(8, 4))
    model(input=torch.zeros(3, 4))
    with torch.no_grad():
        model(torch.zeros(5, 4))  # evaluation under no_grad
    model.eval()
    model(torch.zeros(7, 4))  # evaluation mode
    model.train()
    other = torch.nn.Linear(4, 2)
    counted.watch(other)  # a larger model made later: only its forwards count from now on
    model(torch.zeros(9, 4))
    other(torch.zeros(2, 4))
    assert counted.as_dict() | {"first_at": None} == {"calls": 3, "samples": 13, "unknown_batch": None, "first_at": None,
                                                      "after_last_step": 0, "batch_sizes": {"2": 1, "3": 1, "8": 1}}


def test_model_inputs_count_the_forwards_whose_optimizer_step_came():
    """A run that fails (or ends inside an accumulation) after a forward: that forward trained nothing. The counts are
    those up to the last optimizer step, the forwards after it said apart."""
    import torch

    from gpuscale.measure.probe.model_inputs import ModelInputs

    model, counted = torch.nn.Linear(4, 2), ModelInputs()
    counted.watch(model)
    for _ in range(2):  # two steps of two micro-batches of 8
        model(torch.zeros(8, 4))
        model(torch.zeros(8, 4))
        counted.stepped()
    model(torch.zeros(8, 4))  # the third step's first micro-batch; the rank then failed
    inputs = counted.as_dict()
    assert (inputs["calls"], inputs["samples"], inputs["after_last_step"]) == (4, 32, 1)


def test_the_imbalance_clause_says_jitter_plainly_when_no_rank_is_slower_on_average():
    """gpuscale run's summary line: an imbalance that is all jitter read "0% of it no rank slower on average, the rest
    jitter"; it now says so plainly. A rank slower on average is named with its share."""
    from gpuscale.measure.probe import _slow_rank

    def summary(persistent, slow):
        return {"step_breakdown_s": {"imbalance": 0.010, "persistent_imbalance": persistent, "jitter": 0.010 - persistent},
                "sync_probe": {"slow_rank": slow}}

    assert _slow_rank(summary(0.0, None)) == ": all of it jitter, no rank slower on average"
    assert _slow_rank(summary(0.00001, 1)) == ": all of it jitter, no rank slower on average"  # 0.1%: rounds to none
    assert _slow_rank(summary(0.0031, 1)) == ": 31% of it rank 1 slower on average, the rest jitter"
    assert _slow_rank(summary(0.00999, 1)) == ": all of it rank 1 slower on average, no jitter"  # rounds to 100%: no rest


def test_the_ddp_schedule_says_what_a_short_run_leaves_out():
    """A run of 16 steps on CPUs rests on 14 of them (fewer than 10 after the first 10: only the first left out); the
    schedule's words must not say the first 10 were."""
    from gpuscale.measure.probe.merge import ddp_schedule
    from gpuscale.measure.stepsplit import _common_probes

    text = ddp_schedule([{"ddp": {"rate": 1}}])
    assert "the first 10 left out as warm-up where at least 10 came after them, else the first one" in text
    probes = [{"probes": [{"step": s} for s in range(1, 17)]}]  # steps 1-16: 6 after the warm-up
    assert len(_common_probes(probes, 10)) == 15


def test_ranks_in_a_group_with_no_backend_are_said_to_have_trained_copies():
    """Accelerate 1.15 on CPUs, not told to distribute: each rank joins a group of 2 with no backend ("undefined") and
    trains alone; gpuscale run's lines say the throughput is two copies', not one model's."""
    alone = {"world": {"world_size": 2, "backend": "undefined"}}
    records = [_record(rank, passes=_two_epochs_with_eval(), **{**alone, "world": {**alone["world"], "rank": rank}}) for rank in (0, 1)]
    summary, _ = merge_records(records, world_size=2)
    assert summary["probe"]["synchronised"] is False
    assert "the 2 ranks trained independent copies of the model" in describe(summary)
    together, _ = merge_records([_record(rank, passes=_two_epochs_with_eval(), ddp={"parameters": 10}) for rank in (0, 1)], world_size=2)
    assert together["probe"]["synchronised"] is True and "independent copies" not in describe(together)


def test_the_zero_step_a_checkpoint_resume_takes_to_make_the_optimizer_state_is_no_training_step(tmp_path):
    """torch.distributed.checkpoint makes an optimizer's state before it loads a checkpoint into it (an fsdp resume):
    one step at learning rate 0 on zero gradients, through the optimizer's own step, which the probe's global step
    hook sees. It is not counted; the first real step is, and so is a warm-up's first step at learning rate 0."""
    import torch
    from torch.distributed.checkpoint.state_dict import _init_optim_state
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from gpuscale.measure.probe.recorder import Recorder

    recorder = Recorder(str(tmp_path), 0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    hook = register_optimizer_step_post_hook(recorder.step)
    try:
        _init_optim_state(optimizer)  # what set_optimizer_state_dict does first
        assert optimizer.state and recorder.optimizers == {}
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        warm = torch.optim.SGD(model.parameters(), lr=0.0)  # a warm-up that starts at 0 trains on real gradients
        warm.step()
        plain = torch.optim.SGD(model.parameters(), lr=0.1)  # stateless: its state is made again at every save
        plain.step()
        plain.zero_grad()
        _init_optim_state(plain)
    finally:
        hook.remove()
    assert [entry["steps"] for entry in recorder.optimizers.values()] == [1, 1, 1]
