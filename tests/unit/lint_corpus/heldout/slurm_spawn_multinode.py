"""Multi-node training launched by SLURM, one task per node, mp.spawn for the GPUs of each node.

    #SBATCH --nodes=4 --ntasks-per-node=1 --gpus-per-node=4 --cpus-per-task=32
    srun python slurm_spawn_multinode.py --data /scratch/feats --epochs 50
"""
import argparse
import os
import socket
import subprocess
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


# ---- utils -----------------------------------------------------------------------------------------

def slurm_master_addr():
    nodelist = os.environ["SLURM_JOB_NODELIST"]
    return subprocess.check_output(["scontrol", "show", "hostnames", nodelist]).decode().split()[0]


def setup_env(args):
    os.environ["MASTER_ADDR"] = slurm_master_addr()
    os.environ["MASTER_PORT"] = "12355"
    args.nnodes = int(os.environ["SLURM_NNODES"])
    args.node_rank = int(os.environ["SLURM_NODEID"])
    args.gpus_per_node = torch.cuda.device_count()
    args.world_size = args.nnodes * args.gpus_per_node


def global_rank(args, local_rank):
    return args.node_rank * args.gpus_per_node + local_rank


def log0(rank, *msg):
    if rank == 0:
        print(*msg, flush=True)


def average(value, device):
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def save_checkpoint(path, model, optimizer, epoch):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)


def report_memory(device):
    print(f"peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB")


# ---- data and model --------------------------------------------------------------------------------

class NpyFeatures(Dataset):
    """Pre-computed features on the shared file system, memory-mapped."""

    def __init__(self, root, split):
        self.x = np.load(os.path.join(root, f"{split}_x.npy"), mmap_mode="r")
        self.y = np.load(os.path.join(root, f"{split}_y.npy"), mmap_mode="r")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(np.array(self.x[i], dtype=np.float32)), int(self.y[i])


def make_model(in_dim, classes):
    return nn.Sequential(nn.Linear(in_dim, 1024), nn.GELU(), nn.Dropout(0.1), nn.Linear(1024, classes))


# ---- training --------------------------------------------------------------------------------------

def worker(local_rank, args):
    rank = global_rank(args, local_rank)
    dist.init_process_group("nccl", rank=rank, world_size=args.world_size)
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    torch.manual_seed(args.seed)
    per_gpu = args.global_batch // args.world_size
    workers = int(os.environ.get("SLURM_CPUS_PER_TASK", 8)) // args.gpus_per_node
    train_set, val_set = NpyFeatures(args.data, "train"), NpyFeatures(args.data, "val")
    sampler = DistributedSampler(train_set, num_replicas=args.world_size, rank=rank, seed=args.seed)
    loader = DataLoader(train_set, batch_size=per_gpu, sampler=sampler, num_workers=workers, pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=per_gpu, num_workers=workers,
                            sampler=DistributedSampler(val_set, num_replicas=args.world_size, rank=rank, shuffle=False))
    model = DDP(make_model(args.in_dim, args.classes).to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    if args.resume:
        state = torch.load(args.resume, map_location={"cuda:0": f"cuda:{local_rank}"})
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    print(f"[node {args.node_rank} gpu {local_rank}] {len(loader)} steps per epoch")
    log0(rank, f"{args.world_size} ranks on {args.nnodes} nodes, {per_gpu} samples per GPU")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t0, running = time.time(), 0.0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += loss.item()
        train_loss = average(running / len(loader), device)
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                correct += (model(x).argmax(1) == y).sum().item()
                total += y.size(0)
        val_acc = average(correct / total, device)
        log0(rank, f"epoch {epoch} loss {train_loss:.4f} val acc {val_acc:.4f} ({time.time() - t0:.1f}s)")
        if epoch % args.save_every == 0 and local_rank == 0:
            save_checkpoint(os.path.join(args.out, f"epoch{epoch}.pt"), model, optimizer, epoch)
    report_memory(device)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--global-batch", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in-dim", type=int, default=768)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--out", default="checkpoints")
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    setup_env(args)
    print(f"{socket.gethostname()}: node {args.node_rank} of {args.nnodes}, {args.gpus_per_node} GPUs")
    os.makedirs(args.out, exist_ok=True)
    mp.spawn(worker, args=(args,), nprocs=args.gpus_per_node, join=True)


if __name__ == "__main__":
    main()
