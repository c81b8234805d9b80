"""`gpuscale slurm script`: write the SLURM batch script for a training script and a cluster profile.

    gpuscale slurm script --profile lumi-g --account project_465000 --container $SIF --mode srun -- train.py --epochs 3
    gpuscale slurm script --profile lumi-g --account project_465000 --container $SIF --nodes 2 -- train.py

Modes: ``srun`` starts one task per GPU (ranks from SLURM's per-task variables, CPU masks next to
each GPU on whole nodes); ``torchrun`` starts one task per node and torchrun inside it (c10d
rendezvous on the first node across nodes). One GPU on one node is ``--gpus-per-node 1``.
Everything is checked before a script is written: GPUs per node, the partition's time limit,
CPU masks on shared nodes, options the cluster refuses, the script's path, and what the profile
requires: an account, and a software environment (--container IMAGE, --module NAME, --venv DIR, or
--no-container). The profile says how each image starts, which modules it needs loaded, which host
paths are bound into it and which environment it needs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from gpuscale.base.files import atomic_write
from gpuscale.cli.verbs import verb_parser
from gpuscale.detect.secrets import is_secret_name
from gpuscale.slurm import jobs
from gpuscale.slurm.cluster import ClusterOptions, cluster_job, load_cluster_profile
from gpuscale.slurm.render import CPU_BINDS, MODES, JobSpec, render_sbatch

EPILOG = """examples:
  gpuscale slurm script --profile lumi-g --account project_465000 --container $SIF --gpus-per-node 8 --mode srun -- train.py
  gpuscale slurm script --profile lumi-g --account project_465000 --container $SIF --nodes 2 -- train.py --epochs 3
  gpuscale slurm script --profile generic-nvidia --set gpus_per_node=4 --set cpus_per_node=32 -- train.py
  gpuscale slurm script --profile local --nodes 2 --gpus-per-node 1 --mode srun -- examples/dogs_vs_cats.py
  gpuscale slurm submit --doctor --profile lumi-g --account project_465000 --container $SIF --nodes 2 -- train.py
                                            # preflight checks in the job first
"""


def add_cluster_options(parser: Any, profile_required: bool = True) -> None:
    """Where and how a job runs (profile, account, time, container, ...): shared by `slurm` and `study`."""
    parser.add_argument("--profile", required=profile_required, help="cluster profile: a name (see `gpuscale profiles`) or a .toml path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a single-valued profile key, e.g. gpus_per_node=4 (repeatable)")
    parser.add_argument("--mode", choices=MODES, default="torchrun", help="torchrun: one task per node; srun: one task per GPU")
    parser.add_argument("--time", default="00:30:00", help="time limit, e.g. 30, 01:00:00, 1-00:00:00 (default 00:30:00)")
    parser.add_argument("--account", default=None,
                        help="project to charge (default: $SBATCH_ACCOUNT, as sbatch reads it; LUMI refuses jobs without one)")
    parser.add_argument("--partition", default=None, help="partition (default: the profile's full- or partial-node one)")
    parser.add_argument("--reservation", default=None, help="reservation (courses often have one)")
    parser.add_argument("--mem-per-gpu", default=None, help="memory per GPU, e.g. 60G (default: the profile's)")
    parser.add_argument("--job-name", default="gpuscale", help="job name (default gpuscale)")
    parser.add_argument("--container", default=None, metavar="IMAGE",
                        help="container image to run Python in; the profile says how each image starts and what it needs")
    parser.add_argument("--no-container", action="store_true",
                        help="run the host's Python, no container (where the profile asks for a software environment)")
    parser.add_argument("--module", action="append", default=[], metavar="NAME",
                        help="load this module in the job before srun (repeatable, loaded in order)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="export a variable in the job (repeatable)")
    parser.add_argument("--venv", default=None, help="virtual environment to activate in the job")
    parser.add_argument("--exclusive", action="store_true", help="ask for whole nodes")
    parser.add_argument("--cpu-bind", choices=CPU_BINDS, default="auto", help="srun mode: CPU masks next to each GPU (auto: when the node is whole)")
    parser.add_argument("--cpus-per-gpu", type=int, default=None, help="pass --cpus-per-gpu to SLURM (refused on some clusters)")
    parser.add_argument("--python", default="python3", help="Python interpreter in the job (default python3)")
    parser.add_argument("--max-requeues", type=int, default=10, metavar="N",
                        help="requeue the job at most N times after the script stopped at a checkpoint on SLURM's warning "
                        "before the time limit (gpuscale.StopSignal; exit 75), to resume from it (default 10; 0: never). "
                        "A script without a StopSignal is never warned nor requeued: it runs to its time limit")


def add_job_options(parser: argparse.ArgumentParser) -> None:
    """The options that describe a job, shared by `script` and `submit`."""
    add_cluster_options(parser)
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: all of a node's)")
    parser.add_argument("--output", default="%x-%j.out", help="output file pattern (default %%x-%%j.out)")
    parser.add_argument("--ntasks-per-node", type=int, default=None, help="tasks per node (torchrun: 1; srun: one per GPU)")
    parser.add_argument("--doctor", action="store_true",
                        help="run `gpuscale doctor` on every rank first, launched like the training; stop the job if a check fails")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARGS]", help="the training script and its arguments")


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
    return cluster_job(cluster_options(args), command, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                       output=args.output, tasks_per_node=args.ntasks_per_node, check_paths=check_paths,
                       doctor=getattr(args, "doctor", False))


def cluster_options(args: argparse.Namespace) -> ClusterOptions:
    """The cluster options (`add_cluster_options`) of parsed arguments, as typed values."""
    return ClusterOptions(
        profile=args.profile, overrides=tuple(_pairs(args.set, "--set")), mode=args.mode, time=args.time,
        account=args.account or os.environ.get("SBATCH_ACCOUNT") or None, partition=args.partition, reservation=args.reservation,
        mem_per_gpu=args.mem_per_gpu, job_name=args.job_name, container=args.container, no_container=args.no_container,
        modules=tuple(args.module), env=tuple(_pairs(args.env, "--env")), venv=args.venv,
        exclusive=args.exclusive, cpu_bind=args.cpu_bind, cpus_per_gpu=args.cpus_per_gpu, python=args.python,
        max_requeues=args.max_requeues,
    )


def profile_from_args(args: argparse.Namespace) -> Any:
    """The --profile with its --set overrides."""
    return load_cluster_profile(ClusterOptions(profile=args.profile, overrides=tuple(_pairs(args.set, "--set"))))


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "slurm", __doc__, EPILOG)
    actions = parser.add_subparsers(dest="slurm_verb", metavar="ACTION", required=True)
    script = actions.add_parser(
        "script", help="print the batch script (or write it with -o)", description=__doc__, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_options(script)
    script.add_argument("-o", "--write", default=None, metavar="FILE", help="write the script to FILE instead of printing it")
    script.set_defaults(func=run_script)

    submit = actions.add_parser(
        "submit", help="render and submit the batch script; print the job id",
        description="Render the batch script (same options as `script`) and submit it with sbatch. "
        "With --wait, follow the job to its end and exit with its exit code.",
        epilog="examples:\n  gpuscale slurm submit --profile local --nodes 2 --gpus-per-node 1 --mode srun --wait -- examples/dogs_vs_cats.py\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_options(submit)
    submit.add_argument("--wait", action="store_true", help="follow the job until it ends; exit with its exit code")
    submit.add_argument("--follow", action="store_true", help="print the job's output as it is written (implies --wait)")
    submit.set_defaults(func=run_submit)

    status = actions.add_parser("status", help="state of jobs (default: your pending and running jobs)",
                                epilog="examples:\n  gpuscale slurm status\n  gpuscale slurm status 1234 1235\n",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    status.add_argument("job_ids", nargs="*", metavar="JOBID")
    status.set_defaults(func=run_status)

    cancel = actions.add_parser("cancel", help="cancel jobs", epilog="examples:\n  gpuscale slurm cancel 1234\n",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cancel.add_argument("job_ids", nargs="+", metavar="JOBID")
    cancel.set_defaults(func=run_cancel)

    logs = actions.add_parser("logs", help="print a job's output (-f: follow it until the job ends)",
                              epilog="examples:\n  gpuscale slurm logs 1234\n  gpuscale slurm logs -f 1234\n",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    logs.add_argument("job_id", metavar="JOBID")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    logs.set_defaults(func=run_logs)


def run_script(args: argparse.Namespace) -> int:
    profile, job = job_from_args(args)
    text = render_sbatch(profile, job)
    if args.write:
        # An --env value that looks like a token is written into the script: then only its owner may read it.
        secret = any(is_secret_name(name) for name, _ in job.env)
        try:
            atomic_write(args.write, lambda f: f.write(text.encode()), mode=0o700 if secret else 0o755)
        except OSError as exc:  # its words name the temporary file beside the target: say the target
            raise ValueError(f"cannot write {args.write}: {exc.strerror or exc}; give -o a file in a folder you can write") from None
        print(f"wrote {args.write}" + (" (mode 0700: it holds a secret from --env)" if secret else ""), file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _job_id(text: str) -> str:
    if not re.fullmatch(r"[0-9]+", text):  # not str.isdigit(): it takes '²' and Arabic-Indic digits
        raise ValueError(f"job id {text!r} is not a number")
    return text


def _describe(info: Any) -> str:
    parts = [f"job {info.job_id} ({info.name}): {info.state}"]
    if info.exit_code is not None:
        parts.append(f"exit code {info.exit_code}")
    if info.nodes:
        parts.append(f"on {info.nodes}")
    if info.reason and not info.finished:
        parts.append(f"reason {info.reason}")
    return ", ".join(parts)


def run_submit(args: argparse.Namespace) -> int:
    profile, job = job_from_args(args)
    text = render_sbatch(profile, job)
    job_id = jobs.submit(text)
    print(job_id, flush=True)
    if not (args.wait or args.follow):
        return 0
    if args.follow:
        latest = jobs.job_info(job_id)

        def finished() -> bool:
            nonlocal latest
            latest = jobs.job_info(job_id)
            return latest.finished

        if latest.stdout_path:
            for line in jobs.follow(latest.stdout_path, finished):
                sys.stdout.write(line)
                sys.stdout.flush()
        info = latest if latest.finished else jobs.wait(job_id)
        print(_describe(info), file=sys.stderr)
    else:
        info = jobs.wait(job_id, poll_s=1.0, on_change=lambda i: print(_describe(i), file=sys.stderr, flush=True))
    if info.stdout_path:  # where the job's own lines are, failed or not (--follow printed them already)
        print(f"output: {info.stdout_path}", file=sys.stderr)
    return 0 if info.succeeded else info.exit_code or 1


def run_status(args: argparse.Namespace) -> int:
    infos = [jobs.job_info(_job_id(j)) for j in args.job_ids] if args.job_ids else jobs.list_jobs()
    for info in infos:
        print(_describe(info))
    if not infos:
        print("no pending or running jobs")
    return 0


def run_cancel(args: argparse.Namespace) -> int:
    """Cancel each job given; one that SLURM does not know or that has ended is an error line, and the others are
    still cancelled (exit code 2 if any was not)."""
    failed = 0
    for job_id in args.job_ids:
        try:
            info = jobs.cancel(_job_id(job_id))
        except jobs.SlurmError as exc:
            print(f"gpuscale slurm cancel: error: {exc}", file=sys.stderr)
            failed += 1
            continue
        print(f"cancelled {job_id} (it was {info.state})")
    return 2 if failed else 0


def run_logs(args: argparse.Namespace) -> int:
    info = jobs.job_info(_job_id(args.job_id))
    if not info.stdout_path:
        raise ValueError(f"SLURM does not say where job {args.job_id} writes its output")
    finished = (lambda: jobs.job_info(info.job_id).finished) if args.follow else (lambda: True)
    for line in jobs.follow(info.stdout_path, finished):
        sys.stdout.write(line)
        sys.stdout.flush()
    return 0
