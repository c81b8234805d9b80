"""GS106: the model `Accelerator.prepare` returns is the DDP wrapper on several processes; its state_dict's keys
start with 'module.'. Accelerate's docs save ``accelerator.unwrap_model(model).state_dict()``; the optimizer and
the loader it prepared are no wrappers."""

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_dataloader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8, shuffle=True)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for x, y in train_dataloader:
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(model.state_dict(), "model.pt")  # expect: GS106
        torch.save(accelerator.unwrap_model(model).state_dict(), "plain.pt")
        torch.save(optimizer.state_dict(), "optimizer.pt")


if __name__ == "__main__":
    main()
