"""`gpuscale env`: where does each rank run? Detected launcher, ranks, devices and cores.

Run on its own it describes this process; under a launcher every rank takes part and rank 0
prints one line per rank, so you see at a glance that rank 3 is on GPU 3 next to its cores:

    gpuscale env
    gpuscale run --nproc-per-node 2 -m gpuscale env
    srun --ntasks-per-node=8 gpuscale env

It also lists rank 0's environment variables that decide placement and communication (SLURM_*,
CUDA_*, NCCL_*, OMP_*, HF_*, ...), so a bug report carries them. Secrets are masked
(`gpuscale.detect.secrets`): a token shows as ``hf_*** (37 chars)``, set but not leaked. The text lists
SLURM's many variables only in ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch

from gpuscale.cli.verbs import verb_parser
from gpuscale.detect.env import relevant_environment
from gpuscale.detect.log import format_placements
from gpuscale.runtime.init import Runtime, init

EPILOG = """examples:
  gpuscale env
  gpuscale env --json
  gpuscale run --nproc-per-node 2 -m gpuscale env
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "env", __doc__, EPILOG)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--bind", choices=("auto", "none"), default=None, help="CPU binding to apply (default: auto, or GPUSCALE_BIND)")
    parser.set_defaults(func=run)


def describe(rt: Runtime) -> dict[str, Any]:
    env = rt.env
    return {
        "launcher": env.launcher,
        "world_size": env.world_size,
        "num_nodes": env.num_nodes,
        "local_world_size": env.local_world_size,
        "master_addr": env.master_addr,
        "master_port": env.master_port,
        "backend": rt.backend,
        "job_id": env.job_id,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "placements": rt.placements,
        "environment": relevant_environment(os.environ),
        "set_by_gpuscale": {name: before for name, before in rt.environment_set.items() if os.environ.get(name) != before},
    }


def _set_here(name: str, set_by_gpuscale: dict[str, str | None]) -> str:
    """"  (set by gpuscale.init(); before: ...)" for a variable init() set in this process, whose launcher's or shell's
    value (or none) is what a script without gpuscale.init() gets."""
    if name not in set_by_gpuscale:
        return ""
    before = set_by_gpuscale[name]
    return f"  (set by gpuscale.init() here; {'unset' if before is None else f'{before!r}'} before)"


def run(args: argparse.Namespace) -> int:
    with init(bind=args.bind, show_placement=False) as rt:
        if rt.is_main:
            info = describe(rt)
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                gpus = info["gpus_visible"]
                print(
                    f"launcher {info['launcher']}: {info['world_size']} rank(s) on {info['num_nodes']} node(s), "
                    f"rendezvous {info['master_addr']}:{info['master_port']}, backend {info['backend'] or 'none (one process)'}"
                )
                runtime = f"CUDA {info['cuda']}" if info["cuda"] else f"ROCm {info['hip']}" if info["hip"] else "CPU build"
                print(f"torch {info['torch']} ({runtime}), {gpus} GPU(s) visible to rank 0, {os.cpu_count()} CPUs on this host")
                print(format_placements(rt.placements))
                shown = {k: v for k, v in info["environment"].items() if not k.startswith("SLURM_")}
                num_slurm = len(info["environment"]) - len(shown)
                print(f"environment of rank 0 (secrets masked{f'; {num_slurm} SLURM_* variables with --json' if num_slurm else ''}):")
                print("\n".join(f"  {k}={v}{_set_here(k, info['set_by_gpuscale'])}" for k, v in shown.items()) or "  (none of interest)")
            sys.stdout.flush()
    return 0
