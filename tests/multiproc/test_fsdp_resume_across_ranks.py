"""fsdp checkpoints resume on another number of ranks, both ways: one process's ``step-N.pt`` on 2 ranks, and
2 ranks' sharded ``step-N/`` on one process (docs/training.md: "resume on any number of ranks").

The resumed run starts at the saved step with the saved weights, Adam moments and step counts and learning rate,
bit for bit, and then trains on as an uninterrupted run does. Across rank counts the gradients are summed in
another order, so the later steps agree to float rounding, as in test_checkpoint.py's strong-scaling test (weights
within atol 1e-5, losses within rel 1e-4); no dropout, since the random states are not carried across rank counts.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

from procs import assert_ok, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc

SAVED_AT = 6
STEPS = 12
# the plain model's parameters in the order Adam numbers them in a one-process state dict; their shapes differ,
# so a state renamed in the wrong order cannot pass for the right one
NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]

SCRIPT = '''
"""Adam over a tiny MLP under fsdp, a checkpoint after every step; after a resume rank 0 writes OUT/resumed.pt
(step, full model state, full optimizer state keyed by parameter name), at the end OUT/final.pt and OUT/losses.json."""
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

import gpuscale

out, steps = Path(sys.argv[1]), int(sys.argv[2])
with gpuscale.init() as rt:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 6), torch.randn(40, 1))
    plan = gpuscale.plan_batch(8, rt.world_size, scaling="strong")
    loader = gpuscale.make_loader(data, plan, seed=3)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    training = gpuscale.setup(net, lambda params: torch.optim.Adam(params, lr=0.01), plan=plan,
                              strategy="fsdp", precision="fp32")
    model, opt = training.model, training.optimizer
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    ckpt = gpuscale.Checkpointer(out / "ckpt", keep=steps)
    state = ckpt.resume(model=model, optimizer=opt, scheduler=sched, loader=loader)
    step = state.step if state else 0
    losses = state.extra["losses"] if state else {}
    if state is not None:
        weights = gpuscale.full_state_dict(model)  # collective
        full = StateDictOptions(full_state_dict=True, cpu_offload=True) if rt.is_distributed else None
        moments = get_optimizer_state_dict(model, opt, options=full)  # collective on 2 ranks
        if rt.is_main:
            torch.save({"step": step, "model": weights, "optimizer": moments}, out / "resumed.pt")
    while step < steps:
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            training.backward(loss)
            assert training.step()
            sched.step()
            step += 1
            losses[str(step)] = gpuscale.all_reduce_sum([loss.item()])[0] / rt.world_size
            ckpt.save(step=step, model=model, optimizer=opt, scheduler=sched, loader=loader, extra={"losses": losses})
            if step == steps:
                break
    final = gpuscale.full_state_dict(model)
    if rt.is_main:
        torch.save(final, out / "final.pt")
        (out / "losses.json").write_text(json.dumps(losses))
'''


def _launch(script, nproc: int, out, steps: int = STEPS):
    if nproc == 1:
        return run([sys.executable, str(script), str(out), str(steps)], timeout=200)
    return run(gpuscale_cmd("run", "--nproc-per-node", str(nproc), str(script), str(out), str(steps)), timeout=200)


def _saved_optimizer(checkpoint) -> dict:
    """The optimizer state in a checkpoint, keyed by parameter name: from the file, or from the directory's shards."""
    if checkpoint.is_dir():
        from gpuscale.runtime.sharded import load_all

        return load_all(checkpoint)["optimizer"]
    numbered = torch.load(checkpoint, weights_only=True)["optimizer"]
    assert numbered["param_groups"][0]["params"] == list(range(len(NAMES)))
    return {"state": {NAMES[pid]: value for pid, value in numbered["state"].items()},
            "param_groups": [{**group, "params": NAMES} for group in numbered["param_groups"]]}


def _saved_model(checkpoint) -> dict:
    if checkpoint.is_dir():
        from gpuscale.runtime.sharded import load_all

        return load_all(checkpoint)["model"]
    return torch.load(checkpoint, weights_only=True)["model"]


def _options(group: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in group.items() if k != "params"}


def _resume_on_other_ranks(tmp_path, written_by: int, resumed_by: int) -> None:
    """Train `written_by` ranks straight through; resume its step-6 checkpoint on `resumed_by` ranks and train on."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert_ok(_launch(script, written_by, straight))
    name = f"step-{SAVED_AT:09d}" + ("" if written_by > 1 else ".pt")
    checkpoint = straight / "ckpt" / name
    (resumed / "ckpt").mkdir(parents=True)
    if checkpoint.is_dir():
        shutil.copytree(checkpoint, resumed / "ckpt" / name)
    else:
        for path in (checkpoint, checkpoint.with_name(name + ".sha256")):
            shutil.copy(path, resumed / "ckpt" / path.name)

    result = _launch(script, resumed_by, resumed)
    assert_ok(result)
    assert f"resumed from {resumed / 'ckpt' / name} (step {SAVED_AT})" in result.stderr + result.stdout

    # right after the resume: the saved step, weights, Adam state and learning rate, bit for bit
    after = torch.load(resumed / "resumed.pt", weights_only=True)
    assert after["step"] == SAVED_AT
    saved_model = _saved_model(checkpoint)
    assert sorted(after["model"]) == sorted(saved_model) == sorted(NAMES)
    for key, tensor in saved_model.items():
        assert torch.equal(after["model"][key], tensor), f"weight {key} differs from the checkpoint's"
    saved = _saved_optimizer(checkpoint)
    assert sorted(after["optimizer"]["state"]) == sorted(NAMES)
    for key in NAMES:
        for slot in ("step", "exp_avg", "exp_avg_sq"):
            got, want = after["optimizer"]["state"][key][slot], saved["state"][key][slot]
            assert torch.equal(got.cpu(), want.cpu()), f"Adam's {slot} of {key} differs from the checkpoint's"
        assert saved["state"][key]["exp_avg"].shape == saved_model[key].shape
    [group] = after["optimizer"]["param_groups"]
    [saved_group] = saved["param_groups"]
    assert group["params"] == saved_group["params"] == NAMES
    # hyperparameters and the scheduler's lr; torch's full-state loader hands tuples (betas) back as lists
    assert _options(group) == _options(saved_group)

    # and training goes on as the uninterrupted run did, up to float rounding across rank counts
    expected = torch.load(straight / "final.pt", weights_only=True)
    final = torch.load(resumed / "final.pt", weights_only=True)
    for key, tensor in expected.items():
        assert torch.allclose(final[key], tensor, atol=1e-5), f"final {key} differs from the uninterrupted run's"
    want_losses = json.loads((straight / "losses.json").read_text())
    got_losses = json.loads((resumed / "losses.json").read_text())
    assert sorted(got_losses, key=int) == [str(s) for s in range(1, STEPS + 1)]
    for s in range(1, SAVED_AT + 1):  # carried in the checkpoint
        assert got_losses[str(s)] == want_losses[str(s)]
    for s in range(SAVED_AT + 1, STEPS + 1):
        assert got_losses[str(s)] == pytest.approx(want_losses[str(s)], rel=1e-4), f"loss of step {s}"


def test_one_process_checkpoint_resumes_on_two_ranks(tmp_path):
    """One process writes the optimizer's own state dict, parameters numbered; 2 ranks load it by name."""
    _resume_on_other_ranks(tmp_path, written_by=1, resumed_by=2)


def test_two_rank_sharded_checkpoint_resumes_on_one_process(tmp_path):
    _resume_on_other_ranks(tmp_path, written_by=2, resumed_by=1)
