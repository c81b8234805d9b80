"""One rank of a load-test job: meet the job's other rank, all-reduce, report who and where it is.

argv: OUT_DIR [--gate DIR --ranks N]

Writes OUT_DIR/rank<R>.json (job id, rank, host, rendezvous address and port, the all-reduce's sum,
when it was ready and when it left) and prints one ``load-probe job=<id> rank=<R>`` line to the
job's output. With --gate, every rank of every job of the batch waits twice until N ranks have
arrived: before gpuscale.init(), so that all jobs rendezvous at the same moment (the worst case for
ports), and after the all-reduce, so that every process group was up at once (proof that the jobs
ran at the same time, not one after another).
"""

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import gpuscale

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--gate", default=None)
parser.add_argument("--ranks", type=int, default=0)
parser.add_argument("--gate-timeout", type=float, default=120.0)
args = parser.parse_args()
job_id = os.environ["SLURM_JOB_ID"]
me = f"{job_id}-{os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))}"


def wait_for_everyone(stage: str) -> None:
    if not args.gate:
        return
    gate = Path(args.gate)
    (gate / f"{stage}-{me}").touch()
    deadline = time.monotonic() + args.gate_timeout
    while (arrived := len(list(gate.glob(f"{stage}-*")))) < args.ranks:
        if time.monotonic() > deadline:
            sys.exit(f"load probe {me}: only {arrived} of {args.ranks} ranks reached '{stage}' within "
                     f"{args.gate_timeout:.0f} s: the jobs did not run at the same time")
        time.sleep(0.1)


wait_for_everyone("start")
started = time.time()
with gpuscale.init() as rt:
    ready = time.time()
    total = torch.tensor([float(rt.rank + 1)])
    if rt.is_distributed:
        dist.all_reduce(total)
    wait_for_everyone("reduced")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rt.rank}.json").write_text(json.dumps({
        "job_id": rt.env.job_id, "slurm_job_id": job_id, "rank": rt.rank, "world_size": rt.world_size,
        "host": socket.gethostname(), "launcher": rt.env.launcher, "master_addr": rt.env.master_addr,
        "master_port": rt.env.master_port, "sum": total.item(), "started": started, "ready": ready, "left": time.time(),
    }))
    print(f"load-probe job={rt.env.job_id} rank={rt.rank} host={socket.gethostname()} "
          f"rendezvous={rt.env.master_addr}:{rt.env.master_port}", flush=True)
