"""DeepSpeed loads its checkpoints with weights_only=False; gpuscale scans them first and refuses code."""

from __future__ import annotations

import os

import pytest
import torch

from gpuscale.strategy.deepspeed import TAG, check_checkpoint_files
from gpuscale.train.checkpoint import consolidate


class Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_planted_payload_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "step-000000001"
    (ckpt / TAG).mkdir(parents=True)
    torch.save({"module": {"w": torch.zeros(2)}, "evil": Payload(str(marker))}, ckpt / TAG / "mp_rank_00_model_states.pt")
    with pytest.raises(ValueError, match=r"names .*system.*refusing to load it"):
        check_checkpoint_files(ckpt)
    with pytest.raises(ValueError, match="refusing to load it"):
        consolidate(ckpt, tmp_path / "model.pt")
    assert not marker.exists()
    assert not (tmp_path / "model.pt").exists()


def test_plain_data_passes_and_missing_files_are_named(tmp_path):
    ckpt = tmp_path / "step-000000001"
    (ckpt / TAG).mkdir(parents=True)
    with pytest.raises(ValueError, match="holds no DeepSpeed checkpoint files"):
        check_checkpoint_files(ckpt)
    torch.save({"module": {"w": torch.zeros(2)}, "ds_version": "0.19", "global_steps": 3}, ckpt / TAG / "mp_rank_00_model_states.pt")
    check_checkpoint_files(ckpt)  # no exception
    (ckpt / TAG / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"\x00truncated")
    with pytest.raises(ValueError, match="cannot be read as a checkpoint"):
        check_checkpoint_files(ckpt)
