"""A plain DDP script in nanoGPT's manner: batches drawn from one tensor by `get_batch`, no DataLoader, no gpuscale.

    torchrun --nproc-per-node 2 memmap_batches.py --steps 30 --batch-size 8
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group("gloo")
torch.manual_seed(1234 + (dist.get_rank() if ddp else 0))
data = torch.randint(0, 64, (20_000,))  # the "memmap"
block = 32


def get_batch():
    ix = torch.randint(len(data) - block - 1, (args.batch_size,))
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
    return x, y


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.head = torch.nn.Linear(32, 64)

    def forward(self, idx, targets):
        logits = self.head(self.embed(idx))
        return torch.nn.functional.cross_entropy(logits.view(-1, 64), targets.view(-1))


model = TinyLM()
if ddp:
    model = DDP(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    x, y = get_batch()
    loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step % 10 == 0:
        model.eval()
        with torch.no_grad():
            model(*get_batch())  # an evaluation: not training's samples
        model.train()
if ddp:
    dist.destroy_process_group()
