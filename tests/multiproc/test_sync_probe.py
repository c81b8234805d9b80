"""The sync probe measures without touching training: every rank's final weights, buffers, momentum and random
state are bit for bit those of a run without it (2 ranks, DDP, gradient accumulation, BatchNorm and Dropout)."""

from __future__ import annotations

import json

import pytest
import torch

from procs import SCRIPTS, assert_ok, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc


def test_probed_training_is_bit_for_bit_the_unprobed_one(tmp_path):
    finals = {}
    for probe in ("1", "0"):
        out = tmp_path / f"probe{probe}"
        result = run(gpuscale_cmd("run", "--nproc-per-node", "2", str(SCRIPTS / "probe_identity.py"), str(out),
                                  "--max-per-device", "4"), timeout=300, GPUSCALE_SYNC_PROBE=probe, GPUSCALE_MONITOR="0")
        assert_ok(result)
        finals[probe] = [torch.load(out / f"final-rank{r}.pt", weights_only=True) for r in range(2)]
        summary = json.loads((out / "summary.json").read_text())
        if probe == "1":  # steps 5, 13, 21, 29 of 31 were probed (the first dropped as warm-up)
            assert summary["sync_probe"]["status"] == "measured" and summary["sync_probe"]["probes"] == 3
            assert summary["time_split_s"]["probe"] > 0 and summary["step_breakdown_s"]["compute"] > 0
            assert all(r["sync_wait_s"] is not None for r in summary["ranks"])
        else:
            assert summary["sync_probe"]["status"] == "not measured"
            assert summary["sync_probe"]["why"] == "the sync probe is off (GPUSCALE_SYNC_PROBE=0)"
            assert summary["time_split_s"]["exposed_comm"] is None
    for rank, (probed, plain) in enumerate(zip(finals["1"], finals["0"], strict=False)):
        assert probed["state"].keys() == plain["state"].keys()
        for key in plain["state"]:  # running_mean, running_var and num_batches_tracked included
            assert torch.equal(probed["state"][key], plain["state"][key]), (rank, key)
        assert all(torch.equal(a, b) for a, b in zip(probed["momentum"], plain["momentum"], strict=False)), rank
        assert torch.equal(probed["next_random"], plain["next_random"]), rank
