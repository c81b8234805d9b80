"""GS108: the course's fine-tuning bug: the backbone is unfrozen after DDP wrapped the model."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 2)
        for p in self.backbone.parameters():
            p.requires_grad = False

    def forward(self, x):
        return self.head(self.backbone(x))


def main():
    dist.init_process_group("gloo")
    dataset = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    net = Net()
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(6):
        sampler.set_epoch(epoch)
        if epoch == 3:
            for param in net.backbone.parameters():
                param.requires_grad = True  # expect: GS108
            net.head.requires_grad_()  # expect: GS108
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in loader:
            x.requires_grad_()  # an input tensor, not a parameter
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
