"""Clean: the same training with gpuscale: sharded loaders, rank-aware logging, one checkpoint writer."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

import gpuscale

log = gpuscale.get_logger("train")


def main():
    with gpuscale.init() as rt:
        plan = gpuscale.plan_batch(25, rt.world_size, scaling="strong")
        train_set = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
        val_set = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        train_loader = gpuscale.make_loader(train_set, plan)
        val_loader = gpuscale.make_loader(val_set, plan, train=False)
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        for p in net[0].parameters():
            p.requires_grad = False
        training = gpuscale.setup(net, lambda params: torch.optim.SGD(params, lr=0.1), plan=plan)
        ckpt = gpuscale.Checkpointer("out/checkpoints")
        for epoch in range(4):
            if epoch == 2:
                for p in net[0].parameters():
                    p.requires_grad = True
                training = gpuscale.setup(training.model, lambda params: torch.optim.SGD(params, lr=0.01), plan=plan)
            for x, y in train_loader:
                x, y = x.to(rt.device), y.to(rt.device)
                loss = nn.functional.cross_entropy(training.model(x), y)
                training.backward(loss)
                training.step()
            correct = gpuscale.Average()
            with torch.no_grad():
                for x, y in val_loader:
                    correct.update((training.model(x.to(rt.device)).argmax(1) == y.to(rt.device)).sum(), len(y))
            accuracy = correct.compute()
            log.info("epoch %d: validation accuracy %.3f", epoch, accuracy)
            gpuscale.print0(f"epoch {epoch} done")
            ckpt.save(step=epoch, epoch=epoch + 1, model=training.model, optimizer=training.optimizer)
        if rt.is_main:
            torch.save(gpuscale.full_state_dict(training.model), "out/final.pt")


if __name__ == "__main__":
    main()
