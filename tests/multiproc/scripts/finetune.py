"""Unfreezing after the wrap: refused without re-wrapping; after `gpuscale.wrap` again, gradients sync.

Also checks metrics over the whole dataset: 11 validation samples on uneven shards, each counted once.
argv: OUT
"""

import json
import sys
from pathlib import Path

import torch

import gpuscale

out = Path(sys.argv[1])
with gpuscale.init() as rt:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    for p in net[0].parameters():
        p.requires_grad = False
    model = gpuscale.wrap(net)
    x = torch.full((2, 4), float(rt.rank + 1))

    for p in net[0].parameters():  # the course's bug: unfreeze after wrapping
        p.requires_grad = True
    try:
        model(x)
        refused = None
    except RuntimeError as exc:
        refused = str(exc)

    model = gpuscale.wrap(model)  # re-wrap around the new trainable set
    model(x).sum().backward()
    grad = net[0].weight.grad.flatten().tolist()

    # whole-dataset mean over uneven shards: values 0..10, mean 5
    values = torch.arange(11.0)
    loader = gpuscale.make_loader(torch.utils.data.TensorDataset(values), gpuscale.plan_batch(3, rt.world_size), train=False)
    mean, seen = gpuscale.Average(), []
    for (batch,) in loader:
        mean.update(batch.sum(), len(batch))
        seen += batch.tolist()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rt.rank}.json").write_text(json.dumps({
        "rank": rt.rank, "refused": refused, "grad": grad, "mean": mean.compute(), "seen": seen,
        "keys": sorted(gpuscale.unwrap(model).state_dict()),
        "w1": net[1].weight.flatten().tolist(),
    }))
