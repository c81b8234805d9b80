"""A plain DDP script (no gpuscale) one of whose ranks ends badly after --after optimizer steps.

--mode kill: rank --rank sends itself SIGTERM (as a scheduler or torchrun would);
--mode raise: rank --rank raises RuntimeError. The probe must still leave that rank's record.
"""

import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("kill", "raise"), required=True)
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--after", type=int, default=12)
args = parser.parse_args()

dist.init_process_group("gloo")
data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 4, (4096,)))
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))  # one pass: no epochs to reshuffle
model = DDP(torch.nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for step, (x, y) in enumerate(loader, 1):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step == args.after and dist.get_rank() == args.rank:
            print(f"VICTIM rank={args.rank} steps={step}", flush=True)
            if args.mode == "kill":
                os.kill(os.getpid(), signal.SIGTERM)
            raise RuntimeError(f"rank {args.rank} gives up after {step} steps")
finally:
    dist.destroy_process_group()
