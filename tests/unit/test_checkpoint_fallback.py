"""An unreadable newest checkpoint is reported and the one before it is used; none readable is an error."""

import logging

import pytest
import torch
from torch import nn

import gpuscale


@pytest.fixture(autouse=True)
def _single_process(single_process):
    """A plain single process (tests/unit/conftest.py)."""


def _train_and_save(ckpt, model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in steps:
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        ckpt.save(step=step, model=model, optimizer=opt)
    return opt


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    with gpuscale.init(show_placement=False):
        torch.manual_seed(0)
        model = nn.Linear(4, 2)
        ckpt = gpuscale.Checkpointer(tmp_path / "ckpt", keep=3)
        _train_and_save(ckpt, model, [1])
        weights_at_1 = {k: v.clone() for k, v in model.state_dict().items()}
        opt = _train_and_save(ckpt, model, [2])
        newest = ckpt.latest()
        newest.write_bytes(newest.read_bytes()[:100])  # a write cut short

        fresh = nn.Linear(4, 2)
        warned = Collect()
        logger = gpuscale.get_logger("checkpoint")
        logger.addHandler(warned)
        try:
            state = ckpt.peek()
            assert state.step == 1 and state.path.name.startswith("step-000000001")
            restored = ckpt.resume(model=fresh, optimizer=torch.optim.SGD(fresh.parameters(), lr=0.1))
        finally:
            logger.removeHandler(warned)
        assert restored.step == 1
        assert all(torch.equal(fresh.state_dict()[k], weights_at_1[k]) for k in weights_at_1)
        # caught by its SHA-256 sum (without sums, torch.load's error would say "may be truncated")
        assert any("skipping step-000000002.pt" in line and "does not match its SHA-256 sum" in line for line in warned.lines), warned.lines
        assert any("resuming from step-000000001.pt, the newest readable checkpoint" in line for line in warned.lines)
        # the node's other ranks find the same and say nothing: one pair of lines per node, not per rank
        other_rank = gpuscale.Checkpointer(tmp_path / "ckpt", keep=3)
        other_rank.rt = type("Rank", (), {"local_rank": 1})()
        warned.lines.clear()
        logger.addHandler(warned)
        try:
            assert other_rank.peek().step == 1
        finally:
            logger.removeHandler(warned)
        assert warned.lines == []
        del opt

        for path in ckpt.checkpoints():
            path.write_bytes(b"not a checkpoint")
        with pytest.raises(ValueError, match="no checkpoint in .* can be read"):
            ckpt.peek()
        # an explicit path is never replaced by another one
        with pytest.raises(ValueError, match="step-000000002"):
            ckpt.peek(newest)


def test_a_flipped_bit_is_caught_by_the_checksum_and_resume_falls_back(tmp_path):
    """torch.load itself loads a checkpoint with a flipped bit in its tensor data; the SHA-256 sum does not."""
    import subprocess

    with gpuscale.init(show_placement=False):
        torch.manual_seed(0)
        model = nn.Linear(4, 1024)
        ckpt = gpuscale.Checkpointer(tmp_path / "ckpt", keep=2)
        _train_and_save(ckpt, model, [1, 2])
        names = sorted(p.name for p in ckpt.directory.iterdir())
        assert names == ["step-000000001.pt", "step-000000001.pt.sha256", "step-000000002.pt", "step-000000002.pt.sha256"]
        # the sums are sha256sum's own format
        check = subprocess.run(["sha256sum", "-c", "step-000000002.pt.sha256"], cwd=ckpt.directory, capture_output=True, text=True)
        assert check.returncode == 0 and "OK" in check.stdout
        _train_and_save(ckpt, model, [3])  # rotation removes step 1 and its sums
        assert sorted(p.name for p in ckpt.directory.iterdir())[:2] == ["step-000000002.pt", "step-000000002.pt.sha256"]

        newest = ckpt.latest()
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0x01  # inside the weights: the zip and the pickle stay readable
        newest.write_bytes(bytes(data))
        assert torch.load(newest, weights_only=True)["step"] == 3  # torch does not notice ...

        warned = Collect()
        logger = gpuscale.get_logger("checkpoint")
        logger.addHandler(warned)
        try:
            assert ckpt.peek().step == 2  # ... gpuscale does, and uses the previous one
            with pytest.raises(ValueError, match="step-000000003.pt is damaged: step-000000003.pt does not match its SHA-256 sum"):
                ckpt.resume(model=nn.Linear(4, 1024), path=newest)  # an explicit path is never swapped
        finally:
            logger.removeHandler(warned)
        assert any("skipping step-000000003.pt" in line and "damaged" in line for line in warned.lines), warned.lines


def test_an_older_checkpoints_loader_position_is_read_with_the_checkpoints_rank_count(tmp_path):
    """A checkpoint of 2 ranks from a gpuscale whose loader state did not say its rank count, resumed on 1 process:
    its position (6 batches of 4 on each of 2 ranks: 48 samples) is read with the checkpoint's 2 ranks, so the epoch
    goes on at sample 48 (12 batches of 4 here), not at 24."""
    from gpuscale.train.checkpoint import write_checksums

    with gpuscale.init(show_placement=False) as rt:
        model = gpuscale.wrap(nn.Linear(4, 2))
        data = torch.utils.data.TensorDataset(torch.arange(128.0))
        loader = gpuscale.make_loader(data, gpuscale.plan_batch(4, 1), rt=rt, seed=1)
        ckpt = gpuscale.Checkpointer(tmp_path / "ckpt")
        path = ckpt.save(step=6, model=model, loader=loader)
        payload = torch.load(path, weights_only=True)
        payload["world_size"], payload["rng"] = 2, payload["rng"] * 2  # as 2 ranks wrote it
        payload["loader"] = {"epoch": 0, "batches_done": 6, "per_device_batch": 4}  # no "world_size": older
        torch.save(payload, path)
        write_checksums(path)
        ckpt.resume(model=model, loader=loader)
        assert loader.batches_done == 12
