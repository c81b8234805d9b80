"""GS105: every rank writes the same checkpoint file."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    net = torch.nn.Linear(8, 1)
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        torch.save({"model": model.module.state_dict(), "epoch": epoch}, "checkpoint.pt")  # expect: GS105
        torch.save(opt.state_dict(), f"optimizer-rank{rank}.pt")  # one file per rank: deliberate
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
