"""--lr-scaling keeps dogs-vs-cats' accuracy when the global batch grows 8 times (issue 15, item 3).

Weak scaling on 8 devices trains the example with a global batch of 8 x 32 = 256: 8 times fewer,
larger steps. One process trains with exactly that global batch by gradient accumulation (8
passes of 32 per optimizer step, ``--max-device-batch 32``), so the test needs no 8 devices.
Three runs, default settings otherwise (seed 0, 6 epochs of the head, 2 of fine-tuning):

- the reference: global batch 32, the learning rates as tuned (SGD 0.003, RMSprop 1e-5);
- batch 256 with ``--lr-scaling linear``: both learning rates x 8 (``--lr-base-batch 32``);
- batch 256 with ``--lr-scaling none``: the learning rates of batch 32, as a script without the rule.

A fourth, short run checks that each phase warms its learning rate up (``--lr-warmup-steps``).

Measured on the development machine (2 cores, torch 2.13 CPU), final validation accuracy (1,000
images), seed 0, on 2026-12-01, since every epoch ends on a whole optimizer step (7 a head epoch at
batch 256: of 2,000 images, 62 batches of 32, of which the last 6 are left out). A run is
deterministic for one command; summing the batch of 256 in 1, 2, 8 or 16 passes (--max-device-batch
256, 128, 32, 16) rounds differently, and here each way gave the same accuracy:

    batch 32 (reference; the test's: 1 pass)               0.951
    batch 256, --lr-scaling none  (8 passes)               0.595  (35.6 points lower)
    batch 256, linear, no warm-up  (the test's: 8 passes)  0.932 in 1, 2, 8 and 16 passes (1.9 points lower)
    batch 256, linear, 3 / 7 warm-up steps (8 passes)      0.931 / 0.933  (2.0 / 1.8)
    batch 256, linear, 14 / 28 warm-up steps (8 passes)    0.900 / 0.921 (5.1 / 3.0)

Seeds 1 and 2 (8 passes): batch 32 0.996 / 0.974; none 0.906 / 0.897; linear without warm-up
0.994 / 0.967, with 7 warm-up steps 0.994 / 0.968. Warm-up does not help here: at 8 x 0.003 SGD
does not diverge in its first steps (what Goyal et al.'s warm-up guards against), and with only
42 + 14 steps every step spent below the full rate is missing at the end. So the test runs the
linear rule without warm-up, the simplest setting, within 2 points in every variant measured. Its
margin is thin (1.9 points): with 8 times fewer steps the rule wins back most of the accuracy, not
all of it.
"""

from __future__ import annotations

import json
import sys

import pytest

from procs import EXAMPLES, assert_ok, run

pytestmark = pytest.mark.multiproc
EXAMPLE = str(EXAMPLES / "dogs_vs_cats.py")
LARGE = ["--scaling", "strong", "--batch-size", "256", "--max-device-batch", "32", "--lr-base-batch", "32"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, example_data) -> dict[str, dict]:
    """summary.json of each run: 'reference' (batch 32), 'linear' and 'none' (batch 256), 'warm-up' (3 epochs)."""
    home = example_data
    variants = {
        "reference": [],
        "linear": [*LARGE, "--lr-scaling", "linear", "--lr-warmup-steps", "0"],
        "none": [*LARGE, "--lr-scaling", "none"],
        "warm-up": [*LARGE, "--lr-scaling", "linear", "--lr-warmup-steps", "10", "--epochs", "2", "--finetune-epochs", "1"],
    }
    summaries = {}
    for name, extra in variants.items():
        out = tmp_path_factory.mktemp(name)
        assert_ok(run([sys.executable, EXAMPLE, "--out", str(out), *extra], timeout=600, GPUSCALE_DATA=home, GPUSCALE_MONITOR="0"))
        summaries[name] = json.loads((out / "summary.json").read_text())
    return summaries


def _final(summary: dict) -> float:
    return summary["per_epoch"][-1]["val_accuracy"]


def test_linear_rule_keeps_the_accuracy_of_the_small_batch(runs):
    reference, linear = _final(runs["reference"]), _final(runs["linear"])
    gap = (reference - linear) * 100
    assert gap <= 2.0, f"linear rule at batch 256: {linear:.3f}, batch 32: {reference:.3f}: {gap:.1f} points lower"


def test_without_the_rule_the_large_batch_loses_accuracy(runs):
    reference, linear, none = _final(runs["reference"]), _final(runs["linear"]), _final(runs["none"])
    gap = (reference - none) * 100
    assert gap > 10.0, f"without the rule at batch 256: {none:.3f}, batch 32: {reference:.3f}: only {gap:.1f} points lower"
    assert linear - none > 0.1, f"the linear rule ({linear:.3f}) should win back most of what batch 256 lost ({none:.3f})"


def test_summary_records_the_rule_and_each_epochs_phase(runs):
    linear = runs["linear"]
    assert linear["global_batch"] == 256 and linear["per_device_batch"] == 32 and linear["grad_accum_steps"] == 8
    # 8 epochs of 7 optimizer steps of 8 passes of 32: of an epoch's 62 whole batches (2,000 images: the loader drops the
    # incomplete 63rd) the last 6 would be an incomplete step, and the loader leaves them out too
    assert linear["steps"] == 8 * 7 and linear["samples"] == 8 * 56 * 32 == linear["steps"] * 256
    assert linear["lr"] == {
        "rule": "linear", "base_lr": 0.003, "lr": pytest.approx(0.024), "factor": 8.0, "base_batch": 32,
        "global_batch": 256, "warmup_steps": 0,
        "phases": {"head": {"base_lr": 0.003, "lr": pytest.approx(0.024)},
                   "fine-tune": {"base_lr": 1e-5, "lr": pytest.approx(8e-5)}},
    }
    assert runs["none"]["lr"]["rule"] == "none" and runs["none"]["lr"]["lr"] == 0.003
    assert runs["reference"]["lr"]["factor"] == 1 and runs["reference"]["lr"]["global_batch"] == 32
    for name in ("reference", "linear", "none"):
        summary = runs[name]
        epochs = summary["per_epoch"]
        assert [e["epoch"] for e in epochs] == list(range(1, 9))
        assert [e["phase"] for e in epochs] == ["head"] * 6 + ["fine-tune"] * 2
        assert [e["val_accuracy"] for e in epochs] == summary["history"]["val_accuracy"]
        assert epochs[-1]["val_accuracy"] == summary["accuracy"]
        assert all(0 <= e["train_accuracy"] <= 1 and e["train_loss"] > 0 for e in epochs)
    assert [e["lr"] for e in runs["linear"]["per_epoch"]] == pytest.approx([0.024] * 6 + [8e-5] * 2)
    assert [e["lr"] for e in runs["reference"]["per_epoch"]] == pytest.approx([0.003] * 6 + [1e-5] * 2)


def test_each_phase_warms_its_learning_rate_up(runs):
    """10 warm-up steps, 7 steps per epoch: the lr of each epoch's last step, worked out by hand."""
    warm = runs["warm-up"]
    assert warm["lr"]["warmup_steps"] == 10 and [e["phase"] for e in warm["per_epoch"]] == ["head", "head", "fine-tune"]
    assert [e["lr"] for e in warm["per_epoch"]] == pytest.approx([
        0.003 + (0.024 - 0.003) * 6 / 10,  # head: step 6 of the warm-up
        0.024,                             # head: step 13, warmed up
        1e-5 + (8e-5 - 1e-5) * 6 / 10,     # fine-tuning's new optimizer warms up afresh: its step 6
    ])
