"""An EpochLoop stopped mid-epoch and resumed, on one process: the resumed epoch is known as one (with or without
averages to restore) and its progress line counts the batches before the stop."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""\
    import os, signal, sys
    from pathlib import Path
    import torch, torch.nn.functional as F
    import gpuscale

    out, stop_after, with_average = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "average"
    with gpuscale.init(show_placement=False) as rt:
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
        plan = gpuscale.plan_batch(4, rt.world_size, scaling="strong")
        loader = gpuscale.make_loader(data, plan, seed=3)
        training = gpuscale.setup(torch.nn.Linear(8, 3), lambda p: torch.optim.SGD(p, lr=0.1), plan=plan, precision="fp32")
        loop = gpuscale.EpochLoop(training, loader, epochs=1, checkpoints=out, stop=gpuscale.StopSignal(every=1))
        average = loop.average("loss") if with_average else None
        for _ in loop:
            print("resumed inside the epoch:", loop.resumed_inside_epoch, file=sys.stderr)
            for x, y in loop.batches():
                loss = F.cross_entropy(training.model(x), y)
                training.backward(loss)
                if loop.step() and loop.steps == stop_after:
                    os.kill(os.getpid(), signal.SIGUSR1)
                if average is not None:
                    average.update(loss.detach() * len(y), len(y))
""")


@pytest.mark.parametrize("averages", ["average", "none"])
def test_a_resumed_epoch_is_known_and_its_progress_counts_the_batches_before_the_stop(tmp_path, averages, single_process):
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)

    def run(stop_after: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), str(tmp_path / "ck"), str(stop_after), averages],
                              capture_output=True, text=True, timeout=120)

    stopped = run(12)  # 12 of the epoch's 16 batches, then a stop at the checkpoint
    assert stopped.returncode == 75, stopped.stderr
    resumed = run(0)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed inside the epoch: True" in resumed.stderr
    assert [line.split()[2] for line in resumed.stderr.splitlines() if line.startswith("epoch 1/1 ")] == ["16/16"]


WHOLE_SAMPLES = textwrap.dedent("""\
    import sys
    from pathlib import Path
    import torch, torch.nn.functional as F
    import gpuscale

    with gpuscale.init(show_placement=False) as rt:
        data = torch.utils.data.TensorDataset(torch.randn(40, 8), torch.randint(0, 3, (40,)))
        plan = gpuscale.plan_batch(12, rt.world_size, scaling="strong", max_per_device=4)  # 3 micro-batches a step
        loader = gpuscale.make_loader(data, plan, drop_last=False)  # 10 batches an epoch, the last of 4 samples
        training = gpuscale.setup(torch.nn.Linear(8, 3), lambda p: torch.optim.SGD(p, lr=0.1), plan=plan, precision="fp32")
        loop = gpuscale.EpochLoop(training, loader, epochs=2, checkpoints=Path(sys.argv[1]))
        for _ in loop:
            for x, y in loop.batches():
                training.backward(F.cross_entropy(training.model(x), y))
                loop.step()
        print("steps", loop.steps, file=sys.stderr)
""")


def test_an_epoch_that_ends_inside_accumulation_says_its_checkpoint_misses_gradients(tmp_path, single_process):
    """drop_last=False keeps every sample, so epoch 1 ends 1 micro-batch into a step (10 = 3 x 3 + 1): said once."""
    script = tmp_path / "loop.py"
    script.write_text(WHOLE_SAMPLES)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ck")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("ended inside an optimizer step") == 1, done.stderr
    assert "epoch 1 ended inside an optimizer step (1 of its 3 micro-batches)" in done.stderr
    assert "steps 6" in done.stderr  # 20 micro-batches over 2 epochs: 6 whole steps, the 2 left pending at the end
