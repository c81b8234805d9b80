"""A plain DDP script (no gpuscale) in which one rank is slower by a known delay every step.

The delayed rank sleeps --delay seconds before each forward (host work the others do not have), so
every other rank waits that long for it in DDP's all-reduce: the imbalance the probe must recover
from DDP's own timers.
"""

import argparse
import gc
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--delay", type=float, default=0.03, help="seconds the slow rank sleeps before each forward")
parser.add_argument("--slow-rank", type=int, default=1)
parser.add_argument("--samples", type=int, default=1280)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(args.samples, 128), torch.randint(0, 4, (args.samples,)))
loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=False))  # one pass: nothing to reshuffle
model = DDP(torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
try:
    for x, y in loader:
        if dist.get_rank() == args.slow_rank:
            time.sleep(args.delay)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    del model, optimizer  # torch 2.13 + gloo aborts at exit now and then unless the DDP model goes first
    gc.collect()
    dist.barrier()
finally:
    dist.destroy_process_group()
    time.sleep(0.1)  # the GIL to gloo's threads before shutdown (docs/traps.md)
