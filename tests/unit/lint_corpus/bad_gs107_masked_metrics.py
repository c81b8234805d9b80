"""GS107: counters that read like metrics but are not (bias_correction1, grad_acc_steps) hide nothing,
and gather / reduce that combine nothing over ranks (logits.gather, torch.gather, functools.reduce) do
not count as reducing the metrics. Each finding points at the line where rank 0 reports the number."""

import functools
import operator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def adam_step(param, grad, exp_avg, step, beta1=0.9, lr=1e-3):
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - 0.999 ** step
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    param.data.add_(exp_avg / bias_correction1, alpha=-lr * bias_correction2)


def lm_loss(logits, labels):
    picked = logits.log_softmax(-1).gather(1, labels[:, None])
    also = torch.gather(logits, 1, labels[:, None])
    return -(picked.mean() + also.mean() * 0)


def evaluate(model, loader, world_size):
    grad_acc_steps = 64 // (8 * world_size)
    acc_steps = grad_acc_steps
    correct, total = 0, 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    return correct / total, acc_steps


def top_k(model, loader):
    running_corrects = 0
    for x, y in loader:
        running_corrects += (model(x).argmax(1) == y).sum()
    return running_corrects


def top1(model, x, y):
    top1_acc = (model(x).argmax(1) == y).float().mean()
    return top1_acc


def main():
    dist.init_process_group("gloo")
    world_size = dist.get_world_size()
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(8, 2))
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            lm_loss(model(x), y).backward()
    sizes = functools.reduce(operator.mul, [2, 3, 4])
    accuracy, _ = evaluate(model, loader, world_size)
    corrects, acc1 = top_k(model, loader), top1(model, x, y)
    if dist.get_rank() == 0:
        print(f"accuracy {accuracy:.3f}, {sizes}")  # expect: GS107
        print(f"corrects {corrects}")  # expect: GS107
        print(f"top-1 {acc1}")  # expect: GS107
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
