"""GS104: a standard-library logger on every rank."""

import logging

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)


def main():
    logging.basicConfig(level=logging.INFO)
    dist.init_process_group("gloo")
    logging.info("process group ready")  # expect: GS104
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
        logger.info("epoch %d: loss %.4f", epoch, loss.item())  # expect: GS104
        if not torch.isfinite(loss):
            logger.warning("loss is not finite on this rank")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
