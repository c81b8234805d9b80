"""A PyTorch Lightning training script (test client).

Written the way the Lightning documentation writes it: a ``LightningModule``
with ``training_step`` / ``validation_step`` / ``configure_optimizers``, plain
DataLoaders, and a ``Trainer`` with the DDP strategy that does the rest.  It
knows nothing of whoever launches or measures it.

The data are synthetic and deterministic (fixed seed): 256 features, 10
classes, labelled by a fixed random linear "teacher"; a validation set a
quarter the size of the training set gives an evaluation pass every epoch.

Run it (``--devices`` x ``--num-nodes`` must equal the number of processes
the launcher starts, as in Lightning's torchrun recipe):

    python tests/clients/lightning_script.py --epochs 1
    torchrun --standalone --nproc-per-node 2 tests/clients/lightning_script.py --devices 2 --batch-size 16 --epochs 2 --samples 2048

At the end every rank prints one line:

    CLIENT rank=<global rank> world_size=<world size> steps=<trainer.global_step> samples=<training samples> train_s=<seconds>

where samples counts the batch lengths seen by ``training_step`` on that rank
(validation batches are not counted), and train_s is the rank's own training
time as a ``Callback`` times it with ``time.perf_counter``: from the start of
the first training epoch to the end of the last training batch, less the
validation loops that ran in between (the sanity check comes before, the last
epoch's validation after).
"""

import argparse
import sys
import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

IN_FEATURES = 256
HIDDEN = 1536  # ~9 ms per optimizer step at batch 16 on one CPU core
CLASSES = 10
SEED = 0


def parse_args():
    parser = argparse.ArgumentParser(description="Lightning test client")
    parser.add_argument("--batch-size", type=int, default=16, help="per-device batch size")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048, help="training set size")
    parser.add_argument("--devices", type=int, default=1, help="processes per node")
    parser.add_argument("--num-nodes", type=int, default=1)
    return parser.parse_args()


def make_dataset(n, seed):
    gen = torch.Generator().manual_seed(SEED)
    teacher = torch.randn(IN_FEATURES, CLASSES, generator=gen)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN_FEATURES, generator=gen)
    y = (x @ teacher).argmax(dim=1)
    return TensorDataset(x, y)


class Classifier(L.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(IN_FEATURES, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, CLASSES),
        )
        self.train_samples = 0

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.train_samples += x.shape[0]
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("val_loss", loss, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class TrainingTime(L.Callback):
    """Times the training: first training epoch's start .. last training batch's end, less validation."""

    def __init__(self):
        self.start = self.end = None
        self.validations = []  # (start, end) of every validation loop

    def on_train_epoch_start(self, trainer, pl_module):
        if self.start is None:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.end = time.perf_counter()

    def on_validation_start(self, trainer, pl_module):
        self.validations.append((time.perf_counter(), None))

    def on_validation_end(self, trainer, pl_module):
        self.validations[-1] = (self.validations[-1][0], time.perf_counter())

    @property
    def seconds(self):
        inside = sum(max(0.0, min(end, self.end) - max(start, self.start)) for start, end in self.validations)
        return self.end - self.start - inside


def main():
    args = parse_args()
    L.seed_everything(SEED, verbose=False)

    train_loader = DataLoader(make_dataset(args.samples, seed=1), batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(make_dataset(max(1, args.samples // 4), seed=2), batch_size=args.batch_size)

    model = Classifier()
    timer = TrainingTime()
    trainer = L.Trainer(
        accelerator="auto",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp",
        max_epochs=args.epochs,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader)

    # One write call, so lines from concurrent ranks never interleave.
    sys.stdout.write(
        f"CLIENT rank={trainer.global_rank} world_size={trainer.world_size} "
        f"steps={trainer.global_step} samples={model.train_samples} train_s={timer.seconds:.4f}\n"
    )
    sys.stdout.flush()

    # Lightning keeps its process group alive after fit() (so test() or
    # predict() could follow).  Tear it down ourselves: left to interpreter
    # exit, gloo on CPU aborts now and then ("terminate called without an
    # active exception").
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
