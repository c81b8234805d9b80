"""Placement: which device and which CPU cores each rank of this node gets (steps 2 and 3 of `gpuscale.init`).

`choose_device` picks the local rank's GPU (honouring CUDA_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES
set per task), or the CPU when torch sees none, saying once when SLURM granted GPUs that torch
cannot use. `plan_cores` decides the CPU binding: the cores next to each local rank's GPU (from the
cluster profile's map in GPUSCALE_GPU_CORES, else sysfs), disjoint shares of the allowed cores on a
CPU-only node, or what the launcher already chose (srun's binding, a taskset per process), or
nothing with ``bind="none"``. It only plans: `gpuscale.init` applies the plan and undoes it.
"""

from __future__ import annotations

import os

import torch

from gpuscale.env import DistEnv, device_index, visible_devices
from gpuscale.log import get_logger
from gpuscale.topology import BindingPlan, allowed_cores, gpu_local_cores, parse_gpu_core_map, plan_binding

__all__ = ["choose_device", "plan_cores", "GPU_CORES"]

GPU_CORES = "GPUSCALE_GPU_CORES"  # the cluster profile's GPU-to-cores map, exported by gpuscale's batch scripts

log = get_logger("runtime")


def choose_device(env: DistEnv, device: str) -> torch.device:
    """The device this rank trains on: 'auto' (its GPU if torch sees one, else CPU), 'cuda' or 'cpu'."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device={device!r} is not one of 'auto', 'cpu', 'cuda'")
    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if device == "cuda" and not has_gpu:
        raise ValueError("device='cuda' was asked for but torch sees no GPU; use device='auto' or 'cpu'")
    if device == "cpu" or not has_gpu:
        granted = next((f"{name}={os.environ[name]}" for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")
                        if os.environ.get(name)), None)
        if device == "auto" and granted and env.rank == 0:
            build = "a CPU-only build of torch" if torch.version.cuda is None and torch.version.hip is None else "no usable GPU"
            log.warning(
                "SLURM gave this job GPUs (%s) but torch sees none (%s); running on CPU with gloo, "
                "keeping SLURM's ranks and cores", granted, build,
            )
        return torch.device("cpu")
    index = device_index(env, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _gpu_cores_from_profile(env: DistEnv) -> list[list[int] | None] | None:
    """The cores next to each local rank's GPU from GPUSCALE_GPU_CORES ("49-55;57-63;..."), if set.

    gpuscale's batch scripts export the cluster profile's map there (the node's GPU order), so
    torchrun's workers bind by the profile even where sysfs does not tell the whole story.
    """
    text = os.environ.get(GPU_CORES)
    if not text:
        return None
    try:
        per_gpu = parse_gpu_core_map(text)
    except ValueError:
        raise ValueError(f"{GPU_CORES}={text!r} is not a ';'-separated list of core lists like 49-55;57-63") from None
    # The map is in the node's GPU order; SLURM may have given this job other GPUs than the first
    # ones (ROCR_VISIBLE_DEVICES=4,5): local rank i uses the i-th visible GPU.
    visible = visible_devices(os.environ)
    physical = [int(v) for v in visible] if visible and all(v.isdigit() for v in visible) else list(range(len(per_gpu)))
    if len(physical) < env.local_world_size or max(physical[: env.local_world_size]) >= len(per_gpu):
        raise ValueError(
            f"{GPU_CORES} lists {len(per_gpu)} GPUs, but this node's {env.local_world_size} local ranks use GPUs "
            f"{physical[: env.local_world_size]}; it needs one entry per GPU of the node"
        )
    return [per_gpu[gpu] for gpu in physical[: env.local_world_size]]


def _gpu_cores_for_local_ranks(env: DistEnv) -> list[list[int] | None] | None:
    """The cores next to each local rank's GPU, from sysfs; None if not knowable from here."""
    count = torch.cuda.device_count()
    if count < env.local_world_size:  # each task sees only its own GPU: cannot plan for the others
        return None
    cores = []
    for local_rank in range(env.local_world_size):
        props = torch.cuda.get_device_properties(local_rank)
        domain, bus, dev = (getattr(props, n, None) for n in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        cores.append(gpu_local_cores(f"{domain:04x}:{bus:02x}:{dev:02x}.0") if bus is not None else None)
    return cores


def plan_cores(env: DistEnv, device: torch.device, bind: str) -> BindingPlan:
    """The cores of every local rank of this node (`BindingPlan.for_rank`), and where that choice came from."""
    here = tuple(allowed_cores())
    if bind == "none":
        return BindingPlan((here,) * env.local_world_size, "none")
    if env.launcher == "slurm":
        unbound = os.environ.get("SLURM_CPU_BIND_TYPE", "").startswith("none")
        if not (unbound and env.local_world_size > 1):
            # srun placed every task already (--cpu-bind, masks, cgroups): keep what it chose.
            return BindingPlan((here,) * env.local_world_size, "launcher")
        # srun bound nothing (--cpu-bind=none: SLURM_CPU_BIND_TYPE=none), so every task sees the
        # whole allocation. Split it among this node's tasks, as for any other launcher. (Counting
        # cores against SLURM_CPUS_PER_TASK instead would misfire where a task gets both hardware
        # threads of its cores.)
    if len(here) < env.local_world_size and env.local_world_size > 1:
        # Fewer cores than siblings: whoever started us bound us already (taskset per process).
        return BindingPlan((here,) * env.local_world_size, "launcher", "fewer allowed cores than local ranks")
    gpu_cores = _gpu_cores_from_profile(env)
    if gpu_cores is None and device.type == "cuda":
        gpu_cores = _gpu_cores_for_local_ranks(env)
    return plan_binding(here, env.local_world_size, gpu_cores)
