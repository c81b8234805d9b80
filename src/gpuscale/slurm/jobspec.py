"""What the user asks of a batch job: `JobSpec`, and the launch modes and CPU bindings it may name.

`validate_job` (slurm.validate) checks a JobSpec against a profile; `render_sbatch` (slurm.render) writes its
batch script.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ClusterSide", "JobSpec", "MODES", "CPU_BINDS"]

MODES = ("torchrun", "srun")
CPU_BINDS = ("auto", "masks", "none")


@dataclass(frozen=True, kw_only=True)
class ClusterSide:
    """The cluster side of a job, whatever its shape: launch mode, time, account, container, binding, ...

    `JobSpec` (one job) and `gpuscale.slurm.cluster.ClusterOptions` (the CLI's options, shared by
    every cell of a study) both carry it, so each field is declared once, here."""

    mode: str = "torchrun"
    """'torchrun' (one task per node) or 'srun' (one task per GPU)."""
    time: str = "00:30:00"
    """Time limit (SLURM time)."""
    account: str | None = None
    """Project to charge (--account)."""
    partition: str | None = None
    """Partition (default: the profile's full- or partial-node partition)."""
    reservation: str | None = None
    """Reservation, as courses often have."""
    mem_per_gpu: str | None = None
    """Memory per GPU, e.g. 60G (default: the profile's)."""
    job_name: str = "gpuscale"
    """Job name (%x in the output pattern)."""
    container: str | None = None
    """Container image to run Python in (default: the profile's, if any)."""
    no_container: bool = False
    """Run the host's Python, no container (the profile's default image is not used): an explicit choice where the
    profile requires a software environment."""
    modules: tuple[str, ...] = ()
    """Modules to load in the batch shell before srun (`module load NAME`, in order), e.g. a site's PyTorch module."""
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment variables, exported in the job (values quoted)."""
    venv: str | None = None
    """A Python virtual environment to activate first."""
    exclusive: bool = False
    """Ask for whole nodes (needed for CPU masks on partitions that share nodes)."""
    cpu_bind: str = "auto"
    """srun mode: 'masks' (cores next to each GPU), 'none' (srun binds nothing; gpuscale splits the
    cores among the node's ranks itself), 'auto' (masks when the node is whole, else SLURM's default)."""
    cpus_per_gpu: int | None = None
    """Ask SLURM for --cpus-per-gpu (refused where the profile forbids it)."""
    python: str = "python3"
    """Python interpreter inside the job."""
    max_requeues: int = 10
    """Times the job requeues itself after its step stopped at a checkpoint (on SLURM's warning before the time
    limit, USR1, passed on only to scripts with a gpuscale.StopSignal), to resume from it; 0 never requeues (it
    still checkpoints). A TERM (scancel, preemption) stops at a checkpoint but never requeues. 10: each requeue
    follows a full time slot that ended at a checkpoint, so a job gets at most 11 slots of training."""

    def cluster_side(self) -> dict[str, object]:
        """These fields as keyword arguments (to build a `JobSpec` from options)."""
        return {f.name: getattr(self, f.name) for f in fields(ClusterSide)}


@dataclass(frozen=True, kw_only=True)
class JobSpec(ClusterSide):
    """What the user asks for; `render_sbatch` turns it into a batch script for a profile."""

    script: str
    """The training script, as the job will see its path."""
    script_args: tuple[str, ...] = ()
    """Arguments passed to the script."""
    nodes: int = 1
    """Number of nodes."""
    gpus_per_node: int | None = None
    """GPUs per node (default: all of the profile's)."""
    output: str = "%x-%j.out"
    """Where SLURM writes the job's output (%x name, %j id)."""
    tasks_per_node: int | None = None
    """Tasks per node; must be 1 with torchrun and one per GPU with srun (default: that)."""
    doctor: bool = False
    """Run `gpuscale doctor` on every rank first, launched like the training; the job ends there if a check fails."""
    probe_dir: str | None = None
    """Load gpuscale's probe (`gpuscale.measure.probe`) in every rank of the training, its records written here:
    a study's cells measure scripts that do not use gpuscale.Meter this way."""
