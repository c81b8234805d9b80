"""Rank 1 fails at step 3 while rank 0 keeps calling all_reduce: the job must end, not hang.

argv: MODE where MODE is 'raise' (a Python exception), 'exit' (the process vanishes, as os._exit does),
'kill' (SIGKILL), 'hang' (rank 1 stops taking part, alive: only the collective timeout ends the job) or
'requeue' (rank 1 exits 75, EX_TEMPFAIL, asking for the job to run again; a requeued run, SLURM_RESTART_COUNT
set, ends after a few steps) or 'run' (no rank fails: every rank goes on for about 10 minutes, to a time limit).
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import gpuscale

mode = sys.argv[1]
with gpuscale.init() as rt:  # the collective timeout: GPUSCALE_TIMEOUT or gpuscale run --timeout
    for step in range(60_000):
        if rt.rank == 1 and step == 3:
            if mode == "raise":
                raise ValueError("planted failure on rank 1")
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "hang":
                time.sleep(3600)
            if mode == "requeue" and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
                sys.exit(75)
            if mode == "exit":
                os._exit(7)
        if mode == "requeue" and step == 5:
            break  # the requeued run
        dist.all_reduce(torch.ones(4))
        time.sleep(0.01)
