"""Batch scripts: `render_sbatch(profile, job) -> str`, pure and deterministic.

The same inputs always give the same text (no clock, no environment, no file system), so golden
files and shellcheck can test it. Every value that comes from the user is shell-quoted where it
reaches the shell, and restricted to a safe alphabet where it reaches an ``#SBATCH`` line (which
sbatch reads itself, without a shell; `slurm.validate` checks that before anything is written).
Profile text in ``env_shell`` and ``setup`` is trusted shell by design. Each block carries a
comment that tells a learner why it is there.

Launch modes (docs/clusters.md, launch modes):

- ``srun``: one task per GPU; each task sets the variables torchrun gives a worker (RANK, LOCAL_RANK,
  WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ..., TORCHELASTIC_RUN_ID) from its own SLURM_PROCID,
  SLURM_LOCALID, SLURM_NODEID, ... (escaped, so every task expands its own), so a script reads the same
  names in both modes; CPU masks put each task next to its GPU when the job owns whole nodes.
- ``torchrun``: one task per node, holding all of the node's CPUs; torchrun starts one worker per
  GPU; across nodes they meet by c10d rendezvous on the first node, whose address is computed in
  the batch shell (the container has no SLURM tools). Options the job's torch may lack are chosen
  in the job, by the version its own Python has (the submitter's torch says nothing about it).

One GPU on one node is the srun mode with a single task. Every training step starts with gpuscale's
start-up hook first on PYTHONPATH; the stop handling and requeue around it are `slurm.stopping`'s.
"""

from __future__ import annotations

from gpuscale._version import __version__
from gpuscale.detect.env import SRUN_TASK_MARKER
from gpuscale.detect.launchtime import LAUNCH_TIME
from gpuscale.slurm.containers import activate_script, in_container
from gpuscale.slurm.jobspec import CPU_BINDS, MODES, JobSpec
from gpuscale.slurm.profiles import Profile
from gpuscale.slurm.stopping import requeue_block, stop_handling, task_exit_note
from gpuscale.slurm.times import format_time
from gpuscale.slurm.validate import JobPlan, validate_job
from gpuscale.slurm.values import shell_word as _q

__all__ = ["JobSpec", "render_sbatch", "validate_job", "MODES", "CPU_BINDS", "TORCHRUN_SIGNALS", "SIGNALS_FROM_TORCH"]

TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""Signals torchrun catches and passes on to its workers: its defaults plus USR1, SLURM's warning."""

SIGNALS_FROM_TORCH = (2, 10)
"""The first torch whose torchrun takes --signals-to-handle. Source: torch/distributed/run.py as shipped in the
torch wheels on PyPI: absent from 2.6.0, 2.7.0, 2.8.0 and 2.9.0, present in 2.10.0 (pytorch PR #160690, for issue
#154849). torch 2.9's torchrun refuses it ("unrecognized arguments"); LUMI's containers carry torch 2.6-2.7."""

_TORCH_AT_LEAST = ('import sys, importlib.metadata as m; v = m.version("torch").split("."); '
                   f"(int(v[0]), int(v[1])) >= {SIGNALS_FROM_TORCH} and print(*sys.argv[1:])")
"""Prints its arguments where the job's own Python has torch SIGNALS_FROM_TORCH or newer, read from the installed
package's metadata (milliseconds: torch is not imported); nothing for an older torch or none."""


AGENT_MODULE = "gpuscale.agent"
"""The node task of torchrun mode, where the job's Python has it (found as the file agent.py beside gpuscale's
__init__, so an older gpuscale without it gets plain torchrun)."""

_PROBE_SITE = "import sys, os, importlib.util as u; print(os.path.join(os.path.dirname(u.find_spec(sys.argv[1]).origin), *sys.argv[2:]))"
"""Where the job's own gpuscale keeps a file: the probe's sitecustomize, the agent (found without importing gpuscale or torch);
the names come as arguments, so the snippet holds no quote of its own."""


def _startup_hook(job: JobSpec) -> str:
    """Shell that puts gpuscale's start-up hook first on PYTHONPATH for the processes started after it (the job's
    own Python finds its folder); a study's probe also records into GPUSCALE_PROBE_DIR. A job Python without
    gpuscale leaves PYTHONPATH as it was (an empty entry would put the current directory on it)."""
    record = f"export GPUSCALE_PROBE_DIR={_q(job.probe_dir)}; " if job.probe_dir else ""
    site = f"$({_q(job.python)} -c {_q(_PROBE_SITE)} gpuscale measure probe site 2>/dev/null)"
    return f'{record}hook={site} && export PYTHONPATH="$hook${{PYTHONPATH:+:$PYTHONPATH}}"; '


def _srun_task_exports(plan: JobPlan) -> str:
    """What torchrun gives a worker, from SLURM's per-task variables: a script reads the same names in both modes.
    The marker tells gpuscale (env.detect_env) that srun, not torchrun, started and placed this task."""
    pairs = [("RANK", '"$SLURM_PROCID"'), ("LOCAL_RANK", '"$SLURM_LOCALID"'), ("WORLD_SIZE", '"$SLURM_NTASKS"'),
             ("LOCAL_WORLD_SIZE", str(plan.tasks_per_node)), ("GROUP_RANK", '"$SLURM_NODEID"'),
             ("GROUP_WORLD_SIZE", '"$SLURM_NNODES"'), ("ROLE_RANK", '"$SLURM_PROCID"'), ("ROLE_WORLD_SIZE", '"$SLURM_NTASKS"'),
             ("ROLE_NAME", "default"), ("TORCHELASTIC_RUN_ID", '"$SLURM_JOB_ID"'), (SRUN_TASK_MARKER, "1")]
    return "export " + " ".join(f"{name}={value}" for name, value in pairs)


def _torchrun_command(job: JobSpec, plan: JobPlan, program: list[str]) -> str:
    """torchrun starting `program` on every GPU of this node, through gpuscale's agent where the job's own Python has
    it (`gpuscale.agent`: torchrun's FAILED block and routine lines left out, the first failing rank's own exit code,
    noted for this script's last line), else plain torchrun. It ignores USR1 (which would end a torchrun older than
    SIGNALS_FROM_TORCH: SLURM hands a step's signal to every process in it); from that version on,
    --signals-to-handle makes it catch USR1 too and pass it on to its workers."""
    rendezvous = (
        ["--standalone", "--nnodes=1"]
        if job.nodes == 1
        else ['--nnodes="$SLURM_NNODES"', '--rdzv-id="$SLURM_JOB_ID"', "--rdzv-backend=c10d", '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"']
    )
    signals = f"$({_q(job.python)} -c {_q(_TORCH_AT_LEAST)} --signals-to-handle={TORCHRUN_SIGNALS} 2>/dev/null)"
    agent = f"$({_q(job.python)} -c {_q(_PROBE_SITE)} gpuscale agent.py 2>/dev/null)"
    choose = f'agent={agent}; if [ -f "$agent" ]; then launcher={AGENT_MODULE}; else launcher=torch.distributed.run; fi; '
    launcher = [_q(job.python), "-m", '"$launcher"', *rendezvous, f"--nproc-per-node={plan.gpus_per_node}",
                '${signals:+"$signals"}']
    return f'trap "" USR1; signals={signals}; {choose}exec ' + " ".join(launcher) + " " + " ".join(_q(p) for p in program[1:])


def _python_command(profile: Profile, job: JobSpec, plan: JobPlan, program: list[str] | None = None) -> str:
    """The program each task runs (default: the training script, behind gpuscale's start-up hook), as one shell string,
    after making the folders the profile's node_dirs name (mkdir -p: every task of a node may, none races another)."""
    hook = _startup_hook(job) if program is None else ""
    if profile.node_dirs:
        hook = "mkdir -p " + " ".join(f'"${name}"' for name in profile.node_dirs) + "; " + hook
    program = program or [job.python, job.script, *job.script_args]
    if job.mode == "torchrun":
        return hook + _torchrun_command(job, plan, program)
    return f"{hook}{_srun_task_exports(plan)}; " + task_exit_note(" ".join(_q(p) for p in program))


def render_sbatch(profile: Profile, job: JobSpec) -> str:
    """The batch script for `job` on `profile`'s cluster. Pure: same inputs, same text.

    The script is a sequence of named blocks, each with the comments that tell a learner why it is there.
    """
    plan = validate_job(profile, job)
    blocks = (_header(profile, job, plan), _sbatch_options(profile, job, plan), ["", "set -euo pipefail", "", *_launch_time()],
              _software(profile, job, plan), _rendezvous(), _environment(profile, job, plan), _venv(job, plan),
              [*stop_handling(private_tmp=bool(plan.container and plan.container.pyxis)), ""],
              _launch(profile, job, plan))
    return "\n".join(line for block in blocks for line in block) + "\n"


def _launch_time() -> list[str]:
    """When this run of the job started: gpuscale's summaries count the run's startup and time to result from it."""
    return ["# When this run of the job started: a run's startup and time to result count from here.",
            f'{LAUNCH_TIME}=$(date +%s.%N); export {LAUNCH_TIME}', ""]


def _header(profile: Profile, job: JobSpec, plan: JobPlan) -> list[str]:
    """The shebang, shellcheck's waiver for the quoted literals, and what the script is for."""
    total = job.nodes * plan.gpus_per_node
    how = (
        "one task per GPU started by srun" if job.mode == "srun"
        else "torchrun on each node, one worker per GPU" if job.nodes > 1 or plan.gpus_per_node > 1
        else "torchrun with one worker"
    )
    return [
        "#!/bin/bash",
        "# shellcheck disable=SC2016,SC1003,SC2088  # values are single-quoted literals: a $, `, \\ or ~ in them stays as typed",
        f"# Generated by gpuscale {__version__} for profile {profile.name}: {job.nodes} node(s) x "
        f"{plan.gpus_per_node} GPU(s) = {total} rank(s), {how}.",
        "# Submit with: sbatch THIS_FILE  (or gpuscale slurm submit with the same options)",
    ]


def _sbatch_options(profile: Profile, job: JobSpec, plan: JobPlan) -> list[str]:
    """The #SBATCH lines: where, how many, how long, and the warning before the time limit."""
    lines = [f"#SBATCH --job-name={job.job_name}"]
    if job.account:
        lines.append(f"#SBATCH --account={job.account}")
    lines.append(f"#SBATCH --partition={plan.partition}")
    if job.reservation:
        lines.append(f"#SBATCH --reservation={job.reservation}")
    lines += [
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --gpus-per-node={plan.gpus_per_node}",
        f"#SBATCH --ntasks-per-node={plan.tasks_per_node}",
    ]
    # sbatch refuses --cpus-per-gpu next to --cpus-per-task: one or the other.
    if job.cpus_per_gpu is not None:
        lines.append(f"#SBATCH --cpus-per-gpu={job.cpus_per_gpu}")
    else:
        lines.append(f"#SBATCH --cpus-per-task={plan.cpus_per_task}")
    if plan.mem_per_gpu:
        lines.append(f"#SBATCH --mem-per-gpu={plan.mem_per_gpu}")
    if plan.mem_per_node is not None:
        # (comment lines among the #SBATCH lines are fine: sbatch reads on to the first command)
        amount = "all of each node's memory (0)" if plan.mem_per_node == "0" else f"{plan.mem_per_node} of memory per node"
        lines.append(f"# The job owns whole nodes and asks for {amount}: the cluster's default per CPU is often a fraction of it.")
        lines.append(f"#SBATCH --mem={plan.mem_per_node}")
    if plan.exclusive and not job.exclusive:
        lines.append("# Every GPU of each node, on a partition that shares nodes: the job asks to own them.")
    if plan.exclusive:
        lines.append("#SBATCH --exclusive")
    lines += [f"#SBATCH --time={format_time(plan.time_s)}", f"#SBATCH --output={job.output}"]
    # Preemption: SLURM warns this shell (B:) with USR1 before the time limit; the output is appended
    # to, not truncated, when the job requeues itself.
    return lines + [
        f"#SBATCH --signal=B:USR1@{profile.warn_before_end_s}",
        "#SBATCH --requeue" if job.max_requeues else "#SBATCH --no-requeue",
        "#SBATCH --open-mode=append",
    ]


def _software(profile: Profile, job: JobSpec, plan: JobPlan) -> list[str]:
    """The profile's own set-up lines, the modules the container image needs, the modules asked for, and the image."""
    lines = _clean_modules() if profile.clean_modules else []
    if profile.setup:
        lines += ["# Site set-up from the profile (modules and the like).", *profile.setup, ""]
    image = plan.container
    modules = []
    if image and (image.module_use or image.modules):
        modules.append(f"# What images named {image.pattern} need on {profile.name}, as its documentation loads it.")
        modules += [f"module use {_q(path)}" for path in image.module_use]
        modules += [f"module load {_q(name)}" for name in image.modules]
    if job.modules:
        modules.append("# Modules asked for with --module, in order.")
        modules += [f"module load {_q(name)}" for name in job.modules]
    if modules:
        # Lmod's shell function reads variables that may be unset; a module that fails to load still ends the job (-e).
        lines += [modules[0], "set +u  # the module command reads variables that may be unset", *modules[1:], "set -u", ""]
    if image:
        how = "srun --container-image: pyxis and enroot" if image.pyxis else image.exec
        lines += [f"# Python runs in this container image (started with {how}"
                  + (", then activated inside it" if image.activate else "") + ").",
                  f"IMAGE={_q(image.image)}", ""]
    return lines


def _clean_modules() -> list[str]:
    """Unload what the submitting shell had loaded, as the site's own job scripts do (its sticky modules stay)."""
    return [
        "# A clean module environment first, as LUMI's own job scripts start: sbatch hands the job the environment",
        "# of the shell that submitted it, and a PyTorch module the user had in that shell would bring its container",
        "# and network settings along. `module purge` unloads it; container variables (SINGULARITYENV_*) that no",
        "# module owns are cleared too. The modules and the environment this script names (--module, --env) follow.",
        "set +u  # the module command reads variables that may be unset",
        "module --quiet purge",
        "set -u",
        "while read -r name; do unset \"$name\"; done < <(compgen -e | grep -E '^(SINGULARITYENV|APPTAINERENV)_' || true)",
        "",
    ]


def _rendezvous() -> list[str]:
    """Rank 0's address and a port derived from the job id."""
    return [
        "# Rank 0's host is the first node of the job; the address is computed here, outside any",
        "# container (which has no SLURM tools). The port comes from the job id, so two jobs sharing",
        "# a node never collide on the default port 29500.",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "MASTER_PORT=$((10000 + SLURM_JOB_ID % 10000))",
        "export MASTER_ADDR MASTER_PORT",
        "",
    ]


def _environment(profile: Profile, job: JobSpec, plan: JobPlan) -> list[str]:
    """The profile's environment, the container image's, its GPU-to-core map for torchrun's workers, and the user's
    --env (last, so it wins)."""
    lines = []
    env_lines = [f"export {name}={_q(value)}" for name, value in sorted(profile.env.items())]
    env_lines += [f'export {name}="{value}"' for name, value in sorted(profile.env_shell.items())]
    if env_lines:
        lines.append(f"# Environment every job on {profile.name} needs (caches, tokenizers).")
        lines += env_lines
        lines.append("")
    if plan.container and plan.container.env:
        lines.append(f"# Environment images named {plan.container.pattern} need (it belongs to the image, not to every job).")
        lines += [f"export {name}={_q(value)}" for name, value in sorted(plan.container.env.items())]
        lines.append("")
    if profile.gpu_cores and job.mode == "torchrun":
        lines += [
            "# Which cores sit next to which GPU on these nodes: torchrun's workers bind themselves by it.",
            f"export GPUSCALE_GPU_CORES={_q(';'.join(profile.gpu_cores))}",
            "",
        ]
    if job.env:
        lines.append("# Environment asked for with --env.")
        lines += [f"export {name}={_q(value)}" for name, value in job.env]
        lines.append("")
    return lines


def _venv(job: JobSpec, plan: JobPlan) -> list[str]:
    """Activating the Python environment the script needs, if one was named: here on the host; in a container, where
    the environment was made (inside it), in every task's command (`gpuscale.slurm.containers.in_container`)."""
    if not job.venv:
        return []
    if plan.container:
        return ["# The Python environment the script needs (--venv) is activated inside the container, in each task,",
                "# after the image's own set-up: it was made there, on the image's Python.", ""]
    return [
        "# The Python environment the script needs.",
        "# shellcheck source=/dev/null",
        f"source -- {activate_script(job.venv)}",
        "",
    ]


def _launch(profile: Profile, job: JobSpec, plan: JobPlan) -> list[str]:
    """The job step: cores per rank, how the ranks start (torchrun or srun), the optional doctor, the
    training in the background, and the requeue that follows a stop."""
    cores_per_rank = plan.cpus_per_task if job.mode == "srun" else max(1, plan.cpus_per_task // plan.gpus_per_node)
    lines = [
        f"# Each rank gets {cores_per_rank} core(s); gpuscale binds it there and gives its data loader",
        f"# {max(0, cores_per_rank - 1)} worker(s) on a GPU (one core stays with the process feeding the GPU).",
    ]
    # srun is told the cores per task itself: Slurm 22.05 to 23.02 did not pass sbatch's --cpus-per-task on to srun
    # (restored in 23.11), so a step there could be confined to one core per task, torchrun and all its workers with it.
    # (With --cpus-per-gpu instead, which excludes --cpus-per-task, srun takes the job's per-GPU share.)
    srun = ["srun", "--kill-on-bad-exit=1"]
    if job.cpus_per_gpu is None:
        srun.append(f"--cpus-per-task={plan.cpus_per_task}")
        lines.append("# srun gets --cpus-per-task itself: Slurm 22.05-23.02 did not pass sbatch's on to it (one core per task).")
    if job.mode == "torchrun":
        lines += _torchrun_exports(profile, job)
        srun.append("--ntasks-per-node=1")
        lines += [
            "# One task per node; torchrun inside it starts one worker per GPU. --kill-on-bad-exit ends",
            "# the whole step when one node fails, so no rank waits forever for a dead peer.",
            "# SLURM hands USR1 to every process of the step. torchrun ignores it (trap): before torch 2.10 it",
            "# would end torchrun. From 2.10, --signals-to-handle (put in where the job's torch has it, read",
            "# from the job Python's package metadata) has torchrun pass it on to its workers too.",
        ]
    else:
        lines += [
            "# One task per GPU. Each task sets what torchrun would give a worker (RANK, LOCAL_RANK, WORLD_SIZE,",
            "# LOCAL_WORLD_SIZE, GROUP_RANK, ...) from SLURM's per-task variables (single quotes: expanded by the",
            "# task, not by this shell); GPUSCALE_SRUN_TASK tells gpuscale that srun placed it. --kill-on-bad-exit",
            "# ends the whole step when one task fails, so no rank waits forever for a dead peer.",
        ]
        if plan.masks:
            lines.append("# CPU masks in GPU order: task i runs on the cores next to GPU i.")
            lines.append(f"CPU_MASKS={','.join(plan.masks)}")
            srun.append('--cpu-bind=mask_cpu:"$CPU_MASKS"')
        elif job.cpu_bind == "none":
            srun.append("--cpu-bind=none")
    lines.append("# shellcheck disable=SC2016  # the single quotes are deliberate: each task expands its own variables")
    if job.doctor:
        lines += [
            "# Preflight: gpuscale doctor on every rank, launched exactly like the training (same tasks, GPUs, cores).",
            "# It prints the placement, checks and all-reduce bandwidth; if a check fails the job ends here.",
            _step_command(profile, job, plan, srun, _doctor_program(profile, job, plan))
            + ' || { echo "gpuscale: doctor found a problem (see above); the training was not started" >&2; exit 1; }',
            "",
        ]
    lines += ["# gpuscale's start-up hook: loaded first in every rank, it binds the rank to its cores and sizes its",
              "# thread pools before the script runs (and in a study records its steps)."]
    if job.probe_dir:
        lines.append("# This is a study's cell: the records go to GPUSCALE_PROBE_DIR (the script stays as it is).")
    return lines + [_step_command(profile, job, plan, srun, None) + " &", *requeue_block(job.max_requeues)]


def _torchrun_exports(profile: Profile, job: JobSpec) -> list[str]:
    """What torchrun and its workers need from this shell, unless the user's --env already says it."""
    mine = {name for name, _ in job.env}
    lines = []
    if "OMP_NUM_THREADS" not in mine:
        lines += [
            "# torchrun would pin every worker to 1 thread; this tells gpuscale.init() the 1 is a placeholder,",
            "# so each worker sizes its thread pool to its own cores.",
            "export OMP_NUM_THREADS=1 GPUSCALE_OMP_FROM_LAUNCHER=1",
        ]
    if "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in mine:
        lines += [
            "# How long torchrun lets its workers stop after it passed a signal on, before it kills them (torch",
            "# 2.12 and later; before, 30 s): as long as SLURM's warning, so a checkpoint is not cut short.",
            f"export TORCH_ELASTIC_SHUTDOWN_TIMEOUT={profile.warn_before_end_s}",
        ]
    return lines


def _doctor_program(profile: Profile, job: JobSpec, plan: JobPlan) -> list[str]:
    """`python -m gpuscale doctor` with what the profile expects: link bandwidth, and the cores next to each GPU where
    the ranks are bound by that map (CPU masks in srun mode, torchrun on whole nodes); elsewhere SLURM chose the cores."""
    program = [job.python, "-m", "gpuscale", "doctor"]
    expected = profile.inter_node_gbps if job.nodes > 1 else profile.intra_node_gbps
    if expected:
        program += ["--expect-busbw", f"{expected:g}"]
    whole_node = plan.exclusive or plan.gpus_per_node == profile.gpus_per_node
    if profile.gpu_cores and (plan.masks or (job.mode == "torchrun" and whole_node)):
        program += ["--gpu-cores", ";".join(profile.gpu_cores)]
    return program


def _step_command(profile: Profile, job: JobSpec, plan: JobPlan, srun: list[str], program: list[str] | None) -> str:
    """One srun line that runs `program` (default: the training) on every task, in the container if there is one."""
    inner = _python_command(profile, job, plan, program)
    image = plan.container
    if image:
        inner = in_container(image, job.venv, inner)
    if image and image.pyxis:  # srun starts the image (pyxis): the job's folder mounted at its own path, then the binds
        mounts = ",".join(['"$PWD:$PWD"', *(_q(bind) for bind in image.binds)])
        workdir = _q(image.workdir) if image.workdir else '"$PWD"'
        return " ".join([*srun, '--container-image="$IMAGE"', f"--container-mounts={mounts}", f"--container-workdir={workdir}",
                         "bash", "-c", _q(inner)])
    if image:
        binds = ["--bind", _q(",".join(image.binds))] if image.binds else []
        return " ".join([*srun, image.exec, *binds, '"$IMAGE"', "bash", "-c", _q(inner)])
    return " ".join([*srun, "bash", "-c", _q(inner)])
