"""GS107: reducing the loss does not reduce the accuracy counted next to it; the finding is the line where
rank 0 prints its own shard's accuracy. A counter made of gathered values, or passed to a reducing helper
of the script, is reduced; a count printed with its rank is each rank's own, on purpose."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def reduce_mean(value, world_size):
    value = value.clone()
    dist.all_reduce(value)
    return value / world_size


def validate(model, loader, rank, world_size):
    loss_sum = torch.zeros(())
    correct, total = 0, 0
    for x, y in loader:
        out = model(x)
        loss_sum += torch.nn.functional.cross_entropy(out, y, reduction="sum")
        correct += (out.argmax(1) == y).sum().item()
        total += len(y)
    dist.all_reduce(loss_sum)
    if rank == 0:
        print(f"val loss {loss_sum.item() / len(loader.dataset):.3f}, accuracy {correct / total:.3f}")  # expect: GS107


def top1(model, loader, world_size):
    hits = []
    for x, y in loader:
        acc1 = (model(x).argmax(1) == y).float().mean()
        hits.append(reduce_mean(acc1, world_size))
    return sum(hits) / len(hits)


def gathered(model, loader):
    correct = 0
    for x, y in loader:
        predictions = [torch.zeros_like(y) for _ in range(dist.get_world_size())]
        labels = [torch.zeros_like(y) for _ in range(dist.get_world_size())]
        dist.all_gather(predictions, model(x).argmax(1))
        dist.all_gather(labels, y)
        correct += (torch.cat(predictions) == torch.cat(labels)).sum().item()
    return correct


def per_rank(model, loader, rank):
    correct = 0
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum().item()
    print(f"rank {rank}: {correct} right in its own shard")


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    model = DDP(torch.nn.Linear(8, 2))
    validate(model, loader, rank, world_size)
    accuracy = top1(model, loader, world_size)
    hits = gathered(model, loader)
    per_rank(model, loader, rank)
    if rank == 0:
        print(f"top-1 {accuracy:.3f}, {hits} right")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
