"""Where and how a job runs on a cluster, as typed values: `ClusterOptions` -> (profile, `JobSpec`).

`gpuscale slurm script|submit` and a study's SLURM launcher share these options; the CLI parses
them (`gpuscale.cli.slurm.cluster_options`), a notebook builds them directly:

    options = ClusterOptions(profile="lumi-g", account="project_465000", container="/path/to/image.sif", time="01:00:00")
    profile, job = cluster_job(options, ["train.py", "--epochs", "3"], nodes=2, gpus_per_node=8, output="%x-%j.out")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpuscale.slurm.jobspec import ClusterSide, JobSpec
from gpuscale.slurm.profiles import Profile, load_profile, parse_override

__all__ = ["ClusterOptions", "cluster_job", "load_cluster_profile"]


@dataclass(frozen=True, kw_only=True)
class ClusterOptions(ClusterSide):
    """The cluster side of a job: profile and overrides, account, time, container, ... (not its shape)."""

    profile: str
    """A profile name (`gpuscale profiles`) or a .toml path."""
    overrides: tuple[tuple[str, str], ...] = ()
    """Single-valued profile keys to override, as (key, value) text, e.g. (("gpus_per_node", "4"),)."""


def load_cluster_profile(options: ClusterOptions) -> Profile:
    """The options' profile with its overrides applied."""
    return load_profile(options.profile, {k: parse_override(k, v) for k, v in options.overrides} or None)


def cluster_job(options: ClusterOptions, command: list[str], *, nodes: int, gpus_per_node: int | None, output: str,
                tasks_per_node: int | None = None, check_paths: bool = True, doctor: bool = False,
                probe_dir: str | None = None) -> tuple[Any, JobSpec]:
    """Profile and JobSpec for `command` (script and its arguments) on the options' cluster."""
    script, *script_args = command
    if check_paths and os.path.isdir(script):
        raise ValueError(f"script {script!r} is a folder; give the path of the Python file the job runs")
    if check_paths and not os.path.isfile(script):
        raise ValueError(f"script {script!r} does not exist; give a path that the job can read")
    profile = load_cluster_profile(options)
    job = JobSpec(script=script, script_args=tuple(script_args), nodes=nodes, gpus_per_node=gpus_per_node,
                  output=output, tasks_per_node=tasks_per_node, doctor=doctor, probe_dir=probe_dir,
                  **options.cluster_side())  # type: ignore[arg-type]  # ClusterSide's own fields, each of its type
    return profile, job
