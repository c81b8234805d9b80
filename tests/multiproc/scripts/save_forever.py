"""Save a small checkpoint (step 1), then ever larger ones, until killed. argv: OUT

The test kills this process with SIGKILL while a later checkpoint is being written.
"""

import sys
from pathlib import Path

import torch

import gpuscale

out = Path(sys.argv[1])
with gpuscale.init(show_placement=False) as rt:
    ckpt = gpuscale.Checkpointer(out, keep=10)
    torch.manual_seed(0)
    small = torch.nn.Linear(4, 4)
    ckpt.save(step=1, model=small)
    (out / "saved-1").touch()
    big = torch.nn.Linear(4096, 4096 * 4)  # 256 MiB of float32: a write that takes a while
    for step in range(2, 1000):
        ckpt.save(step=step, model=big)
