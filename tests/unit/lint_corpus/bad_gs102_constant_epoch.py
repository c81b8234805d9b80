"""GS102: set_epoch() is called, but always with 0: every epoch the sampler draws the same order."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group(backend="gloo")
    dataset = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = DistributedSampler(dataset, shuffle=True)  # expect: GS102
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(5):
        sampler.set_epoch(0)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        print(f"epoch {epoch} done") if dist.get_rank() == 0 else None
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
