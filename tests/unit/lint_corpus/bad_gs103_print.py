"""GS103: progress printed by every rank."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def report(epoch, loss):
    print(f"epoch {epoch}: loss {loss:.4f}")  # expect: GS103


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    print("process group ready")  # expect: GS103
    print(f"rank {dist.get_rank()} ready")  # the rank in the text: a deliberate message from each rank
    dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        report(epoch, loss.item())
        if local_rank == 0:
            print("local rank 0 is fine")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
