"""DDP details a user relies on: re-wrapping after unfreezing, no `module.` prefix, whole-dataset metrics."""

from __future__ import annotations

import sys

import pytest

from procs import SCRIPTS, assert_ok, gpuscale_cmd, read_ranks, run

pytestmark = pytest.mark.multiproc
FINETUNE = str(SCRIPTS / "finetune.py")


@pytest.mark.parametrize("nproc", [1, 2])
def test_unfreeze_refused_until_rewrapped_then_synced(tmp_path, nproc):
    cmd = [sys.executable, FINETUNE, str(tmp_path)] if nproc == 1 else gpuscale_cmd("run", "--nproc-per-node", "2", FINETUNE, str(tmp_path))
    assert_ok(run(cmd, timeout=300))
    ranks = read_ranks(tmp_path, nproc)
    for r in ranks:
        assert r["refused"] and "gpuscale.wrap" in r["refused"] and "0.weight" in r["refused"]
        assert r["grad"] == ranks[0]["grad"], "the newly unfrozen layer's gradients were not synchronised"
        assert r["mean"] == pytest.approx(5.0)
        assert r["keys"] == ["0.bias", "0.weight", "1.bias", "1.weight"]
    # every validation sample seen exactly once over all ranks
    assert sorted(v for r in ranks for v in r["seen"]) == [float(v) for v in range(11)]
    # d/dW0[j,k] of the summed output over 2 rows of (rank + 1)s is 2 (rank + 1) w1[j]; synced, the mean over ranks
    mean_scale = sum(2 * (r + 1) for r in range(nproc)) / nproc
    expected = [mean_scale * w for w in ranks[0]["w1"] for _ in range(4)]
    assert ranks[0]["grad"] == pytest.approx(expected)
