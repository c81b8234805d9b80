"""GS106: the wrapper's state_dict is saved: every key gets the 'module.' prefix."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")
    dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = torch.nn.Linear(8, 1)
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "model.pt")  # expect: GS106
        checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict()}  # expect: GS106
        torch.save(checkpoint, "checkpoint.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
