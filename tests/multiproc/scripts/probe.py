"""Each rank reports what it saw: its place, cores, threads, and the gradient after one DDP step.

Rank r feeds a batch of (r + 1)s to Linear(8, 1); the gradient of the summed output is 4 (r + 1)
per weight on its own, and the mean over ranks once DDP has synchronised it.
"""

import json
import os
import sys
from pathlib import Path

import torch

import gpuscale

out = Path(sys.argv[1])
with gpuscale.init() as rt:
    torch.manual_seed(rt.rank)  # different initial weights per rank: DDP must broadcast rank 0's
    model = gpuscale.wrap(torch.nn.Linear(8, 1))
    initial = gpuscale.unwrap(model).weight.detach().cpu().clone()
    x = torch.full((4, 8), float(rt.rank + 1), device=rt.device)
    model(x).sum().backward()
    grad = gpuscale.unwrap(model).weight.grad.detach().cpu().clone()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    record = {
        "rank": rt.rank,
        "local_rank": rt.local_rank,
        "world_size": rt.world_size,
        "launcher": rt.env.launcher,
        "backend": rt.backend,
        "cores": sorted(os.sched_getaffinity(0)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
        "initial_weight": initial.flatten().tolist(),
        "grad": grad.flatten().tolist(),
        "weight": gpuscale.unwrap(model).weight.detach().cpu().flatten().tolist(),
        "placements": rt.placements,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rt.rank}.json").write_text(json.dumps(record))
