"""Unit tests for gpuscale.integrations.hf: Trainer arguments from the batch plan, the checks, and the Meter callback."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import gpuscale
from gpuscale.integrations.hf import MeterCallback, check_checkpoint, check_trainer, trainer_arguments
from gpuscale.measure.metrics import SUMMARY_KEYS

CPU = torch.device("cpu")


def _rt(world_size: int) -> SimpleNamespace:
    return SimpleNamespace(world_size=world_size, device=CPU)


def _plan(world_size: int, max_per_device: int | None = None) -> gpuscale.BatchPlan:
    return gpuscale.plan_batch(32, world_size, scaling="strong", max_per_device=max_per_device)


# --------------------------------------------------------------------------------------------------
# trainer_arguments


def test_ddp_arguments_divide_the_global_batch_and_use_the_cpu():
    arguments = trainer_arguments(_plan(2), rt=_rt(2))
    assert arguments == {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 1, "use_cpu": True,
                         "max_grad_norm": 1.0, "bf16": False, "fp16": False}


def test_max_per_device_becomes_accumulation():
    arguments = trainer_arguments(_plan(2, max_per_device=5), rt=_rt(2))
    assert arguments["per_device_train_batch_size"] == 4 and arguments["gradient_accumulation_steps"] == 4


def test_deepspeed_config_agrees_with_the_loader_and_the_trainer():
    arguments = trainer_arguments(_plan(4, max_per_device=4), strategy="deepspeed", zero_stage=1, max_grad_norm=0.5, rt=_rt(4))
    config = arguments["deepspeed"]
    assert config["train_batch_size"] == 32
    assert config["train_micro_batch_size_per_gpu"] == arguments["per_device_train_batch_size"] == 4
    assert config["gradient_accumulation_steps"] == arguments["gradient_accumulation_steps"] == 2
    assert config["gradient_clipping"] == arguments["max_grad_norm"] == 0.5
    assert config["zero_optimization"]["stage"] == 1 and "optimizer" not in config
    assert config["bf16"] == {"enabled": False}


def test_user_deepspeed_config_with_another_batch_is_refused():
    with pytest.raises(ValueError, match="disagrees with the loader"):
        trainer_arguments(_plan(2), strategy="deepspeed", ds_config={"train_batch_size": 64}, rt=_rt(2))


def test_user_deepspeed_config_with_an_optimizer_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        trainer_arguments(_plan(2), strategy="deepspeed", ds_config={"optimizer": {"type": "AdamW"}}, rt=_rt(2))


def test_user_deepspeed_config_sets_the_precision_under_auto():
    arguments = trainer_arguments(_plan(2), strategy="deepspeed", ds_config={"bf16": {"enabled": True}}, rt=_rt(2))
    assert arguments["bf16"] is True and arguments["deepspeed"]["bf16"]["enabled"] is True


@pytest.mark.parametrize("options, message", [
    ({"strategy": "fsdp"}, "not available with the HF Trainer"),
    ({"zero_stage": 2}, "only apply to strategy 'deepspeed'"),
    ({"ds_config": {}}, "only apply to strategy 'deepspeed'"),
])
def test_options_the_trainer_cannot_honour_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        trainer_arguments(_plan(2), rt=_rt(2), **options)


def test_plan_for_another_world_size_is_refused():
    with pytest.raises(ValueError, match="plan is for 2 ranks but this job has 4"):
        trainer_arguments(_plan(2), rt=_rt(4))


def test_training_arguments_accept_the_deepspeed_config(tmp_path):
    """HF's own consistency checks (batch, accumulation, clipping, precision) pass on gpuscale's config."""
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], **trainer_arguments(_plan(1, 8), strategy="deepspeed", rt=_rt(1)))
    config = args.hf_deepspeed_config.config
    assert config["train_batch_size"] == 32 and config["gradient_accumulation_steps"] == 4
    assert config["gradient_clipping"] == 1.0


# --------------------------------------------------------------------------------------------------
# check_trainer


def _trainer(world_size: int, per_device: int, accumulation: int = 1) -> SimpleNamespace:
    args = SimpleNamespace(world_size=world_size, per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation)
    return SimpleNamespace(args=args, is_deepspeed_enabled=False)


def test_a_trainer_that_trains_alone_is_refused():
    with pytest.raises(ValueError, match="sees 1 process.*use_cpu=True"):
        check_trainer(_trainer(1, 16), _plan(2), rt=_rt(2))


def test_a_trainer_with_another_batch_is_refused():
    with pytest.raises(ValueError, match="global batch is 2 ranks x 8 x 1 accumulation = 16"):
        check_trainer(_trainer(2, 8), _plan(2), rt=_rt(2))


def test_an_agreeing_trainer_passes():
    check_trainer(_trainer(2, 4, 4), _plan(2, 4), rt=_rt(2))


# --------------------------------------------------------------------------------------------------
# check_checkpoint


class NotData:
    pass


def test_checkpoint_with_data_only_passes(tmp_path):
    (tmp_path / "global_step2").mkdir()
    torch.save({"w": torch.ones(2), "step": 2}, tmp_path / "global_step2" / "mp_rank_00_model_states.pt")
    check_checkpoint(tmp_path)


def test_checkpoint_naming_code_is_refused(tmp_path):
    (tmp_path / "global_step2").mkdir()
    torch.save({"evil": NotData()}, tmp_path / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(ValueError, match="NotData.*refusing to resume"):
        check_checkpoint(tmp_path)


def test_truncated_checkpoint_is_refused(tmp_path):
    (tmp_path / "global_step2").mkdir()
    (tmp_path / "global_step2" / "mp_rank_00_model_states.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match="may be truncated"):
        check_checkpoint(tmp_path)


# --------------------------------------------------------------------------------------------------
# MeterCallback




def test_meter_callback_feeds_the_summary(single_process, tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("gpuscale.integrations.hf.time.perf_counter", lambda: clock[0])
    args = SimpleNamespace(gradient_accumulation_steps=2, per_device_train_batch_size=8, deepspeed=None)
    with gpuscale.init():
        plan = gpuscale.plan_batch(16, 1, scaling="strong", max_per_device=8)
        meter = gpuscale.Meter(plan)
        callback = MeterCallback(meter)
        state = SimpleNamespace(global_step=10, epoch=0.5)
        model = torch.nn.Linear(5, 3)                       # as the Trainer hands it to callbacks
        model.bias.requires_grad_(False)
        callback.on_train_begin(args, state, None, model=model)  # resumed at step 10, half an epoch in
        callback.on_evaluate(args, state, None, metrics={"eval_loss": 2.0, "eval_runtime": 3.0})
        callback.on_epoch_begin(args, state, None)
        for step in (11, 12):
            clock[0] += 0.25                                   # fetching the batches
            callback.on_step_begin(args, state, None)
            clock[0] += 1.0                                    # computing
            state.global_step, state.epoch = step, state.epoch + 0.1
            callback.on_step_end(args, state, None)
            callback.on_log(args, state, None, logs={"loss": 1.5 - step / 100, "learning_rate": 0.1})
        clock[0] += 2.0                                        # saving
        callback.on_save(args, state, None)
        callback.on_train_end(args, state, None)
        callback.on_evaluate(args, state, None, metrics={"eval_loss": 1.0, "eval_runtime": 5.0})  # after train(): not charged
        summary = meter.write_summary(tmp_path, final_loss=callback.final_loss)
    assert meter.seconds == {"data_wait": pytest.approx(0.5), "eval": 3.0, "checkpoint": 2.0}
    assert summary["steps"] == 2 and summary["samples"] == 32 and summary["epochs"] == pytest.approx(0.2)
    assert summary["final_loss"] == pytest.approx(1.38)
    assert summary["strategy"] == "ddp" and summary["global_batch"] == 16 and summary["grad_accum_steps"] == 2
    assert summary["gradient_bytes"] == 5 * 3 * 4, "the trainable weights only, fp32"
    assert callback.evaluations == [{"step": 10, "time_s": 0.0, "eval_loss": 2.0, "eval_runtime": 3.0}]
    assert all(key in summary for key in SUMMARY_KEYS)
    assert (tmp_path / "summary.json").is_file()


def test_stop_callback_saves_and_stops_the_trainer_once_a_stop_is_requested():
    from types import SimpleNamespace

    from gpuscale.integrations.hf import StopCallback

    class FakeStop:
        def __init__(self):
            self.answers = [False, False, True]

        def requested(self):
            return self.answers.pop(0)

    callback = StopCallback(FakeStop())
    controls = []
    for _ in range(3):
        control = SimpleNamespace(should_save=False, should_training_stop=False)
        callback.on_step_end(None, None, control)
        controls.append((control.should_save, control.should_training_stop))
    assert controls == [(False, False), (False, False), (True, True)]


def test_a_compile_mode_goes_to_the_trainer_and_needs_compile():
    """--compile-mode reduce-overhead (CUDA graphs) becomes torch_compile_mode; without --compile, or an unknown mode,
    it is refused in one line, as gpuscale.setup refuses it."""
    import argparse

    from gpuscale.train.step import add_arguments, training_options

    arguments = trainer_arguments(_plan(2), compile=True, compile_mode="reduce-overhead", rt=_rt(2))
    assert arguments["torch_compile"] is True and arguments["torch_compile_mode"] == "reduce-overhead"
    assert "torch_compile_mode" not in trainer_arguments(_plan(2), compile=True, rt=_rt(2))
    with pytest.raises(ValueError, match="compile mode 'reduce-overhead' needs compile"):
        trainer_arguments(_plan(2), compile_mode="reduce-overhead", rt=_rt(2))
    with pytest.raises(ValueError, match="is not one of default, reduce-overhead"):
        trainer_arguments(_plan(2), compile=True, compile_mode="fastest", rt=_rt(2))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert training_options(parser.parse_args(["--compile", "--compile-mode", "reduce-overhead"]))["compile_mode"] == "reduce-overhead"
    with gpuscale.init():
        plan = gpuscale.plan_batch(2, 1)
        with pytest.raises(ValueError, match="needs compile"):
            gpuscale.setup(torch.nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1), plan=plan, compile_mode="reduce-overhead")
