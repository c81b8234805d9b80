"""The ViT example trains the same model under ddp, fsdp and deepspeed on 2 processes.

Same seed, same global batch, same ranks, fp32: the strategies differ only in where parameters,
gradients and optimizer states live, so the final losses agree to float rounding (rel 1e-3, the
tolerance the issue's "within tolerance" is held to here; measured agreement is 4 decimals).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from gpuscale.measure.metrics import SUMMARY_KEYS

from procs import EXAMPLES, assert_ok, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc
EXAMPLE = str(EXAMPLES / "vit.py")
EPOCHS = "2"


@pytest.fixture(scope="module")
def data_home(example_data):
    return example_data


def _run(out, data_home, *args: str):
    return run(gpuscale_cmd("run", "--nproc-per-node", "2", EXAMPLE, "--out", str(out), "--epochs", EPOCHS, *args),
               timeout=600, GPUSCALE_DATA=data_home)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
def test_strategies_reach_the_same_loss(tmp_path, data_home):
    summaries = {}
    for strategy in ("ddp", "fsdp", "deepspeed"):
        result = _run(tmp_path / strategy, data_home, "--strategy", strategy)
        assert_ok(result)
        summary = json.loads((tmp_path / strategy / "summary.json").read_text())
        assert not [key for key in SUMMARY_KEYS if key not in summary]
        assert summary["strategy"] == strategy and summary["world_size"] == 2
        assert summary["global_batch"] == 64 and summary["per_device_batch"] == 32  # weak scaling, as the course
        assert summary["epochs"] == 2 and len(summary["history"]["epoch_time_s"]) == 2
        accuracy = summary["history"]["val_accuracy"]
        assert accuracy[1] > accuracy[0] + 0.1, f"{strategy}: validation accuracy did not rise: {accuracy}"
        summaries[strategy] = summary
        assert result.stderr.count("epoch 2/2: train loss") == 1, "epoch lines come from rank 0 only"

    assert summaries["deepspeed"]["zero_stage"] == 1  # the course's ZeRO stage by default
    reference = summaries["ddp"]
    for strategy in ("fsdp", "deepspeed"):
        got = summaries[strategy]
        assert got["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-3), strategy
        assert got["val_loss"] == pytest.approx(reference["val_loss"], rel=1e-3), strategy
        assert got["accuracy"] == pytest.approx(reference["accuracy"], abs=0.01), strategy
    # every sample of the validation set counted once, padding excluded, under every strategy:
    # accuracies are multiples of 1/400 (the offline set's 400 validation images)
    for summary in summaries.values():
        assert abs(summary["accuracy"] * 400 - round(summary["accuracy"] * 400)) < 1e-6


def test_course_deepspeed_config_with_a_wrong_batch_is_refused(tmp_path, data_home):
    """docs/classic-bugs.md, bug 5: train_batch_size 32 in the config, 32 per rank on 2 ranks in the loader."""
    pytest.importorskip("deepspeed")
    config = tmp_path / "ds_config.json"
    config.write_text('{\n  "train_batch_size": 32,\n  "zero_optimization": {"stage": 1},\n}\n')  # hjson: trailing comma
    result = _run(tmp_path / "out", data_home, "--strategy", "deepspeed", "--ds-config", str(config))
    assert result.returncode == 2, result.stderr[-2000:]
    # once, in the line of the rank that said it (each rank refused it; gpuscale.init() told it, the example adds nothing)
    errors = [line for line in result.stdout.splitlines() + result.stderr.splitlines() if "train_batch_size=32" in line]
    assert len(errors) == 1 and "train_batch_size=32 (the loader gives 64)" in errors[0], result.stdout + result.stderr[-2000:]
    assert errors[0].startswith("[gpuscale] rank ") and "/2 on " in errors[0]
    assert not (tmp_path / "out" / "summary.json").exists()
