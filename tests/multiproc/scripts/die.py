"""Rank 1 fails at step 3 while rank 0 keeps calling all_reduce: the job must end, not hang.

argv: MODE where MODE is 'raise' (a Python exception) or 'exit' (the process vanishes, as a kill would).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

import gpuscale

mode = sys.argv[1]
with gpuscale.init(timeout=30) as rt:
    for step in range(10_000):
        if rt.rank == 1 and step == 3:
            if mode == "raise":
                raise ValueError("planted failure on rank 1")
            os._exit(7)
        dist.all_reduce(torch.ones(4))
        time.sleep(0.01)
