"""GS102: a DistributedSampler whose epoch is never set: the same order every epoch."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group(backend="gloo")
    dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(dataset)  # expect: GS102
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
