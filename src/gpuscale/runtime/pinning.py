"""Where a rank's cores are, decided before its script runs: for every script a gpuscale launcher starts.

gpuscale's start-up hook (``gpuscale/measure/probe/site/sitecustomize.py``, first on the PYTHONPATH of
every rank that `gpuscale run` and gpuscale's batch scripts start) calls `place_this_rank` before
the script's first line, so before it imports torch: a plain DDP, Accelerate or Lightning script
runs on the cores next to its GPU (disjoint shares of the allowed cores on a CPU-only node) with
its thread pools sized to them, exactly like a script that calls `gpuscale.init()`. Nothing here
imports torch (a test checks it): OpenMP reads OMP_NUM_THREADS once, when torch loads it, so the
thread count must be in the environment before that.

`plan_node` is the one decision, shared with `gpuscale.init()` (through `gpuscale.runtime.placement`). In order:

1. ``bind="none"`` (GPUSCALE_BIND=none): leave the affinity alone;
2. GPUSCALE_RANK_CORES, the plan `gpuscale run` computed for its workers ("even-split:0-3;4-7": how,
   then one core list per local rank), from torch's own view of the GPUs;
3. srun bound the task (its --cpu-bind, masks or cgroup): keep what it chose; likewise when a
   rank may use fewer cores than there are local ranks (someone bound each process already);
4. GPUSCALE_GPU_CORES, the cluster profile's GPU-to-cores map (gpuscale's batch scripts export it);
5. the cores next to each local rank's GPU from sysfs (here: the node's GPUs in PCI bus order,
   read without any GPU library, where no visibility variable restricts them; otherwise the hook
   leaves the rank to `gpuscale.init()`, which asks torch);
6. an even split of the allowed cores.

Thread pools: OMP_NUM_THREADS is set to the rank's core count unless the user set it (the
placeholder 1 that `gpuscale run` and the batch scripts give torchrun, marked by
GPUSCALE_OMP_FROM_LAUNCHER, does not count), and TOKENIZERS_PARALLELISM=false unless set.
On a node without GPUs, ACCELERATE_USE_CPU=true unless set (`distribute_on_cpus`): Accelerate and the HF Trainer then
distribute over the ranks, as under `accelerate launch --cpu`, and LOCAL_SIZE is the node's process count unless set
(DeepSpeed's CPU accelerator counts its devices from it: `count_cpu_devices_for_deepspeed`).
The rank notes ``GPUSCALE_PLACED=<pid>:<source>``: `gpuscale.init()` in the same process keeps
that placement, and the rank's own child processes (which inherit the variable) keep the cores
they inherit.

How this relates to torch's own ``torchrun --numa-binding`` (in recent torch, 2.13 here; CUDA only):
its modes bind each worker to the NUMA node (``node``), the socket (``socket``) or a disjoint share
of the NUMA node (``exclusive``) of the GPU whose index is the worker's local rank, from NVML.
``exclusive`` is what rule 5 does; gpuscale also knows a cluster map (rule 4, LUMI's GCDs), CPU-only
nodes, SLURM's own binding, and AMD GPUs. Use one or the other: under a torchrun started with
``--numa-binding``, set GPUSCALE_BIND=none (``gpuscale run --bind none``) so the two do not stack.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence

from gpuscale.detect.env import DistEnv, detect_env, visible_devices
from gpuscale.detect.topology import (
    BindingPlan,
    allowed_cores,
    format_cpulist,
    gpu_local_cores,
    parse_cpulist,
    parse_gpu_core_map,
    pci_gpus,
    plan_binding,
    set_affinity,
)

__all__ = ["RANK_CORES", "GPU_CORES", "PLACED", "OMP_FROM_LAUNCHER", "plan_node", "rank_cores_text",
           "placed_source", "place_this_rank", "size_thread_pools", "sysfs_gpu_cores", "gpus_known_only_to_torch",
           "GPU_DRIVER_FILES", "no_gpu_hardware", "no_gpu_here", "node_gpu_count", "distribute_on_cpus", "withdraw_cpu_flag",
           "DEEPSPEED_CPU_DEVICES", "count_cpu_devices_for_deepspeed"]

RANK_CORES = "GPUSCALE_RANK_CORES"
"""`gpuscale run`'s plan for its workers: how it was made, then one core list per local rank ("gpu-local:0-3;4-7")."""
GPU_CORES = "GPUSCALE_GPU_CORES"
"""The cluster profile's GPU-to-cores map, in the node's GPU order, exported by gpuscale's batch scripts."""
PLACED = "GPUSCALE_PLACED"
"""``<pid>:<source>``, set by the rank that placed itself before its script ran."""
OMP_FROM_LAUNCHER = "GPUSCALE_OMP_FROM_LAUNCHER"
"""Set where the launcher, not the user, put OMP_NUM_THREADS=1 (to quiet torchrun): a placeholder to resize."""

GpuCores = Callable[[], "list[list[int] | None] | None"]


def plan_node(env: DistEnv, bind: str, environ: Mapping[str, str], here: Sequence[int],
              gpu_cores: GpuCores) -> BindingPlan:
    """The cores of every local rank of this node (`BindingPlan.for_rank`), and where that choice came from.

    `here` is the cores this process may use now; `gpu_cores` gives the cores next to each local rank's
    GPU when nothing more explicit does (None on a CPU-only node or where unknown), asked only then.
    """
    here = tuple(here)
    size = env.local_world_size
    if bind == "none":
        return BindingPlan((here,) * size, "none")
    if environ.get(RANK_CORES):
        return _launcher_plan(environ[RANK_CORES], size)
    if env.launcher == "slurm" and not (environ.get("SLURM_CPU_BIND_TYPE", "").startswith("none") and size > 1):
        # srun placed every task already (--cpu-bind, masks, cgroups): keep what it chose. Only where it bound
        # nothing (--cpu-bind=none) does every task see the whole allocation, to be split as for any launcher.
        return BindingPlan((here,) * size, "launcher")
    if len(here) < size and size > 1:
        # Fewer cores than siblings: whoever started us bound us already (taskset per process, numactl).
        return BindingPlan((here,) * size, "launcher", "fewer allowed cores than local ranks")
    near = _gpu_cores_from_map(env, environ)
    if near is None:
        near = gpu_cores()
    return plan_binding(here, size, near)


def rank_cores_text(plan: BindingPlan) -> str:
    """A plan as `gpuscale run` hands it to its workers in GPUSCALE_RANK_CORES: how it was made, then each local
    rank's cores ("even-split:0-3;4-7")."""
    return f"{plan.source}:" + ";".join(format_cpulist(cores) for cores in plan.cores)


def _launcher_plan(text: str, size: int) -> BindingPlan:
    source, _, table = text.rpartition(":")
    try:
        rows = [tuple(parse_cpulist(part)) for part in table.split(";")]
    except ValueError:
        rows = []
    if source not in ("gpu-local", "even-split") or len(rows) != size or not all(rows):
        raise ValueError(f"{RANK_CORES}={text!r} does not give a core list for each of the {size} local ranks; "
                         f"it is gpuscale run's to set: unset it")
    return BindingPlan(tuple(rows), source)


def _gpu_cores_from_map(env: DistEnv, environ: Mapping[str, str]) -> list[list[int] | None] | None:
    """The cores next to each local rank's GPU from GPUSCALE_GPU_CORES ("49-55;57-63;..."), if set.

    The map is in the node's GPU order; SLURM may have given this job other GPUs than the first ones
    (ROCR_VISIBLE_DEVICES=4,5): local rank i uses the i-th visible GPU.
    """
    text = environ.get(GPU_CORES)
    if not text:
        return None
    try:
        per_gpu = parse_gpu_core_map(text)
    except ValueError:
        raise ValueError(f"{GPU_CORES}={text!r} is not a ';'-separated list of core lists like 49-55;57-63") from None
    return _by_visible_gpu(per_gpu, env, environ, GPU_CORES)


def _by_visible_gpu(per_gpu: list[list[int] | None], env: DistEnv, environ: Mapping[str, str],
                    source: str) -> list[list[int] | None]:
    visible = visible_devices(environ)
    ranks = env.local_world_size
    # local rank i uses the i-th visible GPU, or GPU i where no variable restricts them
    physical = [int(v) for v in visible] if visible and all(v.isdigit() for v in visible) else list(range(max(ranks, len(per_gpu))))
    if len(physical) < ranks or max(physical[:ranks]) >= len(per_gpu):
        raise ValueError(f"{source} lists {len(per_gpu)} GPUs, but this node's {ranks} local ranks use GPUs "
                         f"{physical[:ranks]}; it needs one entry per GPU of the node")
    return [per_gpu[gpu] for gpu in physical[:ranks]]


def sysfs_gpu_cores(env: DistEnv, environ: Mapping[str, str]) -> list[list[int] | None] | None:
    """The cores next to each local rank's GPU, from the node's GPUs in PCI bus order (sysfs); None where
    that cannot be known before torch starts: no GPU, GPUs restricted by a visibility variable (see
    `gpus_known_only_to_torch`), or fewer than the local ranks (then they train on CPU, or share GPUs)."""
    gpus = pci_gpus()
    if not gpus or visible_devices(environ) is not None or len(gpus) < env.local_world_size:
        return None
    return [gpu_local_cores(address) for address in gpus[:env.local_world_size]]


# What a loaded GPU driver leaves behind: NVIDIA's device files and kernel module (whose /dev files nvidia-modprobe may
# make only at the first CUDA call) and Jetson's, ROCm's kernel driver, WSL's GPU device
GPU_DRIVER_FILES = ("/dev/nvidia*", "/proc/driver/nvidia/gpus/*", "/sys/module/nvidia", "/dev/nvhost-ctrl-gpu",
                    "/dev/nvgpu", "/dev/kfd", "/dev/dxg")


def no_gpu_hardware() -> bool:
    """True where this node has no GPU at all, known without torch: none on its PCI bus (`pci_gpus`) and no trace of
    a GPU driver (`GPU_DRIVER_FILES`), whatever a visibility variable says."""
    import glob

    return not pci_gpus() and not any(glob.glob(pattern) for pattern in GPU_DRIVER_FILES)


def no_gpu_here(environ: Mapping[str, str]) -> bool:
    """True where this node has no GPU for torch to count, known without torch: `no_gpu_hardware`, and no visibility
    variable set (`visible_devices`)."""
    return no_gpu_hardware() and visible_devices(environ) is None


ACCELERATE_USE_CPU = "ACCELERATE_USE_CPU"
"""What `accelerate launch --cpu` sets: without it Accelerate (and the HF Trainer, which runs on it) leaves each of
the launcher's processes on its own on a node without GPUs (1.15: DistributedType.NO in a group with no backend), and
N ranks train N copies."""


ACCELERATE_CPU_SET = "GPUSCALE_SET_ACCELERATE_USE_CPU"
"""Set beside ACCELERATE_USE_CPU where gpuscale, not the user, set it: Accelerate turns DeepSpeed off under it, so
`gpuscale.integrations.hf.trainer_arguments` takes it back for a Trainer on DeepSpeed (`withdraw_cpu_flag`)."""


DEEPSPEED_CPU_DEVICES = "LOCAL_SIZE"
"""How many devices DeepSpeed's CPU accelerator counts on a node, as DeepSpeed's own launcher sets it (the node's
process count; torchrun and srun do not). Without it every `device_count()`, which ZeRO-3 calls at every step, runs
`numactl --hardware` in a subprocess, and each subprocess resets which warnings Python has shown: torch's deprecation
warnings for the collectives DeepSpeed calls then come at every step, two lines each, per rank (about 4 lines per rank
and step on torch 2.13)."""


def count_cpu_devices_for_deepspeed(local_world_size: int, environ: MutableMapping[str, str]) -> None:
    """Tell DeepSpeed's CPU accelerator the node's process count (`DEEPSPEED_CPU_DEVICES`) unless it is set."""
    environ.setdefault(DEEPSPEED_CPU_DEVICES, str(local_world_size))


def distribute_on_cpus(env: DistEnv, environ: MutableMapping[str, str]) -> bool:
    """On a node without GPUs, tell Accelerate and the HF Trainer to distribute over the launcher's ranks (gloo), as
    `accelerate launch --cpu` does, unless the user set ACCELERATE_USE_CPU; True where it did. (Accelerate then
    leaves DeepSpeed off: a script of one's own that gives the Trainer a DeepSpeed config on such a node sets
    ACCELERATE_USE_CPU=0; gpuscale's own Trainer arguments take it back themselves.) DeepSpeed's CPU accelerator
    is told the node's process count too (`count_cpu_devices_for_deepspeed`), also for one process."""
    if not no_gpu_hardware():
        return False
    count_cpu_devices_for_deepspeed(env.local_world_size, environ)
    if env.world_size <= 1 or ACCELERATE_USE_CPU in environ:
        return False
    environ[ACCELERATE_USE_CPU] = "true"
    environ[ACCELERATE_CPU_SET] = "1"
    return True


def withdraw_cpu_flag(environ: MutableMapping[str, str]) -> None:
    """Take back the ACCELERATE_USE_CPU that `distribute_on_cpus` set (not a user's): for a Trainer on DeepSpeed,
    which Accelerate would otherwise turn off."""
    if environ.pop(ACCELERATE_CPU_SET, None):
        environ.pop(ACCELERATE_USE_CPU, None)


def node_gpu_count(environ: Mapping[str, str]) -> int:
    """The GPUs torch sees on this node; 0 without importing torch (1-2 s) where `no_gpu_here`."""
    if no_gpu_here(environ):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpus_known_only_to_torch(environ: Mapping[str, str]) -> bool:
    """True on a GPU node whose GPUs a visibility variable restricts (SLURM's CUDA_VISIBLE_DEVICES=0,1 may
    number the job's own GPUs, not the node's): only torch can tell which PCI device each is, so the
    start-up hook leaves the binding to `gpuscale.init()`."""
    return bool(pci_gpus()) and bool(visible_devices(environ))


def placed_source(environ: Mapping[str, str] = os.environ) -> str | None:
    """How this very process was placed by the start-up hook (e.g. 'even-split'), or None if it was not."""
    pid, _, source = environ.get(PLACED, "").partition(":")
    return source if pid == str(os.getpid()) and source else None


def size_thread_pools(cores: int, environ: MutableMapping[str, str]) -> None:
    """OMP_NUM_THREADS = `cores` unless the user chose it; TOKENIZERS_PARALLELISM=false unless set."""
    if "OMP_NUM_THREADS" not in environ or environ.get(OMP_FROM_LAUNCHER):
        environ["OMP_NUM_THREADS"] = str(cores)
        environ.pop(OMP_FROM_LAUNCHER, None)  # sized now: whoever looks next sees a real choice
    environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def place_this_rank(environ: MutableMapping[str, str] = os.environ) -> BindingPlan | None:
    """Bind this rank to its cores and size its thread pools, before its script runs; the node's plan.

    Only in a rank (RANK set) that no one placed yet: not in torchrun's agent, not in a rank's own child
    processes (they inherit GPUSCALE_PLACED and their parent's cores). None when it did nothing.
    """
    if "RANK" not in environ or environ.get(PLACED):
        return None
    env = detect_env(environ)
    distribute_on_cpus(env, environ)
    bind = environ.get("GPUSCALE_BIND", "auto")
    if bind not in ("auto", "none"):
        raise ValueError(f"GPUSCALE_BIND={bind!r} is not one of 'auto', 'none'")
    if not (environ.get(RANK_CORES) or environ.get(GPU_CORES)) and env.launcher != "slurm" \
            and gpus_known_only_to_torch(environ):
        return None
    plan = plan_node(env, bind, environ, allowed_cores(), lambda: sysfs_gpu_cores(env, environ))
    cores = plan.for_rank(env.local_rank)
    if plan.note and env.local_rank == 0:
        print(f"gpuscale: CPU binding: {plan.note}", file=sys.stderr, flush=True)
    if plan.source in ("gpu-local", "even-split"):
        set_affinity(cores)
    if bind != "none":
        size_thread_pools(len(cores), environ)
    environ[PLACED] = f"{os.getpid()}:{plan.source}"
    return plan
