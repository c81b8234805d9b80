"""Clean: an Accelerate script: prepare() shards the loaders, the main process prints and saves."""

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from torch.utils.data import DataLoader, TensorDataset

logger = get_logger(__name__)


def main():
    accelerator = Accelerator()
    train_set = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    val_set = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    train_loader = DataLoader(train_set, batch_size=16, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=16)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt, train_loader, val_loader = accelerator.prepare(model, opt, train_loader, val_loader)
    for epoch in range(3):
        model.train()
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        model.eval()
        correct, total = 0, 0
        for x, y in val_loader:
            with torch.no_grad():
                pred = model(x).argmax(1)
            pred, y = accelerator.gather_for_metrics((pred, y))
            correct += (pred == y).sum().item()
            total += len(y)
        logger.info("epoch %d: accuracy %.3f", epoch, correct / total)
        if accelerator.is_main_process:
            print(f"epoch {epoch}: accuracy {correct / total:.3f}")
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.is_main_process:
        torch.save(unwrapped.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
