"""Where am I? Pure detectors that turn an environment mapping into one frozen `DistEnv`.

Nothing here changes the process: every function takes the environment as a mapping (usually
``os.environ``) and returns a value or raises `ValueError` with what was found and how to fix it.
`gpuscale.init()` is the one place that acts on the result.

Launchers, in the order they win:

``torchrun``
    torchrun's elastic agent (also `gpuscale run`) sets RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID. When torchrun
    runs inside a SLURM allocation, its variables win over SLURM's.
``slurm``
    an ``srun`` step: each task is a rank. SLURM's per-task variables count only inside a step
    (SLURM_STEP_ID is set); in the batch shell they describe the batch script, not a rank. Ranks
    set by hand from SLURM's variables (the course's ``RANK=\\$SLURM_PROCID``) are checked
    against them. gpuscale's srun-mode batch scripts give every task torchrun's variables too
    (GROUP_RANK, TORCHELASTIC_RUN_ID, ...: scripts read the same names in every mode) and mark it
    with GPUSCALE_SRUN_TASK=1, so that such a task still counts as srun's: srun placed it on its cores.
``manual``
    RANK and WORLD_SIZE set by hand outside SLURM (two shells on a workstation, a custom
    launcher). LOCAL_RANK defaults to RANK and LOCAL_WORLD_SIZE to WORLD_SIZE (one node) unless set.
``single``
    none of the above: one process, no process group.

The rendezvous address must be a node of the job: rank 0's host name (on SLURM the first node of
the step, which is what gpuscale uses when MASTER_ADDR is unset). A wildcard address (0.0.0.0,
``::``, ``*``, an empty value) names no host; ranks connecting to it reach whatever listens on
their own machine. `check_master_addr` refuses it, in every detector and for ``--master-addr``.

The rendezvous port, when nobody set MASTER_PORT, is derived from the SLURM job id the way the
course does it (``1`` followed by the job id's last four digits) so that jobs sharing a node do not
collide on 29500.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from gpuscale.detect.secrets import mask_secrets
from gpuscale.detect.slurmlists import expand_hostlist, tasks_per_node

__all__ = [
    "DistEnv",
    "LAUNCHERS",
    "detect_env",
    "expand_hostlist",
    "port_from_job_id",
    "tasks_per_node",
    "visible_devices",
    "device_index",
    "check_one_launcher_per_node",
    "check_master_addr",
    "relevant_environment",
    "SRUN_TASK_MARKER",
]

LAUNCHERS = ("torchrun", "slurm", "manual", "single")
DEFAULT_PORT = 29500


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """Where this process sits in the job. Produced by `detect_env`; never mutated."""

    rank: int
    """Global rank of this process, 0 .. world_size-1."""
    local_rank: int
    """Rank among the processes on this node; picks the GPU."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int
    """Number of processes on this node."""
    node_rank: int
    """Index of this node in the job, 0 .. num_nodes-1."""
    num_nodes: int
    """Number of nodes in the job."""
    master_addr: str
    """Host of rank 0, where the process group meets."""
    master_port: int
    """TCP port of the rendezvous on master_addr."""
    launcher: str
    """Who started this process: one of LAUNCHERS."""
    job_id: str | None = None
    """SLURM job id when inside a SLURM job."""

    def __post_init__(self) -> None:
        assert self.launcher in LAUNCHERS, self.launcher
        assert 0 <= self.rank < self.world_size, (self.rank, self.world_size)
        assert 0 <= self.local_rank < self.local_world_size, (self.local_rank, self.local_world_size)
        assert 0 <= self.node_rank < self.num_nodes, (self.node_rank, self.num_nodes)

    @property
    def is_distributed(self) -> bool:
        """True when there is more than one process, i.e. a process group is needed."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that prints, logs and writes shared files."""
        return self.rank == 0


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"{name} is not set; it is needed to place this process")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; set it to a whole number") from None


def check_master_addr(addr: str, source: str = "MASTER_ADDR") -> str:
    """Return `addr` if it can name rank 0's host; ValueError for a wildcard or empty address. Pure.

    0.0.0.0 and ``::`` (in any spelling: ``[::]``, ``0``, ``0:0::0``) mean "every interface" to a
    server and nothing to a client, ``*`` is a bind wildcard, an empty value is a script whose
    ``$(...)`` came back empty. `source` names where the value came from (``--master-addr``).
    """
    text = addr.strip()
    unspecified = text in ("", "*")
    if not unspecified:
        try:
            unspecified = ipaddress.ip_address(text.strip("[]")).is_unspecified
        except ValueError:
            try:  # the short IPv4 forms inet_aton accepts: "0", "0.0", "00.0.0.0"
                unspecified = bool(re.fullmatch(r"[0-9.]+", text)) and socket.inet_aton(text) == bytes(4)
            except OSError:
                unspecified = False
    if unspecified:
        raise ValueError(
            f"{source}={addr!r} is a wildcard address, not a host the ranks can reach; set it to the host name of node 0 "
            "(on SLURM: $(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed -n 1p))"
        )
    return addr


def port_from_job_id(job_id: str | int) -> int:
    """The rendezvous port for a SLURM job: ``1`` + the job id's last four digits (10000-19999).

    The course derives the port this way so that two jobs on one node pick different ports.
    """
    digits = re.sub(r"\D", "", str(job_id))
    if not digits:
        raise ValueError(f"SLURM job id {job_id!r} has no digits to derive a port from; set MASTER_PORT")
    return int("1" + digits[-4:].rjust(4, "0"))


def _in_slurm_step(environ: Mapping[str, str]) -> bool:
    # The batch shell also has SLURM_PROCID=0 and SLURM_NTASKS; only a step (srun) has a step id.
    return "SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ


SRUN_TASK_MARKER = "GPUSCALE_SRUN_TASK"
"""Set to 1 by gpuscale's srun-mode batch scripts in every task, beside the torchrun variables they export."""


def _is_torchrun(environ: Mapping[str, str]) -> bool:
    """torchrun's agent sets TORCHELASTIC_RUN_ID and GROUP_RANK; an srun task that carries them for its script
    says so by SRUN_TASK_MARKER, and is srun's (its cores, its ranks) all the same."""
    if environ.get(SRUN_TASK_MARKER, "").strip() not in ("", "0"):
        return False
    return "TORCHELASTIC_RUN_ID" in environ or "GROUP_RANK" in environ


def _master_addr(environ: Mapping[str, str]) -> str | None:
    """MASTER_ADDR, checked, if it is set at all (an empty value is refused: it names no host)."""
    return check_master_addr(environ["MASTER_ADDR"]) if "MASTER_ADDR" in environ else None


def _port(environ: Mapping[str, str]) -> int:
    if environ.get("MASTER_PORT"):
        port = _int(environ, "MASTER_PORT")
    elif environ.get("SLURM_JOB_ID"):
        port = port_from_job_id(environ["SLURM_JOB_ID"])
    else:
        port = DEFAULT_PORT
    if not 1 <= port <= 65535:
        raise ValueError(f"MASTER_PORT={port} is not a TCP port; choose one in 1024-65535")
    return port


def detect_env(environ: Mapping[str, str]) -> DistEnv:
    """Return where this process sits in the job, from an environment mapping. Pure.

    Raises ValueError for contradictions: a hand-set WORLD_SIZE or RANK that disagrees with the
    srun step, several torchruns started by srun on one node, ranks out of range.
    """
    if _is_torchrun(environ):
        env = _detect_torchrun(environ)
    elif _in_slurm_step(environ):
        env = _detect_slurm(environ)
    elif "RANK" in environ or "WORLD_SIZE" in environ:
        env = _detect_manual(environ)
    else:
        env = DistEnv(
            rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1,
            master_addr="127.0.0.1", master_port=_port(environ), launcher="single",
            job_id=environ.get("SLURM_JOB_ID"),
        )
    return env


def _check_ranks(rank: int, local_rank: int, world_size: int, local_world_size: int, source: str) -> None:
    if world_size < 1:
        raise ValueError(f"WORLD_SIZE={world_size} from {source}; it must be at least 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} is outside 0..{world_size - 1} (WORLD_SIZE={world_size}) from {source}")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(
            f"LOCAL_RANK={local_rank} is outside 0..{local_world_size - 1} "
            f"(LOCAL_WORLD_SIZE={local_world_size}) from {source}"
        )


def check_one_launcher_per_node(environ: Mapping[str, str], workers_per_launcher: int | None = None) -> None:
    """Refuse a launcher (torchrun, `gpuscale run`) started by srun several times on one node.

    With ``--ntasks-per-node=8`` and torchrun in each task, 8 launchers each start their own
    workers: 64 processes fighting over 8 GPUs (docs/clusters.md, launch modes). One task per node is right for torchrun.
    """
    if not _in_slurm_step(environ):
        return
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    if spec and max(tasks_per_node(spec)) > 1:
        raise ValueError(
            f"a launcher was started by srun {max(tasks_per_node(spec))} times on one node "
            f"(SLURM_STEP_TASKS_PER_NODE={spec}), so each one starts "
            f"{f'{workers_per_launcher} ' if workers_per_launcher else ''}workers of its own; "
            "use one task per node with torchrun / gpuscale run (--ntasks-per-node=1), "
            "or drop the launcher and let srun start one task per GPU"
        )


def _detect_torchrun(environ: Mapping[str, str]) -> DistEnv:
    world_size = _int(environ, "WORLD_SIZE")
    rank = _int(environ, "RANK")
    local_rank = _int(environ, "LOCAL_RANK")
    local_world_size = _int(environ, "LOCAL_WORLD_SIZE", default=world_size)
    _check_ranks(rank, local_rank, world_size, local_world_size, "torchrun")
    check_one_launcher_per_node(environ, local_world_size)
    num_nodes = max(1, world_size // local_world_size)
    node_rank = _int(environ, "GROUP_RANK", default=rank // local_world_size)
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world_size, local_world_size=local_world_size,
        node_rank=min(node_rank, num_nodes - 1), num_nodes=num_nodes,
        master_addr=_master_addr(environ) or "127.0.0.1", master_port=_port(environ),
        launcher="torchrun", job_id=environ.get("SLURM_JOB_ID"),
    )


def _detect_slurm(environ: Mapping[str, str]) -> DistEnv:
    rank = _int(environ, "SLURM_PROCID")
    local_rank = _int(environ, "SLURM_LOCALID")
    world_size = _int(environ, "SLURM_STEP_NUM_TASKS", default=_int(environ, "SLURM_NTASKS", default=1))
    node_rank = _int(environ, "SLURM_NODEID", default=0)
    num_nodes = _int(environ, "SLURM_STEP_NUM_NODES", default=_int(environ, "SLURM_NNODES", default=1))
    per_node_spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    per_node = tasks_per_node(per_node_spec) if per_node_spec else [world_size]
    local_world_size = per_node[node_rank] if node_rank < len(per_node) else per_node[-1]

    # Variables set by hand in the batch script must agree with what srun gave this task.
    for name, found in (("WORLD_SIZE", world_size), ("RANK", rank), ("LOCAL_RANK", local_rank)):
        if name in environ and _int(environ, name) != found:
            slurm_name = {"WORLD_SIZE": "SLURM_NTASKS", "RANK": "SLURM_PROCID", "LOCAL_RANK": "SLURM_LOCALID"}[name]
            hint = (
                f"it was probably expanded once by the batch shell; write {name}=\\${slurm_name} "
                "(escaped, so each task expands its own) or leave it unset: gpuscale reads SLURM's variables"
                if name != "WORLD_SIZE"
                else "the srun step has a different number of tasks; make --ntasks match or leave WORLD_SIZE unset"
            )
            raise ValueError(f"{name}={environ[name]} but this srun task has {slurm_name}={found}: {hint}")
    _check_ranks(rank, local_rank, world_size, local_world_size, "the srun step")
    if not 0 <= node_rank < num_nodes:
        raise ValueError(f"SLURM_NODEID={node_rank} is outside 0..{num_nodes - 1} (SLURM_STEP_NUM_NODES={num_nodes}); "
                         "is this a step of another job's allocation?")

    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if "MASTER_ADDR" in environ:
        master_addr = check_master_addr(environ["MASTER_ADDR"])
    elif nodelist:
        master_addr = expand_hostlist(nodelist)[0]
    else:
        master_addr = socket.gethostname() if num_nodes == 1 else ""
        if not master_addr:
            raise ValueError("cannot find the first node of this multi-node step: SLURM_STEP_NODELIST is unset; set MASTER_ADDR")
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world_size, local_world_size=local_world_size,
        node_rank=node_rank, num_nodes=num_nodes, master_addr=master_addr, master_port=_port(environ),
        launcher="slurm", job_id=environ.get("SLURM_JOB_ID"),
    )


def _detect_manual(environ: Mapping[str, str]) -> DistEnv:
    missing = [name for name in ("RANK", "WORLD_SIZE") if name not in environ]
    if missing:
        raise ValueError(
            f"{' and '.join(missing)} not set while {'WORLD_SIZE' if 'RANK' in missing else 'RANK'} is; "
            "set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT together (or none of them for one process)"
        )
    world_size = _int(environ, "WORLD_SIZE")
    rank = _int(environ, "RANK")
    local_world_size = _int(environ, "LOCAL_WORLD_SIZE", default=world_size)
    for name, value in (("WORLD_SIZE", world_size), ("LOCAL_WORLD_SIZE", local_world_size)):
        if value < 1:
            raise ValueError(f"{name}={value} was set by hand; it must be at least 1")
    local_rank = _int(environ, "LOCAL_RANK", default=rank % local_world_size)
    _check_ranks(rank, local_rank, world_size, local_world_size, "hand-set variables")
    if world_size % local_world_size:
        raise ValueError(
            f"WORLD_SIZE={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size}; "
            "set LOCAL_WORLD_SIZE to the number of processes on each node"
        )
    if world_size > 1 and "MASTER_ADDR" not in environ:
        raise ValueError(
            f"WORLD_SIZE={world_size} was set by hand but MASTER_ADDR was not; set MASTER_ADDR to rank 0's host "
            "(and MASTER_PORT to a free port) in every process"
        )
    return DistEnv(
        rank=rank, local_rank=local_rank, world_size=world_size, local_world_size=local_world_size,
        node_rank=rank // local_world_size, num_nodes=world_size // local_world_size,
        master_addr=(_master_addr(environ) if world_size > 1 else environ.get("MASTER_ADDR")) or "127.0.0.1",
        master_port=_port(environ), launcher="single" if world_size == 1 else "manual", job_id=environ.get("SLURM_JOB_ID"),
    )


def visible_devices(environ: Mapping[str, str]) -> list[str] | None:
    """The GPU ids this process may see, from ROCR/HIP/CUDA_VISIBLE_DEVICES, or None if unrestricted.

    On AMD, ROCR_VISIBLE_DEVICES is applied first and HIP_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES index
    into what it left; the innermost (last applied) restriction decides how many devices remain.
    """
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if name in environ:
            devices = []
            for entry in (d.strip() for d in environ[name].split(",")):
                if not entry or entry.startswith("-"):
                    break  # like the CUDA runtime: an invalid entry ends the list ("-1" hides all)
                devices.append(entry)
            return devices
    return None


def device_index(env: DistEnv, num_visible: int) -> int:
    """Which of the visible GPUs this rank uses.

    With as many visible GPUs as local ranks (or more) it is the local rank. With exactly one
    visible GPU it is that GPU when each process can have its own view: one process per node, or
    srun (``--gpus-per-task=1`` shows each task its own GPU as device 0) or hand-set variables.
    torchrun's workers share one environment, so one visible GPU for several of them would put
    them all on it. Anything that leaves a local rank without a GPU is an error on every rank alike.
    """
    if num_visible < 1:
        raise ValueError("no GPU is visible to this process; check CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES")
    if num_visible == 1 and (env.local_world_size == 1 or env.launcher in ("slurm", "manual")):
        return 0
    if env.local_world_size > num_visible:
        raise ValueError(
            f"LOCAL_RANK={env.local_rank} of {env.local_world_size} processes on this node, but only "
            f"{num_visible} GPU{'s' if num_visible != 1 else ''} {'are' if num_visible != 1 else 'is'} visible; "
            f"start at most {num_visible} processes per node "
            "(--nproc-per-node / --ntasks-per-node) or make more GPUs visible"
        )
    return env.local_rank


# What decides where ranks run and how they talk: launchers, GPU runtimes, collectives, thread
# pools, gpuscale itself, and the Hugging Face stack of the examples.
ENV_PREFIXES = ("SLURM_", "CUDA_", "HIP_", "ROCR_", "ROCM_", "NCCL_", "RCCL_", "GLOO_", "FI_", "MIOPEN_", "TORCH",
                "PYTORCH_", "OMP_", "KMP_", "MKL_", "GPUSCALE_", "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TOKENIZERS_",
                "MASTER_")
ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "ROLE_NAME")


def relevant_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables `gpuscale env` and `gpuscale doctor` show, sorted by name, secrets masked. Pure."""
    chosen = {k: v for k, v in environ.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    return dict(sorted(mask_secrets(chosen).items()))
