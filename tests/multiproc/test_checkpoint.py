"""Checkpoint, kill, resume: the resumed run ends bit-for-bit where an uninterrupted one does."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from procs import SCRIPTS, assert_ok, free_port, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc
RESUME = str(SCRIPTS / "resume.py")


def _launch(nproc: int, out, *extra: str):
    if nproc == 1:
        return run([sys.executable, RESUME, str(out), *extra], timeout=400)
    return run(gpuscale_cmd("run", "--nproc-per-node", str(nproc), RESUME, str(out), *extra), timeout=400)


STRATEGY_ARGS = {
    "ddp": ["--strategy", "ddp"],
    "fsdp": ["--strategy", "fsdp"],
    "zero1": ["--strategy", "deepspeed", "--zero-stage", "1"],
    "zero2": ["--strategy", "deepspeed", "--zero-stage", "2"],
    "zero3": ["--strategy", "deepspeed", "--zero-stage", "3"],
}
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")


@pytest.mark.parametrize("nproc, strategy", [
    (1, "ddp"), (2, "ddp"), (2, "fsdp"),
    pytest.param(1, "zero2", marks=needs_deepspeed),
    pytest.param(2, "zero2", marks=needs_deepspeed),
    pytest.param(2, "zero3", marks=needs_deepspeed),
])
def test_resume_after_kill_continues_exactly(tmp_path, nproc, strategy):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    args = STRATEGY_ARGS[strategy]
    assert_ok(_launch(nproc, straight, *args))

    crashed = _launch(nproc, interrupted, "--crash-at", "7", *args)
    assert crashed.returncode != 0
    assert not (interrupted / "final.pt").exists()
    assert_ok(_launch(nproc, interrupted, *args))

    expected = torch.load(straight / "final.pt", weights_only=True)
    resumed = torch.load(interrupted / "final.pt", weights_only=True)
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), f"{name} differs after resume"
    assert json.loads((interrupted / "losses.json").read_text()) == json.loads((straight / "losses.json").read_text())
    # only the last `keep` checkpoints stay, and no temporary file is left behind; fsdp writes sharded directories
    sharded = (nproc, strategy) == (2, "fsdp") or strategy.startswith("zero")
    names = ["step-000000011", "step-000000012"] if sharded else ["step-000000011.pt", "step-000000012.pt"]
    assert json.loads((interrupted / "checkpoints.json").read_text()) == names
    sums = [] if sharded else [name + ".sha256" for name in names]  # a sharded directory holds its SHA256SUMS
    assert sorted(p.name for p in (interrupted / "ckpt").iterdir()) == sorted(names + sums)
    if strategy == "fsdp":
        shards = sorted(p.name for p in (interrupted / "ckpt" / names[-1]).iterdir())
        assert shards == [".metadata", "SHA256SUMS", "__0_0.distcp", "__1_0.distcp", "gpuscale.pt"], shards
        # a flipped bit in one rank's shard is caught: the directory is refused, the one before it is used
        import shutil

        from gpuscale.train.checkpoint import Checkpointer
        damaged = shutil.copytree(interrupted / "ckpt" / names[-1], tmp_path / "damaged")
        data = bytearray((damaged / "__1_0.distcp").read_bytes())
        data[len(data) // 2] ^= 0x01
        (damaged / "__1_0.distcp").write_bytes(bytes(data))
        with pytest.raises(ValueError, match="__1_0.distcp does not match its SHA-256 sum"):
            Checkpointer._load(damaged)
        assert Checkpointer._load(interrupted / "ckpt" / names[-1])["step"] == 12
    if strategy.startswith("zero"):  # DeepSpeed's format: one optimizer partition per rank
        partitions = sorted(p.name for p in (interrupted / "ckpt" / names[-1] / "deepspeed").glob("*optim_states.pt"))
        assert len(partitions) == nproc, partitions

    # any checkpoint consolidates into the plain state dict the run ended with
    consolidated = tmp_path / "model.pt"
    assert_ok(run(gpuscale_cmd("consolidate", str(interrupted / "ckpt" / names[-1]), str(consolidated)), timeout=200))
    plain = torch.load(consolidated, weights_only=True)
    assert sorted(plain) == sorted(expected)
    for name in expected:
        assert torch.equal(plain[name], expected[name]), f"consolidated {name} differs"


@pytest.mark.parametrize("strategies", [
    ["ddp", "fsdp"],
    pytest.param(["zero1", "zero2", "zero3"], marks=needs_deepspeed, id="deepspeed"),
])
def test_strategies_train_the_same_model_with_the_same_global_batch(tmp_path, strategies):
    """Strong-scaling equivalence: 1 process and 2 processes with each strategy take the same steps.

    Global batch 8 either way, and the two ranks' shards of each step together are exactly the
    one-process batch, so without dropout the runs agree up to float rounding: weights within
    atol 1e-5, losses within rel 1e-4 after 6 Adam steps (a lr schedule included).
    """
    weights, losses = {}, {}
    for nproc, strategy in ((1, "ddp"), *((2, s) for s in strategies)):
        out = tmp_path / f"{nproc}-{strategy}"
        assert_ok(_launch(nproc, out, *STRATEGY_ARGS[strategy], "--steps", "6", "--dropout", "0"))
        weights[(nproc, strategy)] = torch.load(out / "final.pt", weights_only=True)
        losses[(nproc, strategy)] = json.loads((out / "losses.json").read_text())
    reference = weights[(1, "ddp")]
    for key in ((2, s) for s in strategies):
        for name, tensor in reference.items():
            assert torch.allclose(weights[key][name], tensor, atol=1e-5), f"{key}: {name} differs from one process"
        for step, loss in losses[(1, "ddp")].items():
            assert losses[key][step] == pytest.approx(loss, rel=1e-4), f"{key}: loss of step {step}"


def test_max_restarts_restarts_the_group_from_the_last_checkpoint(tmp_path):
    """torchrun's elastic restart: rank processes die after step 7's checkpoint, the group restarts, resumes, and
    ends where an uninterrupted run ends; without restarts the same crash fails the run."""
    straight, restarted, failed = tmp_path / "straight", tmp_path / "restarted", tmp_path / "failed"
    assert_ok(_launch(2, straight))
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "--max-restarts", "2", RESUME, str(restarted), "--crash-at", "7"), timeout=400)
    assert_ok(result)
    # rank 0 of the restarted group says so, once (torchrun itself says it only at INFO)
    assert result.stderr.count("torchrun restarted the workers after a failure (restart 1 of at most 2)") == 1, result.stderr[-2000:]
    expected = torch.load(straight / "final.pt", weights_only=True)
    resumed = torch.load(restarted / "final.pt", weights_only=True)
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), f"{name} differs after an elastic restart"
    assert json.loads((restarted / "losses.json").read_text()) == json.loads((straight / "losses.json").read_text())

    crashed = run(gpuscale_cmd("run", "--nproc-per-node", "2", "--max-restarts", "0", RESUME, str(failed), "--crash-at", "7"), timeout=400)
    assert crashed.returncode == 17 and not (failed / "final.pt").exists()


@needs_deepspeed
def test_consolidate_takes_a_checkpoint_deepspeed_itself_wrote(tmp_path):
    """The HF Trainer's checkpoint-N under DeepSpeed is DeepSpeed's own save_checkpoint: a `latest` file naming its
    global_stepN folder. consolidate takes that folder or the global_stepN inside it, and gives the weights the
    engine's module held when it saved, exactly."""
    checkpoint, weights = tmp_path / "checkpoint-2", tmp_path / "weights.pt"
    assert_ok(run([sys.executable, str(SCRIPTS / "deepspeed_native_save.py"), str(checkpoint), str(weights)], timeout=200,
                  RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())))
    expected = torch.load(weights, weights_only=True)
    for source in (checkpoint, checkpoint / "global_step2"):
        out = tmp_path / f"{source.name}.pt"
        assert_ok(run(gpuscale_cmd("consolidate", str(source), str(out)), timeout=200))
        plain = torch.load(out, weights_only=True)
        assert sorted(plain) == sorted(expected)
        for name, tensor in expected.items():
            assert torch.equal(plain[name], tensor), f"{source.name}: {name} differs"
