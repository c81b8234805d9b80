"""Print (and write to OUT/rank<RANK>.json) the variables torchrun gives a worker, as this rank sees them.

argv: OUT. A plain script, like the course's: it reads the environment only. It also says which launcher
gpuscale's own detection sees (gpuscale.detect.env is pure and imports no torch).
"""

import json
import os
import socket
import sys
from pathlib import Path

from gpuscale.detect.env import detect_env

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
         "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")

report = {name: os.environ.get(name) for name in NAMES}
report.update(host=socket.gethostname(), launcher=detect_env(os.environ).launcher, job=os.environ.get("SLURM_JOB_ID"))
print(json.dumps(report), flush=True)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(report))
