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

from gpuscale.detect.env import DistEnv, device_index
from gpuscale.detect.log import get_logger
from gpuscale.detect.topology import BindingPlan, allowed_cores, gpu_local_cores
from gpuscale.runtime.pinning import GPU_CORES, RANK_CORES, placed_source, plan_node

__all__ = ["choose_device", "plan_cores", "plan_for_workers", "GPU_CORES"]

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
    """The cores of every local rank of this node (`BindingPlan.for_rank`), and where that choice came from.

    The decision is `gpuscale.runtime.pinning.plan_node`'s, the same one gpuscale's start-up hook makes before a
    script runs; here torch tells which GPU each local rank has. A process the start-up hook placed
    already keeps its cores.
    """
    here = tuple(allowed_cores())
    placed = placed_source()
    if placed is not None:
        return BindingPlan((here,) * env.local_world_size, placed)
    return plan_node(env, bind, os.environ, here,
                     lambda: _gpu_cores_for_local_ranks(env) if device.type == "cuda" else None)


def plan_for_workers(nproc: int, nnodes: int, node_rank: int, bind: str, use_gpus: bool = True) -> BindingPlan:
    """The cores of each of the `nproc` workers a launcher (`gpuscale run`) is about to start on this node.

    The same decision as a worker's own, made once with torch's view of the GPUs (worker i uses GPU i
    when there are at least `nproc`); `gpuscale run` hands it to its workers in GPUSCALE_RANK_CORES
    (`gpuscale.runtime.pinning.rank_cores_text`), and each worker binds itself by it before its script runs.
    """
    env = DistEnv(rank=node_rank * nproc, local_rank=0, world_size=nproc * nnodes, local_world_size=nproc,
                  node_rank=node_rank, num_nodes=nnodes, master_addr="127.0.0.1", master_port=29500, launcher="torchrun")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = torch.device("cuda" if use_gpus and gpus >= nproc else "cpu")  # --nproc-per-node cpu: CPU workers
    environ = {k: v for k, v in os.environ.items() if k != RANK_CORES}  # the launcher decides afresh
    here = tuple(allowed_cores())
    return plan_node(env, bind, environ, here, lambda: _gpu_cores_for_local_ranks(env) if device.type == "cuda" else None)
