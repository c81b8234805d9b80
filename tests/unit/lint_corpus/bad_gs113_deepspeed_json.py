"""GS113: the JSON config next to the script says micro batch 16; the loader feeds 32."""

import deepspeed
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)  # expect: GS113
    engine, _, _, _ = deepspeed.initialize(model=torch.nn.Linear(8, 1), config="ds_config_bad.json")
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()


if __name__ == "__main__":
    main()
