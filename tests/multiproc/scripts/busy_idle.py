"""Rank 0 computes and the other ranks sleep through the same batches; the Meter writes summary.json
and timeline.json into argv[1], and each rank writes rank<r>.json with its CPU share of its cores
by its own clock (to compare with the monitor's reading). argv[2]: seconds of training (default 4)."""

import json
import sys
import time
from pathlib import Path

import torch

import gpuscale

out = Path(sys.argv[1])
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
batches = 8
with gpuscale.init() as rt:
    meter = gpuscale.Meter(gpuscale.plan_batch(2 * rt.world_size, rt.world_size))
    wall, cpu = time.monotonic(), time.process_time()
    for _ in meter.iter([torch.zeros(2)] * batches):
        end = time.monotonic() + seconds / batches
        if rt.rank == 0:
            while time.monotonic() < end:  # pure Python: one busy core, whatever torch's thread count
                pass
        else:
            time.sleep(seconds / batches)
    share = 100 * (time.process_time() - cpu) / (time.monotonic() - wall) / len(rt.cores)
    (out / f"rank{rt.rank}.json").write_text(json.dumps({"rank": rt.rank, "cores": len(rt.cores), "cpu_pct": share}))
    meter.write_summary(out)  # collective: rank 1 waits here for rank 0 only a moment
