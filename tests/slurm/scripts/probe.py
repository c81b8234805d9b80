"""Each rank of a SLURM job reports where it ran and proves it joined the others (an all-reduce).

argv: OUT_DIR
"""

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import gpuscale

out = Path(sys.argv[1])
with gpuscale.init() as rt:
    total = torch.tensor([float(rt.rank + 1)])
    if rt.is_distributed:
        dist.all_reduce(total)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rt.rank}.json").write_text(json.dumps({
        "host": socket.gethostname(), "rank": rt.rank, "local_rank": rt.local_rank, "world_size": rt.world_size,
        "num_nodes": rt.env.num_nodes, "launcher": rt.env.launcher, "master_addr": rt.env.master_addr,
        "master_port": rt.env.master_port, "job_id": rt.env.job_id,
        "cores": sorted(os.sched_getaffinity(0)), "binding": rt.binding.source,
        "visible_gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": str(rt.device), "sum": total.item(),
    }))
