"""Fashion-MNIST with an MLP on gpuscale (`gpuscale run --nproc-per-node 4 gpuscale_fashion_mlp.py`).

A held-out 10% of the training images picks the best epoch; the test set is scored at the end.
"""
import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import random_split
from torchvision import datasets, transforms

import gpuscale

log = gpuscale.get_logger("fashion")


def build_model(hidden):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, hidden), torch.nn.ReLU(),
                               torch.nn.Dropout(0.2), torch.nn.Linear(hidden, 10))


def evaluate(training, loader, device):
    loss, acc = gpuscale.Average(), gpuscale.Average()
    training.model.eval()
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = training.model(x)
            loss.update(F.cross_entropy(logits, y, reduction="sum"), len(y))
            acc.update((logits.argmax(1) == y).sum(), len(y))
    training.model.train()
    return loss.compute(), acc.compute()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="~/.cache/fashion")
    parser.add_argument("--batch-size", type=int, default=256, help="global")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/fashion")
    args = parser.parse_args()

    with gpuscale.init() as rt:
        tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.286,), (0.353,))])
        full = datasets.FashionMNIST(Path(args.data).expanduser(), train=True, download=False, transform=tf)
        test = datasets.FashionMNIST(Path(args.data).expanduser(), train=False, download=False, transform=tf)
        n_val = len(full) // 10
        train_set, val_set = random_split(full, [len(full) - n_val, n_val])
        plan = gpuscale.plan_batch(args.batch_size, rt.world_size, scaling="strong")
        train_loader = gpuscale.make_loader(train_set, plan, seed=args.seed)
        val_loader = gpuscale.make_loader(val_set, plan, train=False)
        test_loader = gpuscale.make_loader(test, plan, train=False)

        torch.manual_seed(args.seed)
        training = gpuscale.setup(build_model(args.hidden), lambda p: torch.optim.Adam(p, lr=args.lr), plan=plan)
        checkpoints = gpuscale.Checkpointer(Path(args.out) / "checkpoints")
        best = 0.0
        for epoch in range(args.epochs):
            train_loss = gpuscale.Average()
            for x, y in train_loader:
                x, y = x.to(rt.device), y.to(rt.device)
                loss = F.cross_entropy(training.model(x), y)
                training.backward(loss)
                training.step()
                train_loss.update(loss.detach() * len(y), len(y))
            val_loss, val_acc = evaluate(training, val_loader, rt.device)
            log.info("epoch %d: train loss %.4f, val loss %.4f, val accuracy %.4f",
                     epoch, train_loss.compute(), val_loss, val_acc)
            if val_acc > best:
                best = val_acc
                checkpoints.save(step=epoch, model=training.model, optimizer=training.optimizer)
            print(f"epoch {epoch} done")
        test_loss, test_acc = evaluate(training, test_loader, rt.device)
        gpuscale.print0(f"test accuracy {test_acc:.4f} (best validation {best:.4f})")


if __name__ == "__main__":
    main()
