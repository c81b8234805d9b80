"""`gpuscale slurm script`: write the SLURM batch script for a training script and a cluster profile.

    gpuscale slurm script --profile lumi-g --nodes 1 --gpus-per-node 8 --mode srun -- train.py --epochs 3
    gpuscale slurm script --profile lumi-g --nodes 2 --mode torchrun --account project_465000 -- train.py

Modes: ``srun`` starts one task per GPU (ranks from SLURM's per-task variables, CPU masks next to
each GPU on whole nodes); ``torchrun`` starts one task per node and torchrun inside it (c10d
rendezvous on the first node across nodes). One GPU on one node is ``--gpus-per-node 1``.
Everything is checked before a script is written: GPUs per node, the partition's time limit,
CPU masks on shared nodes, options the cluster refuses, the script's path.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gpuscale.slurm.profiles import load_profile
from gpuscale.slurm.render import CPU_BINDS, MODES, JobSpec, render_sbatch

EPILOG = """examples:
  gpuscale slurm script --profile lumi-g --nodes 1 --gpus-per-node 8 --mode srun -- train.py
  gpuscale slurm script --profile lumi-g --nodes 2 --mode torchrun --account project_465000 -- train.py --epochs 3
  gpuscale slurm script --profile generic-nvidia --set gpus_per_node=4 --set cpus_per_node=32 -- train.py
  gpuscale slurm script --profile local --nodes 2 --gpus-per-node 1 --mode srun -- examples/dogs_vs_cats.py
"""


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """The options that describe a job, shared by `script` and `submit`."""
    parser.add_argument("--profile", required=True, help="cluster profile: a name (see `gpuscale profiles`) or a .toml path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a top-level profile key (repeatable)")
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: all of a node's)")
    parser.add_argument("--mode", choices=MODES, default="torchrun", help="torchrun: one task per node; srun: one task per GPU")
    parser.add_argument("--time", default="00:30:00", help="time limit, e.g. 30, 01:00:00, 1-00:00:00 (default 00:30:00)")
    parser.add_argument("--account", default=None, help="project to charge")
    parser.add_argument("--partition", default=None, help="partition (default: the profile's full- or partial-node one)")
    parser.add_argument("--reservation", default=None, help="reservation (courses often have one)")
    parser.add_argument("--mem-per-gpu", default=None, help="memory per GPU, e.g. 60G (default: the profile's)")
    parser.add_argument("--job-name", default="gpuscale", help="job name (default gpuscale)")
    parser.add_argument("--output", default="%x-%j.out", help="output file pattern (default %%x-%%j.out)")
    parser.add_argument("--container", default=None, help="container image to run Python in")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="export a variable in the job (repeatable)")
    parser.add_argument("--venv", default=None, help="virtual environment to activate in the job")
    parser.add_argument("--exclusive", action="store_true", help="ask for whole nodes")
    parser.add_argument("--cpu-bind", choices=CPU_BINDS, default="auto", help="srun mode: CPU masks next to each GPU (auto: when the node is whole)")
    parser.add_argument("--cpus-per-gpu", type=int, default=None, help="pass --cpus-per-gpu to SLURM (refused on some clusters)")
    parser.add_argument("--ntasks-per-node", type=int, default=None, help="tasks per node (torchrun: 1; srun: one per GPU)")
    parser.add_argument("--python", default="python3", help="Python interpreter in the job (default python3)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARGS]", help="the training script and its arguments")


def _parse_value(text: str) -> Any:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _pairs(items: list[str], option: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{option} {item!r} is not KEY=VALUE")
        pairs.append((key, value))
    return pairs


def job_from_args(args: argparse.Namespace, check_paths: bool = True) -> tuple[Any, JobSpec]:
    """Profile and JobSpec from parsed options; ValueError for anything wrong."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("no training script given; put it after --, e.g. `-- train.py --epochs 3`")
    script, *script_args = command
    if check_paths and not os.path.isfile(script):
        raise ValueError(f"script {script!r} does not exist; give a path that the job can read")
    profile = load_profile(args.profile, {k: _parse_value(v) for k, v in _pairs(args.set, "--set")} or None)
    job = JobSpec(
        script=script, script_args=tuple(script_args), nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        mode=args.mode, time=args.time, account=args.account, partition=args.partition,
        reservation=args.reservation, mem_per_gpu=args.mem_per_gpu, job_name=args.job_name,
        output=args.output, container=args.container, env=tuple(_pairs(args.env, "--env")), venv=args.venv,
        exclusive=args.exclusive, cpu_bind=args.cpu_bind, cpus_per_gpu=args.cpus_per_gpu,
        tasks_per_node=args.ntasks_per_node, python=args.python,
    )
    return profile, job


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "slurm", help="SLURM batch scripts for a cluster profile", description=__doc__, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="slurm_verb", metavar="ACTION", required=True)
    script = actions.add_parser(
        "script", help="print the batch script (or write it with -o)", description=__doc__, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_options(script)
    script.add_argument("-o", "--write", default=None, metavar="FILE", help="write the script to FILE instead of printing it")
    script.set_defaults(func=run_script)


def run_script(args: argparse.Namespace) -> int:
    profile, job = job_from_args(args)
    text = render_sbatch(profile, job)
    if args.write:
        from gpuscale.files import atomic_write

        atomic_write(args.write, lambda f: f.write(text.encode()), mode=0o755)
        print(f"wrote {args.write}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
