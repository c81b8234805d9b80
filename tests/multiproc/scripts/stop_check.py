"""How often StopSignal's ranks agree, and how soon after a signal they stop, on 2 ranks.

argv: OUT EVERY. EVERY is 'auto' (with interval_s=0.3) or a number. Steps take about 20 ms; rank 1
sends itself SIGUSR1 after step 40. Each rank writes OUT/stopped-RANK.json: the step it stopped after
and how many all-reduces StopSignal made.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch.distributed as dist

import gpuscale

out, every = Path(sys.argv[1]), sys.argv[2]
checks = 0
all_reduce = dist.all_reduce


def counted(*args, **kwargs):
    global checks
    checks += 1
    return all_reduce(*args, **kwargs)


dist.all_reduce = counted  # only StopSignal all-reduces in this script
with gpuscale.init() as rt:
    stop = gpuscale.StopSignal(every="auto" if every == "auto" else int(every), interval_s=0.3)
    for step in range(1, 1001):
        if rt.rank == 1 and step == 40:
            os.kill(os.getpid(), signal.SIGUSR1)
        if stop.requested():  # the first call comes right after the constructor: no measure of a step
            (out / f"stopped-{rt.rank}.json").write_text(json.dumps({"step": step, "checks": checks}))
            stop.exit()
        time.sleep(0.02)
