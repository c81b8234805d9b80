"""Job checks: `validate_job(profile, job) -> JobPlan`, before anything is rendered or submitted.

Each check is a small function named for what it checks, run in a fixed order, so that a job with
several problems always hears of the same one first; a ValueError says what is wrong and how to fix it.
What the checks settle (partition, tasks, cores, CPU masks, memory, image, time) is the `JobPlan`
that `render_sbatch` writes out.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuscale.slurm.jobspec import CPU_BINDS, MODES, JobSpec
from gpuscale.slurm.profiles import ContainerSetup, Partition, Profile
from gpuscale.slurm.times import parse_time
from gpuscale.slurm.values import ENV_NAME, MEMORY, SBATCH_SAFE, memory_gb

__all__ = ["JobPlan", "validate_job"]


@dataclass(frozen=True)
class JobPlan:
    """What `validate_job` settled for a job on a profile: what the batch script asks SLURM for."""

    partition: str
    gpus_per_node: int
    tasks_per_node: int
    cpus_per_task: int
    masks: list[str] | None
    mem_per_gpu: str | None
    mem_per_node: str | None
    """--mem of a job that owns whole nodes (the profile's full_node_mem; "0": all of it); then no --mem-per-gpu."""
    container: ContainerSetup | None
    """The image Python runs in and how it starts (None: the host's Python)."""
    time_s: int
    exclusive: bool = False
    """Ask for --exclusive: asked for, or the job takes every GPU of its nodes on a partition that shares nodes
    (it owns them: no other job's processes on its cores, memory or network), as Megatron's and NeMo's recipes ask."""


def validate_job(profile: Profile, job: JobSpec) -> JobPlan:
    """Check the job against the profile before anything is submitted; ValueError says what and how to fix."""
    _check_choices(job)
    _check_account(profile, job)
    _check_software(profile, job)
    gpus = _gpus_per_node(profile, job)
    partition = _partition(profile, job, gpus)
    part = profile.partition(partition)
    time_s = _time_limit(job, partition, part)
    tasks = _tasks_per_node(job, gpus)
    _check_cpus_per_gpu(profile, job)
    exclusive = job.exclusive or (gpus == profile.gpus_per_node and not part.whole_node)
    masks = _cpu_masks(profile, job, partition, part.whole_node or exclusive, gpus)
    cpus_per_task = _cpus_per_task(profile, job, gpus)
    mem_per_node = _mem_per_node(profile, job, gpus)
    mem = None if mem_per_node is not None else _mem_per_gpu(profile, job, gpus)  # sbatch takes one of --mem and --mem-per-gpu
    image = _image(profile, job)
    container = profile.container_for(image) if image else None
    _check_env_names(job)
    _check_max_requeues(job)
    _check_warning_fits(profile, job, time_s)
    _check_sbatch_values(job, partition)
    return JobPlan(partition, gpus, tasks, cpus_per_task, masks, mem, mem_per_node, container, time_s, exclusive)


def _check_choices(job: JobSpec) -> None:
    """--mode and --cpu-bind are among the known ones; --nodes is at least 1."""
    if job.mode not in MODES:
        raise ValueError(f"--mode {job.mode!r} is not one of {', '.join(MODES)}")
    if job.cpu_bind not in CPU_BINDS:
        raise ValueError(f"--cpu-bind {job.cpu_bind!r} is not one of {', '.join(CPU_BINDS)}")
    if job.python.startswith("%"):  # bash runs a command whose first word starts with % as `fg %...`, quoted or not
        raise ValueError(f"--python {job.python!r}: bash takes a command starting with % for a job; give its path instead "
                         f"(e.g. ./{job.python})")
    if not isinstance(job.nodes, int) or job.nodes < 1:
        raise ValueError(f"--nodes {job.nodes} must be at least 1")


def _check_account(profile: Profile, job: JobSpec) -> None:
    """An account where the profile requires one (LUMI's SLURM refuses a job that names no project)."""
    if profile.require_account and not job.account:
        raise ValueError(f"{profile.name} needs the project to charge: add --account PROJECT (e.g. --account project_465000123), "
                         "or export SBATCH_ACCOUNT")


def _check_software(profile: Profile, job: JobSpec) -> None:
    """A software environment where the profile requires one (a container image, modules, a virtual environment or
    an explicit --no-container); --container and --no-container do not go together; module names are one word each."""
    if job.no_container and job.container:
        raise ValueError(f"--container {job.container} and --no-container contradict each other; keep one")
    for module in job.modules:
        if not module or not module.isprintable() or any(c.isspace() for c in module):
            raise ValueError(f"--module {module!r} must be one module name without spaces, e.g. --module PyTorch/2.7.1; repeat --module for several")
    named = _image(profile, job) or job.modules or job.venv or job.no_container
    if profile.require_software and not named:
        known = [p for p in profile.containers if p != "*"]
        images = f" (images it knows: {', '.join(known)})" if known else ""
        raise ValueError(
            f"{profile.name} runs Python from a software environment, and none was named (the host's python3 has no torch): "
            f"add --container IMAGE.sif{images}, --module NAME, --venv DIR, or --no-container to use the host's python3 as it is"
        )


def _gpus_per_node(profile: Profile, job: JobSpec) -> int:
    """GPUs per node (default: all of the profile's), at least 1 and no more than a node has."""
    gpus = profile.gpus_per_node if job.gpus_per_node is None else job.gpus_per_node
    if gpus < 1:
        raise ValueError(f"--gpus-per-node {gpus} must be at least 1")
    if gpus > profile.gpus_per_node:
        raise ValueError(
            f"--gpus-per-node {gpus} is more than a {profile.name} node has ({profile.gpus_per_node}); "
            f"use --gpus-per-node {profile.gpus_per_node} and --nodes {-(-job.nodes * gpus // profile.gpus_per_node)}"
        )
    return gpus


def _partition(profile: Profile, job: JobSpec, gpus: int) -> str:
    """The partition (default: the profile's for this many GPUs): one of the profile's, holding this many nodes."""
    partition = job.partition or profile.partition_for(gpus)
    part = profile.partition(partition)
    if part.max_nodes is not None and job.nodes > part.max_nodes:
        raise ValueError(f"--nodes {job.nodes} is more than partition {partition} allows ({part.max_nodes})")
    return partition


def _time_limit(job: JobSpec, partition: str, part: Partition) -> int:
    """--time in seconds, within the partition's limit."""
    time_s = parse_time(job.time)
    if part.max_time is not None and time_s > parse_time(part.max_time):
        raise ValueError(f"--time {job.time} is over partition {partition}'s limit of {part.max_time}; ask for at most that")
    return time_s


def _tasks_per_node(job: JobSpec, gpus: int) -> int:
    """Tasks per node: 1 with torchrun, one per GPU with srun (the default is that)."""
    expected_tasks = 1 if job.mode == "torchrun" else gpus
    tasks = job.tasks_per_node if job.tasks_per_node is not None else expected_tasks
    if job.mode == "torchrun" and tasks != 1:
        raise ValueError(
            f"torchrun mode with {tasks} tasks per node would start {tasks} torchruns per node, each with "
            f"{gpus} workers; use --ntasks-per-node 1 with torchrun, or --mode srun for one task per GPU"
        )
    if job.mode == "srun" and tasks != gpus:
        raise ValueError(f"srun mode starts one task per GPU: --ntasks-per-node must be {gpus}, not {tasks}")
    return tasks


def _check_cpus_per_gpu(profile: Profile, job: JobSpec) -> None:
    """--cpus-per-gpu, if asked for, is at least 1 and allowed by the profile."""
    if job.cpus_per_gpu is not None and job.cpus_per_gpu < 1:
        raise ValueError(f"--cpus-per-gpu {job.cpus_per_gpu} must be at least 1")
    if job.cpus_per_gpu is not None and profile.forbid_cpus_per_gpu:
        raise ValueError(
            f"--cpus-per-gpu is refused on {profile.name}: it breaks GPU-to-GPU communication there; "
            "gpuscale asks for --cpus-per-task instead"
        )


def _cpu_masks(profile: Profile, job: JobSpec, partition: str, whole_node: bool, gpus: int) -> list[str] | None:
    """srun mode's CPU masks: where the profile maps cores to GPUs and the job owns whole nodes (refused if asked
    for and impossible)."""
    masks = None
    if job.mode == "srun" and job.cpu_bind in ("auto", "masks"):
        if job.cpu_bind == "masks" and not profile.gpu_cores:
            raise ValueError(f"--cpu-bind masks needs the profile's gpu_cores map; {profile.name} has none")
        if job.cpu_bind == "masks" and not whole_node:
            raise ValueError(
                f"CPU masks need the whole node, but partition {partition} shares nodes; add --exclusive "
                f"or use partition {profile.full_node_partition}"
            )
        if profile.gpu_cores and whole_node:
            masks = profile.cpu_masks(gpus)
    return masks


def _cpus_per_task(profile: Profile, job: JobSpec, gpus: int) -> int:
    """Cores per task: a GPU's share in srun mode, the node's GPUs' shares (or the whole node) with torchrun."""
    per_gpu = job.cpus_per_gpu or profile.cpus_per_gpu()
    cpus_per_task = per_gpu if job.mode == "srun" else min(profile.cpus_per_node, per_gpu * gpus)
    if gpus == profile.gpus_per_node and job.mode == "torchrun":
        cpus_per_task = profile.cpus_per_node  # the whole node's usable cores for its one task
    return cpus_per_task


def _mem_per_gpu(profile: Profile, job: JobSpec, gpus: int) -> str | None:
    """Memory per GPU (default: the profile's), a SLURM size with its unit if given, within what a node has for a job
    (the profile's node_mem, if known)."""
    mem = job.mem_per_gpu or profile.mem_per_gpu
    if mem is not None and not MEMORY.match(mem):
        raise ValueError(f"--mem-per-gpu {mem!r} is not a SLURM size; write e.g. 60G or 4000M")
    if job.mem_per_gpu and job.mem_per_gpu.isdigit():
        raise ValueError(f"--mem-per-gpu {mem} has no unit, and SLURM reads {mem} megabytes; write {mem}G for gigabytes "
                         f"(or {mem}M if megabytes are meant)")
    per_gpu, node = memory_gb(mem), memory_gb(profile.node_mem)
    if per_gpu is not None and node is not None and per_gpu * gpus > node + 1e-9:
        most = f"{int(node // gpus)}G" if node >= gpus else f"{int(node * 1024 // gpus)}M"
        raise ValueError(f"--mem-per-gpu {mem} x {gpus} GPUs is more than a node of {profile.name} has for a job "
                         f"({profile.node_mem}); ask for at most {most} per GPU")
    return mem


def _mem_per_node(profile: Profile, job: JobSpec, gpus: int) -> str | None:
    """A whole-node job's memory per node (the profile's full_node_mem), unless the user asked for memory per GPU."""
    whole_nodes = gpus == profile.gpus_per_node or job.exclusive
    return profile.full_node_mem if whole_nodes and not job.mem_per_gpu else None


def _image(profile: Profile, job: JobSpec) -> str | None:
    """The container image (default: the profile's); --container needs a profile with a [container] table."""
    if job.no_container:
        return None
    image = job.container or (profile.container.image if profile.container else None)
    if job.container and profile.container is None:
        raise ValueError(f"--container needs a profile with a [container] table; {profile.name} has none")
    return image


def _check_env_names(job: JobSpec) -> None:
    """Every --env name is an environment variable's name."""
    for name, _value in job.env:
        if not ENV_NAME.match(name):
            raise ValueError(f"--env {name!r}: not a valid environment variable name (letters, digits, _)")


def _check_max_requeues(job: JobSpec) -> None:
    """--max-requeues is a whole number in 0..1000."""
    if not isinstance(job.max_requeues, int) or isinstance(job.max_requeues, bool) or not 0 <= job.max_requeues <= 1000:
        raise ValueError(f"--max-requeues {job.max_requeues!r} must be a whole number in 0..1000")


def _check_warning_fits(profile: Profile, job: JobSpec, time_s: int) -> None:
    """The job runs longer than the warning SLURM sends before its time limit (else it would stop at once)."""
    if time_s <= profile.warn_before_end_s:
        raise ValueError(
            f"--time {job.time} is not longer than the {profile.warn_before_end_s} s warning {profile.name} asks SLURM to send "
            "before the time limit (to checkpoint): the job would be told to stop at once; ask for more time, or "
            "--set warn_before_end_s=N with a smaller N"
        )


def _check_sbatch_values(job: JobSpec, partition: str) -> None:
    """Every user value that goes onto an #SBATCH line can be carried there safely."""
    for value, what in ((job.job_name, "--job-name"), (job.output, "--output"), (partition, "--partition")):
        _safe(value, what)
    for optional, what in ((job.account, "--account"), (job.reservation, "--reservation")):
        if optional is not None:
            _safe(optional, what)


def _safe(value: str, what: str) -> str:
    if not SBATCH_SAFE.match(value):
        raise ValueError(
            f"{what} {value!r} has characters SLURM's #SBATCH lines cannot carry safely; "
            "use letters, digits and _ . , : % @ / + = - only"
        )
    return value
