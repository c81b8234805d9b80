"""The workload with Hugging Face Accelerate (run under torchrun; cpu=True as Accelerate needs on CPU, docs/traps.md)."""

import gc
import os
import sys
import time

import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workload import PER_RANK_BATCH, Recorder, args, make_data, make_model, make_optimizer  # noqa: E402

out, steps, warmup = args()
accelerator = Accelerator(cpu=True)
data = make_data()
loader = DataLoader(data, batch_size=PER_RANK_BATCH, shuffle=True, drop_last=True)
model = make_model()
opt = make_optimizer(model.parameters())
model, opt, loader = accelerator.prepare(model, opt, loader)
rec = Recorder(steps, warmup)
going = True
while going:
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        if not rec.step_done(loss):
            going = False
            break
rec.write(out, accelerator.process_index, accelerator.num_processes, variant="accelerate")
# torch 2.13 + gloo aborts at exit now and then (docs/traps.md): free what holds the process group, meet, then end
del model, opt
gc.collect()
accelerator.wait_for_everyone()
accelerator.end_training()
time.sleep(0.1)  # the GIL to gloo's threads before shutdown
