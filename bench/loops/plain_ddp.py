"""The workload in plain PyTorch DDP, the way the PyTorch tutorial writes it (run under torchrun)."""

import gc
import os
import sys
import time

import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workload import PER_RANK_BATCH, Recorder, args, make_data, make_model, make_optimizer  # noqa: E402

out, steps, warmup = args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
data = make_data()
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
loader = DataLoader(data, batch_size=PER_RANK_BATCH, sampler=sampler, drop_last=True)
model = DDP(make_model())
opt = make_optimizer(model.parameters())
rec = Recorder(steps, warmup)
epoch, going = 0, True
while going:
    sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if not rec.step_done(loss):
            going = False
            break
    epoch += 1
rec.write(out, rank, world, variant="plain")
# torch 2.13 + gloo aborts at exit now and then ("terminate called without an active exception", docs/traps.md):
# free what holds the process group, meet, then destroy it
del model, opt
gc.collect()
dist.barrier()
dist.destroy_process_group()
time.sleep(0.1)  # the GIL to gloo's threads before shutdown
