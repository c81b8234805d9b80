"""Checkpoint, kill, resume: the resumed run ends bit-for-bit where an uninterrupted one does."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from conftest import SCRIPTS, assert_ok, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc
RESUME = str(SCRIPTS / "resume.py")


def _launch(nproc: int, out, *extra: str):
    if nproc == 1:
        return run([sys.executable, RESUME, str(out), *extra], timeout=180)
    return run(gpuscale_cmd("run", "--nproc-per-node", str(nproc), RESUME, str(out), *extra), timeout=180)


@pytest.mark.parametrize("nproc", [1, 2])
def test_resume_after_kill_continues_exactly(tmp_path, nproc):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert_ok(_launch(nproc, straight))

    crashed = _launch(nproc, interrupted, "--crash-at", "7")
    assert crashed.returncode != 0
    assert not (interrupted / "final.pt").exists()
    assert_ok(_launch(nproc, interrupted))

    expected = torch.load(straight / "final.pt", weights_only=True)
    resumed = torch.load(interrupted / "final.pt", weights_only=True)
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), f"{name} differs after resume"
    assert json.loads((interrupted / "losses.json").read_text()) == json.loads((straight / "losses.json").read_text())
    # only the last `keep` checkpoints stay, and no temporary file is left behind
    assert json.loads((interrupted / "checkpoints.json").read_text()) == ["step-000000011.pt", "step-000000012.pt"]
    assert sorted(p.name for p in (interrupted / "ckpt").iterdir()) == ["step-000000011.pt", "step-000000012.pt"]
