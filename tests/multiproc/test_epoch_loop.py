"""gpuscale.EpochLoop on 2 ranks: a run stopped in the middle of an epoch and resumed ends exactly like one never stopped."""

from __future__ import annotations

import json

import pytest
import torch

from procs import SCRIPTS, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc
SCRIPT = str(SCRIPTS / "epoch_loop.py")


def _run(out, *extra: str, nproc: int = 2):
    return run(gpuscale_cmd("run", "--nproc-per-node", str(nproc), SCRIPT, str(out), *extra), timeout=300, GPUSCALE_MONITOR="0")


def test_a_stop_mid_epoch_resumes_to_the_same_weights_history_and_schedule(tmp_path):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    first = _run(whole)
    assert first.returncode == 0, first.stderr[-3000:]
    # 96 samples / 16 per step = 6 steps an epoch: stop after step 8, two steps into the second epoch
    halted = _run(stopped, "--stop-after-step", "8")
    assert halted.returncode == 75, halted.stderr[-3000:]
    saved = sorted((stopped / "checkpoints").iterdir())
    assert saved and not (stopped / "final.pt").exists()
    resumed = _run(stopped)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = (torch.load(d / "final.pt", weights_only=True) for d in (whole, stopped))
    assert a["steps"] == b["steps"] == 18 and a["lr"] == b["lr"]
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    # the second epoch's mean includes the two steps before the stop, restored from the checkpoint's running sums
    assert b["history"] == pytest.approx(a["history"], rel=1e-6) and len(b["history"]) == 3


def test_a_run_resumed_at_an_epochs_end_inside_accumulation_ends_like_one_never_stopped(tmp_path):
    """104 samples: 13 micro-batches of 4 a rank an epoch, 2 a step. The epoch ends on a whole step (6 steps, the 13th
    micro-batch left out), so the checkpoint at its end holds everything a resumed run needs: 1 epoch and then 2 end
    with the weights of 2 at once. Before, the 13th micro-batch's gradients crossed into the next epoch, and the
    resumed run took one step fewer, on other weights."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert _run(whole, "--epochs", "2", "--samples", "104").returncode == 0
    assert _run(split, "--epochs", "1", "--samples", "104").returncode == 0
    resumed = _run(split, "--epochs", "2", "--samples", "104")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    a, b = (torch.load(d / "final.pt", weights_only=True) for d in (whole, split))
    assert a["steps"] == b["steps"] == 12
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key


def test_a_finished_run_trains_nothing_again(tmp_path):
    out = tmp_path / "run"
    assert _run(out).returncode == 0
    before = torch.load(out / "final.pt", weights_only=True)
    measured = json.loads((out / "summary.json").read_text())
    again = _run(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "holds a finished run of 3 epoch(s)" in again.stderr
    after = torch.load(out / "final.pt", weights_only=True)
    assert after["history"] == before["history"] and after["steps"] == before["steps"]
    # the run that trained nothing keeps the measurement of the one that trained, and says so
    assert json.loads((out / "summary.json").read_text()) == measured and measured["steps"] == 18
    assert f"took no optimizer step: kept {out / 'summary.json'}" in again.stderr
    # on another number of ranks it resumes the same finished run: the 2 ranks' measurement is not written over
    elsewhere = _run(out, nproc=1)
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text()) == measured
    assert "stays the summary of the run that trained (world_size 2, not 1; grad_accum_steps 2, not 4)" in elsewhere.stderr
