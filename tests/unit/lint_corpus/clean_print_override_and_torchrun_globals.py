"""Clean: a script that replaces print (the torchvision references' setup_for_distributed) prints once;
log lines that carry the rank are deliberate; under torchrun every rank runs `if __name__ == "__main__":`,
so a function may read a name assigned there; the DDP wrapper under an alias saved through .module."""

import argparse
import builtins
import logging
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as NativeDDP

logger = logging.getLogger(__name__)


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        if is_master or kwargs.pop("force", False):
            builtin_print(*args, **kwargs)

    builtins.print = print


def train():
    model = NativeDDP(torch.nn.Linear(4, 2))
    for step in range(args.steps):
        model(torch.randn(8, 4)).sum().backward()
        print(f"step {step}")
    logger.info("rank %d finished %d steps", dist.get_rank(), args.steps)
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "model.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    setup_for_distributed(int(os.environ["RANK"]) == 0)
    print("training")
    try:
        train()
    finally:
        dist.destroy_process_group()
