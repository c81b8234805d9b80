"""A Lightning script that relies on Lightning's SLURM auto-requeue, written as Lightning's documentation writes it:
``Trainer(plugins=[SLURMEnvironment(auto_requeue=True)])``, nothing of gpuscale. On SIGUSR1 Lightning saves
``hpc_ckpt_<n>.ckpt`` in the Trainer's root folder and rank 0 runs ``scontrol requeue``; a requeued run resumes
from that checkpoint by itself.

argv: ROOT (the Trainer's default_root_dir) [--devices N --num-nodes M]. It writes ROOT/progress (the global step)
as it trains, slowly enough for a test to send the signal mid-run.
"""

import argparse
import signal
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.environments import SLURMEnvironment
from torch.utils.data import DataLoader, TensorDataset


class Slow(L.LightningModule):
    def __init__(self, root: Path):
        super().__init__()
        self.root = root
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        time.sleep(0.2)
        if self.global_rank == 0:
            (self.root / "progress").write_text(str(self.global_step))
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    data = TensorDataset(torch.randn(4096, 8), torch.randint(0, 2, (4096,)))
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy="ddp", max_epochs=1,
                        default_root_dir=str(args.root), enable_progress_bar=False, logger=False,
                        plugins=[SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1)])
    trainer.fit(Slow(args.root), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
