"""The sync probe inside `Training` on one process: what it records, and the scripts it must leave alone."""

import pytest
import torch
from torch import nn

import gpuscale
from gpuscale.measure import syncprobe


@pytest.fixture
def record(single_process, monkeypatch):
    monkeypatch.delenv("GPUSCALE_SYNC_PROBE", raising=False)
    saved = (list(syncprobe.RECORD.samples), syncprobe.RECORD.seconds, syncprobe.RECORD.steps, syncprobe.RECORD.unsupported)
    syncprobe.RECORD.samples.clear()
    syncprobe.RECORD.seconds, syncprobe.RECORD.steps, syncprobe.RECORD.unsupported = 0.0, 0, None
    yield syncprobe.RECORD
    syncprobe.RECORD.samples[:] = saved[0]
    syncprobe.RECORD.seconds, syncprobe.RECORD.steps, syncprobe.RECORD.unsupported = saved[1:]


class Twice(nn.Module):
    """A model a script calls twice per micro-batch (a siamese loss): the replay could not repeat it."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(x)


def _train(model, steps, calls_per_batch=1, evaluate_at=()):
    with gpuscale.init():
        plan = gpuscale.plan_batch(8, 1)
        training = gpuscale.setup(model, lambda p: torch.optim.SGD(p, lr=0.1), plan=plan, precision="fp32")
        torch.manual_seed(0)
        for step in range(steps):
            x = torch.randn(8, 4)
            if step in evaluate_at:  # an evaluation pass on a probed step: autocast, no backward
                training.model.eval()
                with torch.no_grad(), training.autocast():
                    training.model(x)
                training.model.train()
            with training.autocast():
                loss = sum(training.model(x).pow(2).mean() for _ in range(calls_per_batch))
            training.backward(loss)
            training.step()
        return training


def test_probed_steps_record_compute_and_an_unsynchronised_wait_of_about_zero(record):
    training = _train(nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 2)), steps=30, evaluate_at=(13,))
    assert [s.step for s in record.samples] == [5, 13, 21, 29]
    assert record.steps == 30 and record.seconds > 0
    for sample in record.samples:
        assert sample.forward_s > 0 and sample.backward_s > 0 and sample.micro_batches == 1
    # nothing left behind: only the trainable-parameter guard of gpuscale.wrap remains
    assert not training.model._forward_hooks and len(training.model._forward_pre_hooks) == 1


def test_a_model_called_twice_per_micro_batch_is_not_probed_and_trains_on(record):
    _train(Twice(), steps=8, calls_per_batch=2)
    assert record.samples == [] and record.steps == 8


def test_the_probe_switch_turns_it_off(record, monkeypatch):
    monkeypatch.setenv("GPUSCALE_SYNC_PROBE", "0")
    _train(nn.Linear(4, 2), steps=8)
    assert record.samples == [] and record.seconds == 0.0
