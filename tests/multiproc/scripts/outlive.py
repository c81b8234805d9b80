"""Ranks that train on and on, to see what becomes of them when their launcher is SIGKILLed.

argv: OUT MODE. Each rank writes OUT/pid-RANK once it trains. MODE 'plain': a loop of all-reduces;
'stop': the same with a gpuscale.StopSignal, writing OUT/stopped-RANK (the step it stopped after)
where a training script would write its checkpoint; 'blocked': each rank then waits in a receive from the other,
which never sends (both blocked in gloo, where a Python signal handler cannot run).
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import gpuscale

out, mode = Path(sys.argv[1]), sys.argv[2]
with gpuscale.init() as rt:
    stop = gpuscale.StopSignal() if mode == "stop" else None
    for step in range(3000):  # 10 minutes: far longer than any test waits
        dist.all_reduce(torch.ones(4))
        if step == 1:
            (out / f"pid-{rt.rank}").write_text(str(os.getpid()))
            if mode == "blocked":
                dist.recv(torch.zeros(1), src=1 - rt.rank)
        if stop is not None and stop.requested():
            (out / f"stopped-{rt.rank}").write_text(str(step))
            stop.exit()
        time.sleep(0.2)
