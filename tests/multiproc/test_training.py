"""gpuscale.setup: gradient accumulation, clipping, mixed precision and evaluation under every strategy.

Two real processes on gloo against one process with the whole global batch per step.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from procs import SCRIPTS, assert_ok, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc
SCRIPT = str(SCRIPTS / "accumulate.py")
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
STRATEGIES = {
    "ddp": ["--strategy", "ddp"],
    "fsdp": ["--strategy", "fsdp"],
    "zero2": ["--strategy", "deepspeed", "--zero-stage", "2"],
    "zero3": ["--strategy", "deepspeed", "--zero-stage", "3"],
}


def _train(out, nproc: int, *args: str):
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, SCRIPT, str(out), *args] if nproc == 1 else gpuscale_cmd("run", "--nproc-per-node", str(nproc), SCRIPT, str(out), *args)
    result = run(cmd, timeout=300)
    return result


def _result(out) -> tuple[dict, dict]:
    return json.loads((out / "result.json").read_text()), torch.load(out / "final.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, the whole global batch of 8 in one pass, gradients clipped at 0.5."""
    out = tmp_path_factory.mktemp("reference")
    assert_ok(_train(out, 1, "--clip", "0.5"))
    return _result(out)


@pytest.mark.parametrize("strategy", [
    "ddp", "fsdp", pytest.param("zero2", marks=needs_deepspeed), pytest.param("zero3", marks=needs_deepspeed),
])
def test_accumulated_micro_batches_on_two_ranks_equal_one_big_batch(tmp_path, reference, strategy):
    """2 ranks x 2 micro-batches of 2 = 8: the same steps, clipped norms and weights as one pass of 8."""
    run = _train(tmp_path, 2, *STRATEGIES[strategy], "--max-per-device", "2", "--clip", "0.5")
    assert_ok(run)
    output = run.stdout + run.stderr
    result, weights = _result(tmp_path)
    expected, expected_weights = reference
    assert result["plan"] == {"scaling": "strong", "world_size": 2, "global_batch": 8, "per_device_batch": 2, "grad_accum_steps": 2}
    assert len(result["losses"]) == 4  # 32 samples / 8 per step
    assert result["losses"] == pytest.approx(expected["losses"], rel=1e-4)
    assert result["grad_norms"] == pytest.approx(expected["grad_norms"], rel=1e-4), "the clipped norm is the global batch's"
    assert all(norm > 0.5 for norm in result["grad_norms"]), "the test must actually clip"
    for name, tensor in expected_weights.items():
        assert torch.allclose(weights[name].float(), tensor, atol=1e-5), f"{strategy}: {name}"
    assert result["eval_samples"] == 5, "the padded evaluation shards count each of the 5 samples once"
    if strategy == "ddp":  # one bucket (a small model): one all-reduce per step, none for the first micro-batch
        assert result["ddp_allreduces"] == 4, result["ddp_allreduces"]
    # no warning comes back step after step (DeepSpeed's CPU accelerator ran numactl at each ZeRO-3 step without
    # LOCAL_SIZE, and each subprocess made Python show its deprecation warnings again): at most once per rank
    warnings = [line for line in output.splitlines() if "Warning: " in line]
    assert all(warnings.count(line) <= 2 for line in warnings), "\n".join(warnings)


@pytest.mark.parametrize("strategy, precision", [
    ("ddp", "bf16"), ("fsdp", "bf16"), pytest.param("zero2", "bf16", marks=needs_deepspeed), ("ddp", "fp16"),
])
def test_mixed_precision_trains_close_to_fp32(tmp_path, reference, strategy, precision):
    """bf16 (and fp16 with loss scaling) follow the fp32 run within their rounding."""
    assert_ok(_train(tmp_path, 2, *STRATEGIES[strategy], "--precision", precision, "--clip", "0.5"))
    result, _ = _result(tmp_path)
    assert result["precision"] == precision
    losses = result["losses"]
    if precision == "fp16":
        # The dynamic scaler starts at 2**16, overflows on the first step and skips it (norm inf), then trains.
        assert result["grad_norms"][0] == float("inf") and all(n < float("inf") for n in result["grad_norms"][1:])
        assert losses[-1] < losses[0]
    else:
        assert losses == pytest.approx(reference[0]["losses"], rel=0.03)


def test_uneven_evaluation_under_fsdp_is_refused_instead_of_hanging(tmp_path):
    """5 evaluation samples on 2 ranks in batches of 2: rank 0 runs 2 batches, rank 1 runs 1; under
    FSDP rank 0's second forward pass would wait forever for rank 1 without the check."""
    result = _train(tmp_path, 2, "--strategy", "fsdp", "--eval-uneven")
    assert result.returncode != 0
    assert "make_loader(..., train=False, even=True)" in result.stderr


@needs_deepspeed
def test_deepspeed_on_one_process_under_a_launcher_trains_as_it_does_alone(tmp_path, reference):
    """A study's baseline: `gpuscale run --nproc-per-node 1` (torchrun underneath) with ZeRO-2. gpuscale starts the
    one-rank group DeepSpeed needs; under torchrun's agent a tcp:// rendezvous would wait for the agent's store,
    which never answers (it hung until the 600 s rendezvous timeout). The same steps as the plain process's."""
    result = run(gpuscale_cmd("run", "--nproc-per-node", "1", SCRIPT, str(tmp_path), *STRATEGIES["zero2"], "--clip", "0.5"),
                 timeout=120)
    assert_ok(result)
    losses = json.loads((tmp_path / "result.json").read_text())["losses"]
    assert losses == pytest.approx(reference[0]["losses"], rel=1e-4)


@needs_deepspeed
def test_deepspeed_fp16_on_cpu_is_refused_in_one_line(tmp_path):
    result = _train(tmp_path, 1, "--strategy", "deepspeed", "--precision", "fp16")
    assert result.returncode != 0
    assert "DeepSpeed runs fp16 only on GPUs; use --precision bf16 or fp32 on CPU" in result.stderr


def test_fused_optimizer_and_compiled_ddp_take_the_same_steps(tmp_path, reference):
    """gpuscale's speed switches change kernels, not numbers: a fused SGD and a compiled DDP model (the
    aot_eager backend: no C compiler needed) with gradient accumulation on 2 ranks match one plain pass of 8."""
    assert_ok(_train(tmp_path, 2, "--strategy", "ddp", "--max-per-device", "2", "--clip", "0.5", "--fused", "on", "--compile", "aot_eager"))
    result, weights = _result(tmp_path)
    assert result["fused"] and result["compiled"], "both switches must really be on"
    assert result["losses"] == pytest.approx(reference[0]["losses"], rel=1e-4)
    for name, tensor in reference[1].items():
        assert torch.allclose(weights[name].float(), tensor, atol=1e-5), name
    assert result["ddp_allreduces"] == 4, "the compiled model still skips the all-reduce of the first micro-batch"


@pytest.mark.parametrize("nproc", [1, 2])
def test_metrics_reduce_floats_tensors_and_a_1d_tensor_to_floats(tmp_path, nproc):
    """Rank r gives (r + 1, 10 (r + 1)): over 2 ranks the sums are (3, 30) and the maxima (2, 20); one process keeps
    its own (1, 10). Every form gives plain floats, and no warning (the script turns warnings into errors)."""
    script = str(SCRIPTS / "reduce_values.py")
    cmd = [sys.executable, script, str(tmp_path)] if nproc == 1 else gpuscale_cmd("run", "--nproc-per-node", "2", script, str(tmp_path))
    assert_ok(run(cmd, timeout=120))
    found = json.loads((tmp_path / "reduced.json").read_text())
    expected = {"sum": [3.0, 30.0], "max": [2.0, 20.0]} if nproc == 2 else {"sum": [1.0, 10.0], "max": [1.0, 10.0]}
    assert found["reduced"] == {"floats": expected, "tensors": expected, "one_d": expected} and found["kinds"] == ["float"]
