"""Clean: DeepSpeed with batch sizes that agree with the loader (a literal config and a JSON file)."""

import argparse

import deepspeed
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--config", default="ds_config_good.json")
    args = parser.parse_args()
    deepspeed.init_distributed()
    world_size = dist.get_world_size()
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.accumulation,
        "train_batch_size": args.micro_batch * args.accumulation * world_size,
    }
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.micro_batch, sampler=sampler)
    fixed = DataLoader(dataset, batch_size=16, sampler=sampler)
    val_loader = DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset, shuffle=False))
    engine, _, _, _ = deepspeed.initialize(model=torch.nn.Linear(8, 1), config=config if args.config == "-" else args.config)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in [*loader, *fixed]:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
        losses = torch.stack([torch.nn.functional.mse_loss(engine(x), y) for x, y in val_loader])
        dist.all_reduce(losses)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: validation loss {losses.mean().item():.4f}")


if __name__ == "__main__":
    main()
