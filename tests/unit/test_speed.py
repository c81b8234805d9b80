"""gpuscale.runtime.speed and its switches: channels-last, fused optimizers and compile change kernels and layouts, never the numbers."""

from __future__ import annotations

import argparse
import copy

import pytest
import torch
from torch import nn

import gpuscale
from gpuscale.integrations.hf import trainer_arguments
from gpuscale.runtime import speed
from gpuscale.strategy import get_strategy
from gpuscale.train.step import add_arguments, loader_options, training_options

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
DDP, FSDP, DEEPSPEED = (get_strategy(name) for name in ("ddp", "fsdp", "deepspeed"))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))


def _two_groups(net: nn.Module, cls=torch.optim.AdamW, **options) -> torch.optim.Optimizer:
    conv, _, _, head = net
    return cls([{"params": conv.parameters(), "lr": 1e-2}, {"params": head.parameters()}], lr=1e-3, **options)


def _train(net: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 3) -> list[float]:
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 3, 6, 6), torch.randint(0, 2, (4,))
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


# --- fused optimizers ---------------------------------------------------------------------------


def test_fused_optimizer_keeps_every_group_and_option_and_takes_the_same_steps():
    plain_net, fused_net = _net(), _net()
    plain = _two_groups(plain_net, weight_decay=0.05)
    fused = speed.fuse_optimizer(_two_groups(fused_net, weight_decay=0.05), True, CPU, DDP)
    assert fused.defaults["fused"] is True and all(g["fused"] for g in fused.param_groups)
    assert [g["lr"] for g in fused.param_groups] == [1e-2, 1e-3], "per-group learning rates survive the rebuild"
    assert all(g["weight_decay"] == 0.05 for g in fused.param_groups)
    assert [p for g in fused.param_groups for p in g["params"]] == list(fused_net.parameters())
    assert _train(fused_net, fused) == pytest.approx(_train(plain_net, plain), rel=1e-5)
    for a, b in zip(fused_net.parameters(), plain_net.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_auto_fuses_only_on_gpus_under_ddp_and_respects_the_scripts_choice():
    optimizer = _two_groups(_net())
    assert speed.fuse_optimizer(optimizer, None, CPU, DDP) is optimizer, "auto on a CPU: unchanged"
    assert speed.fuse_optimizer(optimizer, False, CUDA, DDP) is optimizer
    assert speed.fuse_optimizer(optimizer, None, CUDA, FSDP) is optimizer, "auto fuses under ddp only"
    chosen = _two_groups(_net(), foreach=False)
    assert speed.fuse_optimizer(chosen, None, CUDA, DDP) is chosen, "a script that picked foreach keeps it"
    unfused = _two_groups(_net(), fused=False)
    assert speed.fuse_optimizer(unfused, None, CUDA, DDP) is unfused, "a script that said fused=False keeps it"
    # auto on a GPU whose parameters are elsewhere (on the CPU here): torch would fail at the first step, so kept
    assert speed.fuse_optimizer(optimizer, None, CUDA, DDP) is optimizer


def test_explicit_fused_that_cannot_be_honoured_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"torch cannot fuse this AdamW \(a parameter on cpu, not on cuda\)"):
        speed.fuse_optimizer(_two_groups(_net()), True, CUDA, DDP)
    rmsprop = torch.optim.RMSprop(_net().parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="RMSprop has no fused implementation"):
        speed.fuse_optimizer(rmsprop, True, CPU, DDP)
    assert speed.fuse_optimizer(rmsprop, None, CUDA, DDP) is rmsprop
    net = _net()
    stepped = _two_groups(net)
    _train(net, stepped, steps=1)
    with pytest.raises(ValueError, match="already stepped"):
        speed.fuse_optimizer(stepped, True, CPU, DDP)


def test_a_resumed_run_keeps_its_own_fused_choice():
    """A checkpoint written by an unfused run, loaded into a fused optimizer (and back): each keeps its kind and steps on."""
    writer_net = _net()
    writer = _two_groups(writer_net)
    _train(writer_net, writer, steps=2)
    state = copy.deepcopy(writer.state_dict())  # as a checkpoint file would: state_dict() shares the live tensors
    net = _net()
    net.load_state_dict(writer_net.state_dict())
    fused = speed.fuse_optimizer(_two_groups(net), True, CPU, DDP)
    with speed.keeping_implementation(fused):
        fused.load_state_dict(state)
    assert all(g["fused"] for g in fused.param_groups) and fused.param_groups[0]["lr"] == 1e-2
    steps = [fused.state[p]["step"] for p in net.parameters()]
    assert all(isinstance(s, torch.Tensor) and s.dtype == torch.float32 and float(s) == 2.0 for s in steps)
    _train(net, fused, steps=1)
    _train(writer_net, writer, steps=1)
    for a, b in zip(net.parameters(), writer_net.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), "the resumed fused run continues the unfused one"


# --- channels-last ------------------------------------------------------------------------------


def test_channels_last_is_auto_on_gpus_for_convolutional_models_only():
    assert speed.use_channels_last(None, _net(), CUDA, DDP)
    assert not speed.use_channels_last(None, _net(), CPU, DDP)
    assert not speed.use_channels_last(None, nn.Linear(3, 3), CUDA, DDP)
    assert speed.use_channels_last(True, nn.Linear(3, 3), CPU, DDP) and not speed.use_channels_last(False, _net(), CUDA, DDP)
    assert not speed.use_channels_last(None, _net(), CUDA, FSDP), "FSDP keeps contiguous shards"
    with pytest.raises(ValueError, match="channels-last does not work under deepspeed"):
        speed.use_channels_last(True, _net(), CUDA, DEEPSPEED)


def test_channels_last_changes_strides_not_values_keys_or_outputs():
    reference, converted = _net(), speed.to_channels_last(_net())
    weight = converted[0].weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    assert converted[3].weight.is_contiguous(), "only Conv2d weights change layout"
    assert reference.state_dict().keys() == converted.state_dict().keys()
    for (name, a), b in zip(reference.state_dict().items(), converted.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    x = torch.randn(2, 3, 6, 6)
    assert torch.allclose(reference(x), converted(x), atol=1e-6)


# --- compile ------------------------------------------------------------------------------------


def test_compile_in_place_keeps_the_module_and_its_checkpoint_keys():
    reference, net = _net(), _net()
    compiled = speed.compile_model(net, "aot_eager")
    assert compiled is net and net._compiled_call_impl is not None
    assert list(net.state_dict()) == list(reference.state_dict()), "no _orig_mod. prefix in checkpoints"
    x = torch.randn(2, 3, 6, 6)
    assert torch.allclose(net(x), reference(x), atol=1e-6)
    assert speed.compile_model(reference, False) is reference and reference._compiled_call_impl is None


def test_setup_applies_the_switches_and_refuses_them_under_deepspeed():
    with gpuscale.init(device="cpu") as rt:
        plan = gpuscale.plan_batch(4, rt.world_size)
        training = gpuscale.setup(_net(), lambda p: torch.optim.SGD(p, lr=0.1), plan=plan, channels_last=True, fused=True,
                                  compile="aot_eager")
        assert training.module[0].weight.is_contiguous(memory_format=torch.channels_last)
        assert training.optimizer.defaults["fused"] is True and training.model._compiled_call_impl is not None
        plain = gpuscale.setup(_net(), lambda p: torch.optim.SGD(p, lr=0.1), plan=plan)
        assert plain.optimizer.defaults["fused"] is None and plain.model._compiled_call_impl is None, "a CPU's defaults: off"
        with pytest.raises(ValueError, match="fused and compile are not available with strategy 'deepspeed'"):
            gpuscale.setup(_net(), lambda p: torch.optim.SGD(p, lr=0.1), plan=plan, strategy="deepspeed", compile=True)


# --- command line -------------------------------------------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_switches_left_at_auto_reach_setup_as_nothing():
    assert training_options(_parse()) == {"strategy": "ddp", "precision": "auto"}
    assert loader_options(_parse()) == {}


def test_the_courses_way_and_compile_from_the_command_line():
    args = _parse("--precision", "fp32", "--channels-last", "off", "--fused", "off", "--loader-workers", "0", "--pin-memory", "off",
                  "--compile")
    assert training_options(args) == {"strategy": "ddp", "precision": "fp32", "channels_last": False, "fused": False,
                                      "compile": "inductor"}
    assert loader_options(args) == {"num_workers": 0, "pin_memory": False}
    assert training_options(_parse("--fused", "on", "--compile", "aot_eager"))["compile"] == "aot_eager"
    with pytest.raises(ValueError, match="--loader-workers -1"):
        loader_options(_parse("--loader-workers", "-1"))


def test_the_trainer_gets_the_same_switches_in_its_own_words():
    from types import SimpleNamespace

    rt, plan = SimpleNamespace(world_size=1, device=CPU), gpuscale.plan_batch(8, 1)
    assert "optim" not in trainer_arguments(plan, rt=rt), "auto: the Trainer's own default"
    assert trainer_arguments(plan, fused=False, rt=rt)["optim"] == "adamw_torch"
    assert trainer_arguments(plan, fused=True, rt=rt)["optim"] == "adamw_torch_fused"
    compiled = trainer_arguments(plan, compile="aot_eager", rt=rt)
    assert compiled["torch_compile"] is True and compiled["torch_compile_backend"] == "aot_eager"
    with pytest.raises(ValueError, match="channels-last is not applied by the HF Trainer"):
        trainer_arguments(plan, channels_last=True, rt=rt)
    with pytest.raises(ValueError, match="not available with strategy 'deepspeed'"):
        trainer_arguments(plan, strategy="deepspeed", fused=True, rt=rt)
    assert trainer_arguments(plan, strategy="deepspeed", fused=False, rt=rt)["optim"] == "adamw_torch"
