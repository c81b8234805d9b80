"""GS103/GS105: `is_dist = local_rank != -1` (or `>= 0`, `is not None`) tells a distributed run from a
single process, true on every rank: it is not a rank guard. `rank == 0`, the else of `rank != 0`,
`local_rank in (-1, 0)` / `[-1, 0]` and the single-process branch of `local_rank == -1` are."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    args = parser.parse_args()
    local_rank = args.local_rank
    is_dist = local_rank != -1
    if local_rank == -1:
        print("single process")
        device = torch.device("cpu")
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    if is_dist:
        print("distributed run")  # expect: GS103
    if args.local_rank >= 0:
        torch.save({}, "checkpoint.pt")  # expect: GS105
    if local_rank is not None and local_rank != -1:
        print("still every rank")  # expect: GS103
    if not is_dist:
        print("one process only")
    model = torch.nn.Linear(8, 1).to(device)
    if is_dist:
        model = DDP(model)
    if local_rank in (-1, 0):
        print("rank 0 or a single process")
    if local_rank in [-1, 0]:
        torch.save(getattr(model, "module", model).state_dict(), "model.pt")
    rank = dist.get_rank() if is_dist else 0
    if rank != 0:
        pass
    else:
        print("main rank")
    if is_dist and rank == 0:
        print("main rank of a distributed run")
    if is_dist:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
