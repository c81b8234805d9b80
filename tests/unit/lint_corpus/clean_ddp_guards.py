"""Clean: a torchrun DDP script written the right way, with every kind of rank guard."""

import argparse
import logging
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("train")


def rank_zero_only(fn):
    def wrapper(*args, **kwargs):
        if dist.get_rank() == 0:
            return fn(*args, **kwargs)
        return None
    return wrapper


@rank_zero_only
def banner(text):
    print("=" * 20, text, "=" * 20)


def report(epoch, accuracy):
    print(f"epoch {epoch}: accuracy {accuracy:.3f}")
    log.info("epoch %d done", epoch)


def save_checkpoint(model, epoch):
    if dist.get_rank() != 0:
        return
    print(f"saving epoch {epoch}")
    torch.save({"model": model.module.state_dict(), "epoch": epoch}, "checkpoint.pt")


def evaluate(model, loader, device):
    correct = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct[0] += (model(x).argmax(1) == y).sum()
            correct[1] += len(y)
    dist.all_reduce(correct)
    accuracy = correct[0] / correct[1]
    return accuracy.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)
    try:
        if args.batch_size % world_size:
            raise ValueError(f"--batch-size {args.batch_size} does not divide among {world_size} ranks")
        per_rank = args.batch_size // world_size
        banner("training")
        train_set = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
        val_set = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        train_loader = DataLoader(train_set, batch_size=per_rank, sampler=DistributedSampler(train_set))
        val_loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set, shuffle=False))
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        for p in net[0].parameters():
            p.requires_grad = True  # before wrapping: DDP sees it
        model = DDP(net.to(device), device_ids=[local_rank] if device.type == "cuda" else None)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            train_loader.sampler.set_epoch(epoch)
            for step, (x, y) in enumerate(train_loader):
                x, y = x.to(device), y.to(device)
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                if step % 10 == 0 and rank == 0:
                    print(f"step {step}: loss {loss.item():.4f}")
                rank == 0 and print("also guarded")
                print("and this one") if rank == 0 else None
            accuracy = evaluate(model, val_loader, device)
            if rank == 0:
                report(epoch, accuracy)
            save_checkpoint(model, epoch)
            log.info("epoch %d finished", epoch)
            print(f"rank {rank} finished epoch {epoch}", file=sys.stderr)
    except RuntimeError as exc:
        print(f"rank {rank} failed: {exc}")
        raise
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
