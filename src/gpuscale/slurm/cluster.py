"""Where and how a job runs on a cluster, as typed values: `ClusterOptions` -> (profile, `JobSpec`).

`gpuscale slurm script|submit` and a study's SLURM launcher share these options; the CLI parses
them (`gpuscale.cli.slurm.cluster_options`), a notebook builds them directly:

    options = ClusterOptions(profile="lumi-g", account="project_465000", time="01:00:00")
    profile, job = cluster_job(options, ["train.py", "--epochs", "3"], nodes=2, gpus_per_node=8, output="%x-%j.out")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpuscale.slurm.profiles import Profile, load_profile, parse_override
from gpuscale.slurm.render import JobSpec

__all__ = ["ClusterOptions", "cluster_job", "load_cluster_profile"]


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    """The cluster side of a job: profile and overrides, account, time, container, ... (not its shape)."""

    profile: str
    """A profile name (`gpuscale profiles`) or a .toml path."""
    overrides: tuple[tuple[str, str], ...] = ()
    """Single-valued profile keys to override, as (key, value) text, e.g. (("gpus_per_node", "4"),)."""
    mode: str = "torchrun"
    """'torchrun' (one task per node) or 'srun' (one task per GPU)."""
    time: str = "00:30:00"
    account: str | None = None
    partition: str | None = None
    reservation: str | None = None
    mem_per_gpu: str | None = None
    job_name: str = "gpuscale"
    container: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    """Variables exported in the job."""
    venv: str | None = None
    exclusive: bool = False
    cpu_bind: str = "auto"
    cpus_per_gpu: int | None = None
    python: str = "python3"
    max_requeues: int = 10


def load_cluster_profile(options: ClusterOptions) -> Profile:
    """The options' profile with its overrides applied."""
    return load_profile(options.profile, {k: parse_override(k, v) for k, v in options.overrides} or None)


def cluster_job(options: ClusterOptions, command: list[str], *, nodes: int, gpus_per_node: int | None, output: str,
                tasks_per_node: int | None = None, check_paths: bool = True, doctor: bool = False,
                probe_dir: str | None = None) -> tuple[Any, JobSpec]:
    """Profile and JobSpec for `command` (script and its arguments) on the options' cluster."""
    script, *script_args = command
    if check_paths and not os.path.isfile(script):
        raise ValueError(f"script {script!r} does not exist; give a path that the job can read")
    profile = load_cluster_profile(options)
    job = JobSpec(
        script=script, script_args=tuple(script_args), nodes=nodes, gpus_per_node=gpus_per_node,
        mode=options.mode, time=options.time, account=options.account, partition=options.partition,
        reservation=options.reservation, mem_per_gpu=options.mem_per_gpu, job_name=options.job_name,
        output=output, container=options.container, env=options.env, venv=options.venv,
        exclusive=options.exclusive, cpu_bind=options.cpu_bind, cpus_per_gpu=options.cpus_per_gpu,
        tasks_per_node=tasks_per_node, python=options.python, max_requeues=options.max_requeues,
        doctor=doctor, probe_dir=probe_dir,
    )
    return profile, job
