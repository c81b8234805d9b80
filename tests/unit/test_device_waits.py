"""gpuscale.measure.device_waits finds, on a CPU, every call that would wait for the GPU, at its file and line: planted calls
are found where they were planted, host-side bookkeeping is not, and gpuscale's own step path (Training, Meter,
Average, EpochLoop, the HF callbacks) makes none."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch

from gpuscale.measure.device_waits import KINDS, find_device_waits

ROOT = Path(__file__).resolve().parents[2]
HERE = "unit/test_device_waits.py"


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _line(marker: str) -> int:
    """The line of this file that holds `marker` in a comment."""
    lines = inspect.getsource(sys.modules[__name__]).splitlines()
    return next(i for i, text in enumerate(lines, start=1) if text.rstrip().endswith(f"# {marker}"))


def _planted_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    flag = torch.tensor([0.0])  # a host-side flag, as StopSignal keeps for gloo
    x = torch.randn(8, 4).to(device)
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss.item()  # item
    x[x > 0]  # boolean index
    loss.detach().tolist()  # tolist
    f"{loss}"  # print
    if loss > 0:  # bool
        pass
    loss.detach().cpu()  # cpu
    torch.nonzero(x)  # nonzero
    bool(flag.item() == 0)  # never reported: the flag lives on the host


def test_every_planted_wait_is_found_at_its_line_and_nothing_else():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    with find_device_waits(model, device=torch.device("cpu")) as found:
        for _ in range(3):
            _planted_step(model, optimizer, torch.device("cpu"))
    sites = {(s["kind"], int(s["where"].rsplit(":", 1)[1])): s["calls"] for s in found.sites()}
    assert all(s["where"].startswith(HERE) and s["function"] == "_planted_step" for s in found.sites())
    expected = {
        (".item() / float() / int() / bool() of a tensor", _line("item")): 3,
        ("boolean indexing", _line("boolean index")): 3,
        (".tolist()", _line("tolist")): 3,
        ("printing a tensor", _line("print")): 3,
        (".item() / float() / int() / bool() of a tensor", _line("bool")): 3,
        (".cpu()", _line("cpu")): 3,
        ("nonzero() / boolean indexing", _line("nonzero")): 3,
    }
    assert sites == expected
    assert found.total() == 21 and {k for k, _ in expected} <= set(KINDS)
    assert not any(hasattr(p, "_gpuscale_device_waits") for p in model.parameters())  # the model left as it was


def test_a_step_without_host_reads_has_none():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    with find_device_waits(model) as found:
        for _ in range(3):
            loss = model(torch.randn(8, 4)).square().mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()  # torch keeps AdamW's step counts on the host (device="cpu"): no wait
            optimizer.zero_grad(set_to_none=True)
    assert found.sites() == []


def _gpuscale_sites(found) -> list[dict]:
    return [s for s in found.sites() if s["where"].startswith("gpuscale/")]


def test_gpuscales_training_meter_average_and_epoch_loop_never_wait(tmp_path):
    """The loop of docs/training.md through setup's Training (with clipping), Meter.iter and EpochLoop with a per-epoch
    Average updated every step: no call in gpuscale reads a device tensor (the grad norm and the average stay on
    the device until asked for)."""
    import gpuscale

    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
    with gpuscale.init() as rt:
        torch.set_num_threads(1)
        plan = gpuscale.plan_batch(8, rt.world_size)
        training = gpuscale.setup(torch.nn.Linear(4, 2), lambda p: torch.optim.AdamW(p, lr=1e-3), plan=plan,
                                  clip_grad_norm=1.0)
        loop = gpuscale.EpochLoop(training, gpuscale.make_loader(data, plan), epochs=1, checkpoints=tmp_path, resume=False)
        average, losses = loop.average("loss"), []
        with find_device_waits(training.model, device=rt.device) as found:
            for _ in loop:
                for x, y in loop.batches():
                    with training.autocast():
                        loss = torch.nn.functional.mse_loss(training.model(x), y)
                    training.backward(loss)
                    loop.step()
                    average.update(loss.detach() * len(x), len(x))
                    losses.append(loss.detach())
        assert _gpuscale_sites(found) == [], found.sites()
        # read when asked, after the steps: the same values as summed on the host
        assert average.count == 64 and average.total == pytest.approx(sum(8 * float(v) for v in losses))
        assert training.grad_norm is not None and training.grad_norm > 0


def test_the_hf_callbacks_never_wait():
    """MeterCallback and StopCallback in a Trainer's steps make no device wait."""
    pytest.importorskip("transformers")
    from transformers import Trainer, TrainingArguments

    import gpuscale
    from gpuscale.integrations.hf import MeterCallback, StopCallback, trainer_arguments

    class Regression(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.linear(x), labels)}

    rows = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(64)]
    with gpuscale.init() as rt:
        plan = gpuscale.plan_batch(8, rt.world_size)
        model = Regression()
        meter = gpuscale.Meter(plan, monitor=False)
        args = TrainingArguments(output_dir="/tmp/gpuscale-device-waits", report_to=[], max_steps=6, save_strategy="no",
                                 logging_steps=100, disable_tqdm=True, logging_nan_inf_filter=False, **trainer_arguments(plan))
        trainer = Trainer(model=model, args=args, train_dataset=rows,
                          callbacks=[MeterCallback(meter), StopCallback(gpuscale.StopSignal())])
        with find_device_waits(model, device=rt.device) as found:
            trainer.train()
    assert meter.steps == 6
    assert _gpuscale_sites(found) == [], found.sites()
