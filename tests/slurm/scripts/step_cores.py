"""Each worker writes the cores of the task that started it (its parent, torchrun: the SLURM step's task) and its own.

argv: OUT_DIR
"""

import json
import os
import sys
from pathlib import Path


def allowed_cores(pid: int) -> list[int]:
    """The cores process `pid` may run on, as the kernel lists them (/proc/PID/status, Cpus_allowed_list)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cores = []
            for part in line.split(":", 1)[1].strip().split(","):
                low, _, high = part.partition("-")
                cores += range(int(low), int(high or low) + 1)
            return cores
    raise RuntimeError(f"no Cpus_allowed_list for process {pid}")


out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rank = int(os.environ["RANK"])
(out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "task_cores": allowed_cores(os.getppid()),
                                                  "cores": sorted(os.sched_getaffinity(0))}))
