"""The Meter's epoch count: the passes of this run that trained a batch."""

from __future__ import annotations

import torch

import gpuscale


def test_a_pass_without_a_batch_is_no_epoch_of_this_run(single_process):
    """A run resumed right after an epoch's last batch passes over that epoch's loader once more and gets nothing:
    the summary's "epochs" counts the passes that trained, here 2, not 3."""
    with gpuscale.init(show_placement=False):
        meter = gpuscale.Meter(gpuscale.plan_batch(2, 1), monitor=False)
        batch = torch.zeros(2, 3)
        for loader in ([], [batch, batch], [batch]):
            for _ in meter.iter(loader):
                pass
        assert meter.epochs == 2 and meter.batches == 3
