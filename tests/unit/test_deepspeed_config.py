"""DeepSpeed's config comes from the batch plan; a user's config is read (JSON, hjson) and checked."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from gpuscale.base.precision import resolve_precision
from gpuscale.runtime.data import plan_batch
from gpuscale.strategy.deepspeed_config import build_config, config_precision, load_config
from gpuscale.train.step import add_arguments, training_options

CPU = torch.device("cpu")
FP32 = resolve_precision("fp32", CPU)
BF16 = resolve_precision("bf16", CPU)


def test_batch_keys_come_from_the_plan():
    plan = plan_batch(32, 4, scaling="strong", max_per_device=4)  # 8 per rank = 2 passes of 4
    config = build_config(plan, FP32)
    assert config["train_batch_size"] == 32
    assert config["train_micro_batch_size_per_gpu"] == 4
    assert config["gradient_accumulation_steps"] == 2
    assert config["zero_optimization"]["stage"] == 2
    assert config["bf16"] == {"enabled": False} and config["fp16"] == {"enabled": False}


def test_clipping_is_off_unless_asked_for():
    """DeepSpeed clips at 1.0 by default; gpuscale's configs say what the script asked for."""
    plan = plan_batch(8, 2)
    assert build_config(plan, FP32)["gradient_clipping"] == 0.0
    assert build_config(plan, FP32, clip_grad_norm=1.0)["gradient_clipping"] == 1.0
    assert build_config(plan, FP32, user_config={"gradient_clipping": 0.5})["gradient_clipping"] == 0.5
    with pytest.raises(ValueError, match="gradient clipping is 1.0 on the command line but 0.5"):
        build_config(plan, FP32, clip_grad_norm=1.0, user_config={"gradient_clipping": 0.5})


def test_course_config_with_a_per_rank_batch_is_refused():
    """docs/classic-bugs.md, bug 5: train_batch_size 32 while the loader gives 32 per rank on 2 ranks."""
    plan = plan_batch(32, 2, scaling="weak")
    with pytest.raises(ValueError) as err:
        build_config(plan, FP32, user_config={"train_batch_size": 32})
    message = str(err.value)
    assert "train_batch_size=32 (the loader gives 64)" in message
    assert "2 ranks x 32 x 1 accumulation = 64" in message and "\n" not in message


def test_auto_and_matching_batch_keys_are_accepted():
    plan = plan_batch(32, 2, scaling="strong")
    user = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 16, "scheduler": {"type": "WarmupLR"}}
    config = build_config(plan, FP32, user_config=user)
    assert config["train_batch_size"] == 32 and config["scheduler"] == {"type": "WarmupLR"}
    assert user["train_batch_size"] == "auto", "the user's dict must not be modified"


def test_zero_stage_offload_and_conflicts():
    plan = plan_batch(8, 2)
    config = build_config(plan, FP32, zero_stage=3, offload=True)
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    assert config["zero_force_ds_cpu_optimizer"] is False  # a torch optimizer on offloaded states
    assert build_config(plan, FP32, zero_stage=1, offload=True)["zero_optimization"].get("offload_param") is None
    assert build_config(plan, FP32, user_config={"zero_optimization": {"stage": 1}})["zero_optimization"]["stage"] == 1
    with pytest.raises(ValueError, match="ZeRO stage is 3 on the command line but 1 in the DeepSpeed config"):
        build_config(plan, FP32, zero_stage=3, user_config={"zero_optimization": {"stage": 1}})
    with pytest.raises(ValueError, match="ZeRO stage 4 is not one of 1, 2, 3"):
        build_config(plan, FP32, zero_stage=4)


def test_users_loss_scaling_settings_are_kept():
    config = build_config(plan_batch(8, 1), resolve_precision("fp16", CPU),
                          user_config={"fp16": {"enabled": True, "loss_scale": 128, "initial_scale_power": 8}})
    assert config["fp16"] == {"enabled": True, "loss_scale": 128, "initial_scale_power": 8}


def test_precision_sections_and_conflicts():
    plan = plan_batch(8, 1)
    config = build_config(plan, BF16)
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    fp16 = build_config(plan, resolve_precision("fp16", CPU))
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    with pytest.raises(ValueError, match="enables bf16 but the run's precision is fp32; pass --precision bf16"):
        build_config(plan, FP32, user_config={"bf16": {"enabled": True}})
    assert config_precision({"fp16": {"enabled": True}}) == "fp16"
    with pytest.raises(ValueError, match="both bf16 and fp16"):
        config_precision({"fp16": {"enabled": True}, "bf16": {"enabled": True}})


def test_one_optimizer_owner():
    plan = plan_batch(8, 1)
    with pytest.raises(ValueError, match="both the DeepSpeed config and the script define an optimizer"):
        build_config(plan, FP32, user_config={"optimizer": {"type": "Adam"}})
    with pytest.raises(ValueError, match="no optimizer"):
        build_config(plan, FP32, client_optimizer=False)
    assert build_config(plan, FP32, user_config={"optimizer": {"type": "Adam"}}, client_optimizer=False)["optimizer"]["type"] == "Adam"


def test_load_json_and_course_hjson(tmp_path):
    plain = tmp_path / "ds.json"
    plain.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    assert load_config(plain) == {"zero_optimization": {"stage": 1}}
    course = tmp_path / "ds_config.hjson"  # as the course wrote it: a comment and trailing commas
    course.write_text('{\n  # ZeRO stage 1, clipping as in the course\n  "train_batch_size": 32,\n'
                      '  "gradient_clipping": 1.0,\n  "zero_optimization": {"stage": 1,},\n}\n')
    loaded = load_config(course)
    assert loaded == {"train_batch_size": 32, "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}}
    assert type(loaded["zero_optimization"]) is dict


@pytest.mark.parametrize("text, message", [
    ("{ not: valid: [", "neither JSON nor hjson"),
    ("[1, 2]", "holds a list, not a DeepSpeed config object"),
])
def test_bad_config_files_are_named(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config(path)
    with pytest.raises(ValueError, match="cannot read DeepSpeed config"):
        load_config(tmp_path / "missing.json")


def test_command_line_switch():
    parser = argparse.ArgumentParser()
    add_arguments(parser, default_zero_stage=1)
    assert training_options(parser.parse_args([])) == {"strategy": "ddp", "precision": "auto"}
    options = training_options(parser.parse_args(["--strategy", "deepspeed", "--offload"]))
    assert options == {"strategy": "deepspeed", "precision": "auto", "zero_stage": 1, "offload": True, "ds_config": None}
    with pytest.raises(ValueError, match="--offload: for --strategy deepspeed only"):
        training_options(parser.parse_args(["--offload"]))
    with pytest.raises(ValueError, match="--zero-stage: for --strategy deepspeed only"):
        training_options(parser.parse_args(["--zero-stage", "3"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--strategy", "horovod"])


def test_precision_resolution():
    assert resolve_precision("auto", CPU).name == "fp32"
    assert resolve_precision("bf16", CPU).dtype is torch.bfloat16
    assert resolve_precision("fp32", CPU).grad_scaler() is None
    assert resolve_precision("fp16", CPU).grad_scaler() is not None
    assert resolve_precision("bf16", CPU).trainer_arguments() == {"bf16": True, "fp16": False}
    with pytest.raises(ValueError, match="precision='fp8' is not one of auto, fp32, bf16, fp16"):
        resolve_precision("fp8", CPU)


def test_missing_deepspeed_gives_the_install_command(monkeypatch):
    import sys

    from gpuscale.strategy.deepspeed import import_deepspeed

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as if it were not installed
    with pytest.raises(ValueError, match=r"DS_BUILD_OPS=0 pip install 'gpuscale\[deepspeed\]'"):
        import_deepspeed()


def test_setup_refuses_deepspeed_options_for_other_strategies():
    from types import SimpleNamespace

    from gpuscale.train.step import setup

    rt = SimpleNamespace(device=CPU, world_size=1, rank=0, is_distributed=False)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="zero_stage, ds_config: for strategy 'deepspeed' only, not 'fsdp'"):
        setup(model, torch.optim.SGD, plan=plan_batch(4, 1), strategy="fsdp", zero_stage=2, ds_config={}, rt=rt)
    with pytest.raises(ValueError, match="unknown strategy 'zero'; choose one of: ddp, fsdp, deepspeed"):
        setup(model, torch.optim.SGD, plan=plan_batch(4, 1), strategy="zero", rt=rt)
    with pytest.raises(ValueError, match="pass optimizer="):
        setup(model, None, plan=plan_batch(4, 1), rt=rt)
