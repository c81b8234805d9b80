"""Batch scripts: `render_sbatch(profile, job) -> str`, pure and deterministic.

The same inputs always give the same text (no clock, no environment, no file system), so golden
files and shellcheck can test it. Every value that comes from the user is shell-quoted where it
reaches the shell, and restricted to a safe alphabet where it reaches an ``#SBATCH`` line (which
sbatch reads itself, without a shell; `slurm.validate` checks that before anything is written).
Profile text in ``env_shell`` and ``setup`` is trusted shell by design. Each block carries a
comment that tells a learner why it is there.

Launch modes (docs/clusters.md, launch modes):

- ``srun``: one task per GPU; each task sets RANK, LOCAL_RANK and WORLD_SIZE from its own
  SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS (escaped, so every task expands its own); CPU masks
  put each task next to its GPU when the job owns whole nodes.
- ``torchrun``: one task per node, holding all of the node's CPUs; torchrun starts one worker per
  GPU; across nodes they meet by c10d rendezvous on the first node, whose address is computed in
  the batch shell (the container has no SLURM tools).

One GPU on one node is the srun mode with a single task.
"""

from __future__ import annotations

import shlex

from gpuscale._version import __version__
from gpuscale.slurm.jobspec import CPU_BINDS, MODES, JobSpec
from gpuscale.slurm.profiles import Profile
from gpuscale.slurm.times import format_time
from gpuscale.slurm.validate import JobPlan, validate_job

__all__ = ["JobSpec", "render_sbatch", "validate_job", "MODES", "CPU_BINDS"]

TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""Signals torchrun catches and passes on to its workers: its defaults plus USR1, SLURM's warning."""


_RESERVED = frozenset("! case coproc do done elif else esac fi for function if in select then time until while { } [[ ]]".split())


def _q(value: str) -> str:
    """Shell-quote `value`. A word shlex leaves bare is quoted anyway when it is a reserved word (`fi`) or starts
    with '=' (NAME==x): bash takes both as plain words there, but a reader (and shellcheck) should not have to."""
    quoted = shlex.quote(value)
    if quoted == value and (value in _RESERVED or value.startswith("=")):
        return f"'{value}'"  # bare for shlex: holds no quote
    return quoted


_PROBE_SITE = "import sys, os, importlib.util as u; print(os.path.join(os.path.dirname(u.find_spec(sys.argv[1]).origin), *sys.argv[2:]))"
"""Where the job's own gpuscale keeps the probe's sitecustomize (found without importing gpuscale or torch);
the names come as arguments, so the snippet holds no quote of its own."""


def _probe_exports(job: JobSpec) -> str:
    """Shell that loads the probe in the processes started after it (the job's Python finds its folder)."""
    site = f"$({_q(job.python)} -c {_q(_PROBE_SITE)} gpuscale probe site)"
    return (f"export GPUSCALE_PROBE_DIR={_q(job.probe_dir or '')} "
            f'PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}"; ')


def _python_command(job: JobSpec, plan: JobPlan, program: list[str] | None = None) -> str:
    """The program each task runs (default: the training script), as one shell string."""
    probe = _probe_exports(job) if job.probe_dir and program is None else ""
    program = program or [job.python, job.script, *job.script_args]
    if job.mode == "torchrun":
        rendezvous = (
            ["--standalone", "--nnodes=1"]
            if job.nodes == 1
            else ["--nnodes=$SLURM_NNODES", "--rdzv-id=$SLURM_JOB_ID", "--rdzv-backend=c10d", '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"']
        )
        # --signals-to-handle: torchrun passes USR1 (SLURM's warning before the time limit) on to its workers, as TERM.
        launcher = [_q(job.python), "-m", "torch.distributed.run", *rendezvous, f"--nproc-per-node={plan.gpus_per_node}",
                    f"--signals-to-handle={TORCHRUN_SIGNALS}"]
        return probe + "exec " + " ".join(launcher) + " " + " ".join(_q(p) for p in program[1:])
    ranks = 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"'
    return f"{probe}{ranks}; exec " + " ".join(_q(p) for p in program)


def render_sbatch(profile: Profile, job: JobSpec) -> str:
    """The batch script for `job` on `profile`'s cluster. Pure: same inputs, same text.

    The script is a sequence of named blocks, each with the comments that tell a learner why it is there.
    """
    plan = validate_job(profile, job)
    blocks = (_header(profile, job, plan), _sbatch_options(profile, job, plan), ["", "set -euo pipefail", ""],
              _site_setup(profile), _rendezvous(), _environment(profile, job), _venv(job), [*_STOP_HANDLING, ""],
              _launch(profile, job, plan))
    return "\n".join(line for block in blocks for line in block) + "\n"


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
    if job.exclusive:
        lines.append("#SBATCH --exclusive")
    lines += [f"#SBATCH --time={format_time(plan.time_s)}", f"#SBATCH --output={job.output}"]
    # Preemption: SLURM warns this shell (B:) with USR1 before the time limit; the output is appended
    # to, not truncated, when the job requeues itself.
    return lines + [
        f"#SBATCH --signal=B:USR1@{profile.warn_before_end_s}",
        "#SBATCH --requeue" if job.max_requeues else "#SBATCH --no-requeue",
        "#SBATCH --open-mode=append",
    ]


def _site_setup(profile: Profile) -> list[str]:
    """The profile's own set-up lines (modules and the like)."""
    if not profile.setup:
        return []
    return ["# Site set-up from the profile (modules and the like).", *profile.setup, ""]


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


def _environment(profile: Profile, job: JobSpec) -> list[str]:
    """The profile's environment, its GPU-to-core map for torchrun's workers, and the user's --env."""
    lines = []
    env_lines = [f"export {name}={_q(value)}" for name, value in sorted(profile.env.items())]
    env_lines += [f'export {name}="{value}"' for name, value in sorted(profile.env_shell.items())]
    if env_lines:
        lines.append(f"# Environment every job on {profile.name} needs (network, caches, tokenizers).")
        lines += env_lines
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


def _venv(job: JobSpec) -> list[str]:
    """Activating the Python environment the script needs, if one was named."""
    if not job.venv:
        return []
    return [
        "# The Python environment the script needs.",
        "# shellcheck source=/dev/null",
        f"source -- {_q(job.venv.rstrip('/') + '/bin/activate')}",
        "",
    ]


def _launch(profile: Profile, job: JobSpec, plan: JobPlan) -> list[str]:
    """The job step: cores per rank, how the ranks start (torchrun or srun), the optional doctor, the
    training in the background, and the requeue that follows a stop."""
    cores_per_rank = plan.cpus_per_task if job.mode == "srun" else max(1, plan.cpus_per_task // plan.gpus_per_node)
    lines = [
        f"# Each rank gets {cores_per_rank} core(s); gpuscale.init() binds it there and gives its data loader",
        f"# {max(0, cores_per_rank - 1)} worker(s) on a GPU (one core stays with the process feeding the GPU).",
    ]
    srun = ["srun", "--kill-on-bad-exit=1"]
    if job.mode == "torchrun":
        if not any(name == "OMP_NUM_THREADS" for name, _ in job.env):
            lines += [
                "# torchrun would pin every worker to 1 thread; this tells gpuscale.init() the 1 is a placeholder,",
                "# so each worker sizes its thread pool to its own cores.",
                "export OMP_NUM_THREADS=1 GPUSCALE_OMP_FROM_LAUNCHER=1",
            ]
        srun.append("--ntasks-per-node=1")
        lines.append("# One task per node; torchrun inside it starts one worker per GPU. --kill-on-bad-exit ends")
        lines.append("# the whole step when one node fails, so no rank waits forever for a dead peer.")
    else:
        lines.append("# One task per GPU. Each task sets its own RANK/LOCAL_RANK/WORLD_SIZE from SLURM's per-task")
        lines.append("# variables (single quotes: expanded by the task, not by this shell). --kill-on-bad-exit ends")
        lines.append("# the whole step when one task fails, so no rank waits forever for a dead peer.")
        if plan.masks:
            lines.append("# CPU masks in GPU order: task i runs on the cores next to GPU i.")
            lines.append(f"CPU_MASKS={','.join(plan.masks)}")
            srun.append('--cpu-bind=v,mask_cpu:"$CPU_MASKS"')
        elif job.cpu_bind == "none":
            srun.append("--cpu-bind=none")
    lines.append("# shellcheck disable=SC2016  # the single quotes are deliberate: each task expands its own variables")
    if plan.image:
        lines.append("# Python runs inside the container; its environment is activated in there.")
    if job.doctor:
        lines += [
            "# Preflight: gpuscale doctor on every rank, launched exactly like the training (same tasks, GPUs, cores).",
            "# It prints the placement, checks and all-reduce bandwidth; if a check fails the job ends here.",
            _step_command(profile, job, plan, srun, _doctor_program(profile, job, plan))
            + ' || { echo "gpuscale: doctor found a problem (see above); the training was not started" >&2; exit 1; }',
            "",
        ]
    if job.probe_dir:
        lines += ["# gpuscale's probe: put first on PYTHONPATH, it loads in every rank of the training and records its",
                  "# optimizer steps, samples and data waits into GPUSCALE_PROBE_DIR (the script stays as it is)."]
    return lines + [_step_command(profile, job, plan, srun, None) + " &", *_requeue_block(job.max_requeues)]


def _doctor_program(profile: Profile, job: JobSpec, plan: JobPlan) -> list[str]:
    """`python -m gpuscale doctor` with what the profile expects: link bandwidth, and the cores next to each GPU where
    the ranks are bound by that map (CPU masks in srun mode, torchrun on whole nodes); elsewhere SLURM chose the cores."""
    program = [job.python, "-m", "gpuscale", "doctor"]
    expected = profile.inter_node_gbps if job.nodes > 1 else profile.intra_node_gbps
    if expected:
        program += ["--expect-busbw", f"{expected:g}"]
    whole_node = job.exclusive or plan.gpus_per_node == profile.gpus_per_node
    if profile.gpu_cores and (plan.masks or (job.mode == "torchrun" and whole_node)):
        program += ["--gpu-cores", ";".join(profile.gpu_cores)]
    return program


def _step_command(profile: Profile, job: JobSpec, plan: JobPlan, srun: list[str], program: list[str] | None) -> str:
    """One srun line that runs `program` (default: the training) on every task, in the container if there is one."""
    inner = _python_command(job, plan, program)
    if plan.image:
        container = profile.container
        assert container is not None
        binds = ["--bind", _q(",".join(container.binds))] if container.binds else []
        activate = f"{container.activate} && " if container.activate else ""
        return " ".join([*srun, container.exec, *binds, _q(plan.image), "bash", "-c", _q(activate + inner)])
    return " ".join([*srun, "bash", "-c", _q(inner)])


_STOP_HANDLING = [
    "# Stopping in time. SLURM sends USR1 before the time limit (and TERM on scancel or preemption). The",
    "# step runs in the background so this shell can react: it passes USR1 on to every task (srun forwards",
    "# it), gpuscale.StopSignal in the script ends the current step and writes a checkpoint, and after USR1",
    "# the job requeues itself below to resume from that checkpoint.",
    'stop_signal=""',
    'step_pid=""',
    "# shellcheck disable=SC2329  # called by the traps below",
    "on_stop() {",
    '    stop_signal=$1',
    '    if [ -n "$step_pid" ]; then kill -USR1 "$step_pid" 2>/dev/null || true; fi',
    "}",
    "trap 'on_stop USR1' USR1",
    "trap 'on_stop TERM' TERM",
    "wait_for_step() {",
    "    local code again",
    "    while :; do",
    '        code=0; wait "$step_pid" || code=$?',
    "        # A trapped signal ends `wait` early (128+n) while the step still runs: wait again.",
    '        if [ "$code" -gt 128 ]; then',
    '            if kill -0 "$step_pid" 2>/dev/null; then continue; fi',
    '            again=0; wait "$step_pid" || again=$?',
    '            if [ "$again" -ne 127 ]; then code=$again; fi',
    "        fi",
    '        return "$code"',
    "    done",
    "}",
]


def _requeue_block(max_requeues: int) -> list[str]:
    """Shell lines after the step: wait for it, requeue if it was told to stop, exit with its code."""
    lines = ["step_pid=$!", "status=0", "wait_for_step || status=$?"]
    if not max_requeues:
        return [*lines, 'if [ -n "$stop_signal" ]; then echo "gpuscale: $stop_signal received; not requeued (--max-requeues 0)" >&2; fi',
                'exit "$status"']
    return [
        *lines,
        "# Only SLURM's warning (USR1) requeues. TERM comes from scancel too, and a job someone cancelled must",
        "# stay cancelled (and a preempting SLURM with PreemptMode=REQUEUE requeues the job by itself).",
        'if [ "$stop_signal" = TERM ]; then',
        '    echo "gpuscale: TERM received, step ended with $status; not requeued (scancel or preemption); submit the job '
        'again to resume from its checkpoint" >&2',
        '    stop_signal=""',
        "fi",
        'if [ -n "$stop_signal" ]; then',
        "    restarts=${SLURM_RESTART_COUNT:-0}",
        f'    if [ "$restarts" -lt {max_requeues} ]; then',
        '        echo "gpuscale: $stop_signal received, step ended with $status; requeueing job $SLURM_JOB_ID '
        f'(restart $((restarts + 1)) of at most {max_requeues}) to resume from its checkpoint" >&2',
        '        scontrol requeue "$SLURM_JOB_ID" || echo "gpuscale: could not requeue job $SLURM_JOB_ID (cancelled or timed out?); '
        'submit it again to resume from its checkpoint" >&2',
        "    else",
        f'        echo "gpuscale: $stop_signal received; job already requeued {max_requeues} times, not again; '
        'submit it again to resume from its checkpoint" >&2',
        "    fi",
        "fi",
        'exit "$status"',
    ]
