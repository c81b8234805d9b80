"""A CIFAR-10 classifier as a LightningModule, trained on every GPU of the node, as Lightning's docs write it.

Launched with `python lightning_docs_classifier.py` (Lightning starts one process per GPU itself) or under
torchrun / srun: the script never reads a rank.
"""

import argparse

import lightning as L
import torch
import torch.nn.functional as F
import torchvision
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from torch.utils.data import DataLoader, random_split


class LitClassifier(L.LightningModule):
    def __init__(self, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.model = torchvision.models.resnet18(num_classes=10)

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        if batch_idx % 100 == 0:
            print(f"batch {batch_idx}: loss {loss.item():.4f}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        val_loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        self.log("val_loss", val_loss, sync_dist=True)
        self.log("val_acc", acc)

    def test_step(self, batch, batch_idx):
        x, y = batch
        acc = (self(x).argmax(dim=1) == y).float().mean()
        self.log("test_acc", acc, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


@rank_zero_only
def describe(trainer):
    print(f"training on {trainer.world_size} processes, {trainer.num_nodes} node(s)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()

    L.seed_everything(42)
    transform = torchvision.transforms.ToTensor()
    full = torchvision.datasets.CIFAR10(args.data, train=True, download=True, transform=transform)
    train_set, val_set = random_split(full, [45000, 5000])
    test_set = torchvision.datasets.CIFAR10(args.data, train=False, download=True, transform=transform)

    model = LitClassifier()
    checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=1)
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="gpu", devices="auto", strategy="ddp", callbacks=[checkpoint])
    describe(trainer)
    trainer.fit(model, DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=4),
                DataLoader(val_set, batch_size=args.batch_size, num_workers=4))
    trainer.test(model, DataLoader(test_set, batch_size=args.batch_size, num_workers=4))
    rank_zero_info(f"best checkpoint: {checkpoint.best_model_path}")
    trainer.save_checkpoint("final.ckpt")
    torch.save(model.model.state_dict(), "resnet18_cifar10.pt")
    print("done")


if __name__ == "__main__":
    main()
