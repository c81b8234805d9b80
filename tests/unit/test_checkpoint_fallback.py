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
        assert any("skipping step-000000002.pt" in line and "may be truncated" in line for line in warned.lines), warned.lines
        assert any("resuming from step-000000001.pt, the newest readable checkpoint" in line for line in warned.lines)
        del opt

        for path in ckpt.checkpoints():
            path.write_bytes(b"not a checkpoint")
        with pytest.raises(ValueError, match="no checkpoint in .* can be read"):
            ckpt.peek()
        # an explicit path is never replaced by another one
        with pytest.raises(ValueError, match="step-000000002"):
            ckpt.peek(newest)
