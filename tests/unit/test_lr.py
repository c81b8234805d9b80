"""gpuscale.train.lr: learning rates scaled with the global batch, warmed up, driving a real torch optimizer.

Every expected number is worked out by hand in the test (batch sizes, factors, warm-up ramps),
not recomputed with the module's own formulas.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math

import pytest
import torch

import gpuscale
from gpuscale.train.lr import RULES, ScaledLR, add_arguments, lr_options, scale_lr

# --- factors -------------------------------------------------------------------------------------


def test_weak_scaling_on_8_devices_scales_by_the_8_times_larger_batch():
    plan = gpuscale.plan_batch(32, 8, scaling="weak")  # 32 per device, global 256
    linear, root, none = (scale_lr(0.1, plan, rule=rule) for rule in ("linear", "sqrt", "none"))
    assert (linear.base_batch, linear.global_batch) == (32, 256)
    assert linear.factor == 8 and linear.lr == pytest.approx(0.8)
    assert root.factor == pytest.approx(2.8284271247461903) and root.lr == pytest.approx(0.28284271247461903)
    assert none.factor == 1 and none.lr == 0.1


def test_weak_scaling_on_one_device_keeps_the_learning_rate():
    scaled = scale_lr(0.1, gpuscale.plan_batch(32, 1, scaling="weak"), rule="linear")
    assert scaled.factor == 1 and scaled.lr == 0.1 and scaled.base_batch == scaled.global_batch == 32


def test_strong_scaling_keeps_the_learning_rate_unless_told_the_tuned_batch():
    plan = gpuscale.plan_batch(256, 8, scaling="strong")  # 32 per device, global 256 whatever the devices
    assert scale_lr(0.1, plan, rule="linear").factor == 1
    assert scale_lr(0.1, plan, rule="sqrt").lr == 0.1
    tuned_for_32 = scale_lr(0.1, plan, rule="linear", base_batch=32)
    assert tuned_for_32.factor == 8 and tuned_for_32.lr == pytest.approx(0.8)
    assert scale_lr(0.1, plan, rule="sqrt", base_batch=64).factor == 2  # sqrt(256 / 64)


def test_gradient_accumulation_counts_in_the_global_batch():
    # weak: 64 per device as 4 passes of 16, on 4 devices: global 256; one device would have had 64
    weak = gpuscale.plan_batch(64, 4, scaling="weak", max_per_device=16)
    assert (weak.per_device_batch, weak.grad_accum_steps) == (16, 4)
    scaled = scale_lr(0.01, weak, rule="linear")
    assert (scaled.base_batch, scaled.global_batch, scaled.factor) == (64, 256, 4)
    # strong on one process: 256 as 8 passes of 32 (the global batch of 8 devices), tuned for 32
    strong = gpuscale.plan_batch(256, 1, scaling="strong", max_per_device=32)
    assert (strong.per_device_batch, strong.grad_accum_steps) == (32, 8)
    assert scale_lr(0.003, strong, rule="linear").factor == 1
    one = scale_lr(0.003, strong, rule="linear", base_batch=32)
    assert one.factor == 8 and one.lr == pytest.approx(0.024)
    assert scale_lr(0.003, strong, rule="sqrt", base_batch=32).lr == pytest.approx(0.003 * 2.8284271247461903)


def test_a_smaller_batch_than_tuned_scales_down():
    scaled = scale_lr(0.2, gpuscale.plan_batch(128, 2, scaling="strong"), rule="linear", base_batch=512)
    assert scaled.factor == 0.25 and scaled.lr == pytest.approx(0.05)


def test_scale_applies_the_same_factor_to_another_learning_rate():
    scaled = scale_lr(0.003, gpuscale.plan_batch(32, 8, scaling="weak"), rule="linear")
    assert scaled.scale(1e-5) == pytest.approx(8e-5)
    assert scale_lr(0.003, gpuscale.plan_batch(32, 4, scaling="weak"), rule="sqrt").scale(1e-5) == pytest.approx(2e-5)
    assert scale_lr(0.003, gpuscale.plan_batch(32, 4, scaling="weak"), rule="none").scale(1e-5) == 1e-5


# --- warm-up -------------------------------------------------------------------------------------


def test_warm_up_rises_linearly_from_base_lr_to_lr_then_stays():
    scaled = scale_lr(0.1, gpuscale.plan_batch(32, 4, scaling="weak"), rule="linear", warmup_steps=3)  # lr 0.4
    assert [scaled.lr_at(step) for step in range(6)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    assert scaled.lr_at(10_000) == pytest.approx(0.4)


def test_no_warm_up_starts_at_the_scaled_lr():
    scaled = scale_lr(0.1, gpuscale.plan_batch(32, 4, scaling="weak"), rule="linear")
    assert scaled.warmup_steps == 0 and scaled.lr_at(0) == pytest.approx(0.4)


def test_warm_up_without_scaling_is_flat():
    scaled = scale_lr(0.1, gpuscale.plan_batch(32, 4, scaling="weak"), rule="none", warmup_steps=5)
    assert [scaled.lr_at(step) for step in range(7)] == [0.1] * 7


def _sgd(lr: float, groups: int = 1) -> tuple[list[torch.nn.Parameter], torch.optim.SGD]:
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(groups)]
    rates = [lr] + [lr / 10] * (groups - 1)  # a second group with a tenth of the rate
    return params, torch.optim.SGD([{"params": [p], "lr": r} for p, r in zip(params, rates, strict=True)])


def _train(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, scheduler, steps: int) -> list[float]:
    """Plain SGD on loss = sum(p): each step moves p by exactly -lr. Returns the lr of each step."""
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.zero_grad()
        sum(p.sum() for p in params).backward()
        optimizer.step()
        scheduler.step()
    return used


def test_scheduler_drives_a_torch_optimizer_through_the_warm_up():
    scaled = scale_lr(0.1, gpuscale.plan_batch(32, 4, scaling="weak"), rule="linear", warmup_steps=4)  # 0.1 -> 0.4
    params, optimizer = _sgd(scaled.lr, groups=2)
    scheduler = scaled.scheduler(optimizer)
    assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR)
    used = _train(params, optimizer, scheduler, 6)
    assert used == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
    # the weights moved by exactly the rates used: the optimizer really stepped with them
    assert params[0].item() == pytest.approx(-(0.1 + 0.175 + 0.25 + 0.325 + 0.4 + 0.4))
    # the second group kept its tenth of the rate all along
    assert params[1].item() == pytest.approx(-(0.1 + 0.175 + 0.25 + 0.325 + 0.4 + 0.4) / 10)
    assert optimizer.param_groups[1]["lr"] == pytest.approx(0.04)


def test_scheduler_state_resumes_the_warm_up_where_it_stopped():
    """The state goes through torch.save and a weights_only load, as in a gpuscale checkpoint."""
    scaled = scale_lr(0.01, gpuscale.plan_batch(16, 8, scaling="weak"), rule="linear", warmup_steps=8)  # 0.01 -> 0.08
    params, optimizer = _sgd(scaled.lr)
    scheduler = scaled.scheduler(optimizer)
    _train(params, optimizer, scheduler, 3)
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    params2, optimizer2 = _sgd(scaled.lr)
    scheduler2 = scaled.scheduler(optimizer2)
    optimizer2.load_state_dict(state["optimizer"])
    scheduler2.load_state_dict(state["scheduler"])
    # steps 3, 4, ...: 0.01 + 0.07 * 3/8, 0.01 + 0.07 * 4/8, ...
    assert _train(params2, optimizer2, scheduler2, 7) == pytest.approx(
        [0.03625, 0.045, 0.05375, 0.0625, 0.07125, 0.08, 0.08])


def test_scheduler_refuses_an_optimizer_built_with_the_unscaled_rate():
    scaled = scale_lr(0.1, gpuscale.plan_batch(32, 4, scaling="weak"), rule="linear")
    _, optimizer = _sgd(0.1)
    with pytest.raises(ValueError) as error:
        scaled.scheduler(optimizer)
    assert str(error.value) == ("the optimizer's learning rates are [0.1], none the scaled lr 0.4; "
                                "build it with lr=scaled.lr before attaching scaled.scheduler(optimizer)")


# --- the record ----------------------------------------------------------------------------------


def test_as_dict_holds_every_field_and_is_json():
    scaled = scale_lr(0.003, gpuscale.plan_batch(256, 1, scaling="strong", max_per_device=32), rule="linear",
                      warmup_steps=14, base_batch=32)
    record = json.loads(json.dumps(scaled.as_dict()))
    assert record == {"rule": "linear", "base_lr": 0.003, "lr": pytest.approx(0.024), "factor": 8.0, "base_batch": 32,
                      "global_batch": 256, "warmup_steps": 14}


def test_scaled_lr_is_frozen_and_keyword_only():
    scaled = scale_lr(0.1, gpuscale.plan_batch(32, 2, scaling="weak"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        scaled.lr = 1.0
    with pytest.raises(TypeError):
        ScaledLR("linear", 0.1, 0.2, 2.0, 32, 64, 0)
    assert scale_lr(0.1, gpuscale.plan_batch(32, 2, scaling="weak")).rule == "linear"  # linear unless told otherwise


def test_describe_says_where_the_rate_came_from():
    plan = gpuscale.plan_batch(32, 8, scaling="weak")
    assert scale_lr(0.003, plan, warmup_steps=10).describe() == (
        "lr 0.024 = 0.003 x 8 (linear rule: global batch 256 / base batch 32), warm-up from 0.003 over 10 steps")
    assert scale_lr(0.003, plan, rule="none").describe() == "lr 0.003 (rule none: global batch 256, base batch 32)"


# --- bad input -----------------------------------------------------------------------------------

PLAN = gpuscale.plan_batch(32, 2, scaling="weak")


@pytest.mark.parametrize("kwargs, message", [
    ({"rule": "cubic"}, "learning-rate scaling rule 'cubic' is not one of: none, linear, sqrt"),
    ({"rule": "Linear"}, "learning-rate scaling rule 'Linear' is not one of: none, linear, sqrt"),
    ({"base_lr": 0}, "base learning rate 0 must be a positive finite number"),
    ({"base_lr": -0.1}, "base learning rate -0.1 must be a positive finite number"),
    ({"base_lr": math.nan}, "base learning rate nan must be a positive finite number"),
    ({"base_lr": math.inf}, "base learning rate inf must be a positive finite number"),
    ({"base_lr": "0.1"}, "base learning rate '0.1' must be a positive finite number"),
    ({"base_lr": True}, "base learning rate True must be a positive finite number"),
    ({"warmup_steps": -1}, "warm-up steps -1 must be a non-negative integer (0: no warm-up)"),
    ({"warmup_steps": 2.5}, "warm-up steps 2.5 must be a non-negative integer (0: no warm-up)"),
    ({"warmup_steps": None}, "warm-up steps None must be a non-negative integer (0: no warm-up)"),
    ({"base_batch": 0}, ("base batch 0 must be a positive integer (the global batch the learning rate was tuned for), "
                         "or None for the plan's global batch on one device")),
    ({"base_batch": -32}, "base batch -32 must be a positive integer"),
    ({"base_batch": 32.0}, "base batch 32.0 must be a positive integer"),
    ({"base_batch": False}, "base batch False must be a positive integer"),
])
def test_bad_input_is_one_line_naming_what_is_valid(kwargs, message):
    arguments = {"base_lr": 0.1, "plan": PLAN, **kwargs}
    with pytest.raises(ValueError) as error:
        scale_lr(**arguments)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_plan_that_is_not_a_batch_plan_is_a_type_error():
    with pytest.raises(TypeError) as error:
        scale_lr(0.1, {"global_batch": 32})
    assert str(error.value) == "plan must be a gpuscale.BatchPlan (from gpuscale.plan_batch), not dict"


@pytest.mark.parametrize("call, message", [
    (lambda s: s.lr_at(-1), "step -1 must be a non-negative integer (optimizer steps taken so far)"),
    (lambda s: s.lr_at(1.5), "step 1.5 must be a non-negative integer"),
    (lambda s: s.scale(0.0), "learning rate 0.0 must be a positive finite number"),
    (lambda s: s.scale(math.nan), "learning rate nan must be a positive finite number"),
])
def test_bad_steps_and_rates_are_refused(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(scale_lr(0.1, PLAN))


# --- command line --------------------------------------------------------------------------------


def _parser(**kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train.py")
    add_arguments(parser, **kwargs)
    return parser


def test_options_default_to_the_script_unchanged_and_reach_scale_lr():
    args = _parser().parse_args([])
    assert lr_options(args) == {"rule": "none", "warmup_steps": 0, "base_batch": None}
    assert scale_lr(0.1, PLAN, **lr_options(args)).lr == 0.1
    args = _parser().parse_args(["--lr-scaling", "linear", "--lr-warmup-steps", "14", "--lr-base-batch", "16"])
    assert lr_options(args) == {"rule": "linear", "warmup_steps": 14, "base_batch": 16}
    scaled = scale_lr(0.1, PLAN, **lr_options(args))  # global 64 over base 16
    assert scaled.factor == 4 and scaled.warmup_steps == 14
    assert _parser(default_warmup_steps=7).parse_args([]).lr_warmup_steps == 7
    assert set(RULES) == {"none", "linear", "sqrt"}


def test_options_are_grouped_in_the_help():
    text = _parser().format_help()
    assert "learning rate (gpuscale):" in text and "--lr-scaling {none,linear,sqrt}" in text
    assert "--lr-warmup-steps N" in text and "--lr-base-batch N" in text


@pytest.mark.parametrize("argv, message", [
    (["--lr-scaling", "cubic"], "argument --lr-scaling: invalid choice: 'cubic'"),
    (["--lr-warmup-steps", "-1"], "argument --lr-warmup-steps: -1 must be at least 0"),
    (["--lr-warmup-steps", "ten"], "argument --lr-warmup-steps: 'ten' is not an integer"),
    (["--lr-base-batch", "0"], "argument --lr-base-batch: 0 must be at least 1"),
])
def test_bad_options_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        _parser().parse_args(argv)
    assert stopped.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert message in last
    if "choice" in message:  # the valid rules are listed
        assert all(rule in last for rule in ("none", "linear", "sqrt"))
