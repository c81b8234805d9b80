"""The dogs-vs-cats example refuses, before any training, options its two phases cannot both honour."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))  # as when the example runs as a script: its parts module sits beside it
_spec = importlib.util.spec_from_file_location("dogs_vs_cats", ROOT / "examples" / "dogs_vs_cats.py")
ex = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ex)


def test_fused_on_is_refused_up_front_when_fine_tuning_would_need_rmsprop(capsys):
    with pytest.raises(SystemExit) as stopped:
        ex.parse_args(["--fused", "on"])
    assert stopped.value.code == 2 and "fine-tuning uses RMSprop, which has no fused kernel" in capsys.readouterr().err
    assert ex.parse_args(["--fused", "on", "--finetune-epochs", "0"]).fused == "on"
    assert ex.parse_args(["--fused", "off", "--loader-workers", "0", "--pin-memory", "off"]).loader_workers == 0


def test_max_device_batch_must_be_positive(capsys):
    with pytest.raises(SystemExit) as stopped:
        ex.parse_args(["--max-device-batch", "0"])
    assert stopped.value.code == 2 and "--max-device-batch must be at least 1" in capsys.readouterr().err
    assert ex.parse_args([]).max_device_batch is None


def test_both_phases_scale_their_learning_rates_by_the_same_rule():
    import gpuscale

    args = ex.parse_args(["--scaling", "strong", "--batch-size", "256", "--max-device-batch", "32", "--lr-base-batch", "32",
                          "--lr-scaling", "linear", "--lr-warmup-steps", "5"])
    plan = gpuscale.plan_batch(args.batch_size, 1, scaling=args.scaling, max_per_device=args.max_device_batch)
    assert (plan.per_device_batch, plan.grad_accum_steps) == (32, 8)
    lrs = ex.phase_lrs(args, plan)
    assert list(lrs) == ["head", "fine-tune"]
    assert lrs["head"].lr == pytest.approx(0.003 * 8) and lrs["fine-tune"].lr == pytest.approx(1e-5 * 8)
    assert lrs["head"].warmup_steps == lrs["fine-tune"].warmup_steps == 5
    unscaled = ex.phase_lrs(ex.parse_args([]), gpuscale.plan_batch(32, 1, scaling="strong"))
    assert (unscaled["head"].rule, unscaled["head"].lr, unscaled["fine-tune"].lr) == ("none", 0.003, 1e-5)


def test_per_epoch_names_each_epochs_phase():
    history = {"train_loss": [0.6, 0.4, 0.2], "train_accuracy": [0.7, 0.8, 0.9], "val_accuracy": [0.75, 0.85, 0.95],
               "lr": [0.01, 0.02, 1e-5]}
    assert ex.per_epoch(history, head_epochs=2) == [
        {"epoch": 1, "phase": "head", "val_accuracy": 0.75, "train_loss": 0.6, "train_accuracy": 0.7, "lr": 0.01},
        {"epoch": 2, "phase": "head", "val_accuracy": 0.85, "train_loss": 0.4, "train_accuracy": 0.8, "lr": 0.02},
        {"epoch": 3, "phase": "fine-tune", "val_accuracy": 0.95, "train_loss": 0.2, "train_accuracy": 0.9, "lr": 1e-5},
    ]
