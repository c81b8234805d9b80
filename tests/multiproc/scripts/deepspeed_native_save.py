"""Save a DeepSpeed checkpoint as DeepSpeed's own save_checkpoint does (the HF Trainer's layout), and the weights."""
import sys

import deepspeed
import torch
import torch.distributed as dist

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
config = {"train_batch_size": 4, "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}
engine, *_ = deepspeed.initialize(model=model, config=config, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(2):
    loss = engine(torch.randn(4, 8)).pow(2).sum()
    engine.backward(loss)
    engine.step()
engine.save_checkpoint(sys.argv[1])  # collective: every rank writes its part
if dist.get_rank() == 0:
    torch.save({k: v.detach().clone() for k, v in engine.module.state_dict().items()}, sys.argv[2])
dist.destroy_process_group()
