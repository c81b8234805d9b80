"""What one rank can say about itself, as a plain dict for `gpuscale.doctor.checks` and `gpuscale.doctor.network`.

Read after `gpuscale.init()`, so the cores are the ones the rank really runs on (its affinity
now, whoever set it: gpuscale, srun's --cpu-bind, taskset) and the device is the one it trains on.
The environment is the one the rank started with (captured before init() fills in its defaults),
secrets masked. Reading only: nothing here changes the process.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpuscale.detect.env import relevant_environment, visible_devices
from gpuscale.detect.topology import allowed_cores, numa_node_of_pci, parse_cpulist
from gpuscale.doctor.gloonet import gloo_endpoint
from gpuscale.runtime.init import Runtime

__all__ = ["rank_facts", "core_numa_nodes", "SYSFS_NODES"]

SYSFS_NODES = Path("/sys/devices/system/node")
SYSFS_NET = Path("/sys/class/net")


def core_numa_nodes(cores: list[int], nodes_dir: Path = SYSFS_NODES) -> list[int]:
    """The NUMA nodes the given cores belong to (sorted), from sysfs; [] if the kernel does not say."""
    wanted, found = set(cores), set()
    try:
        entries = list(nodes_dir.glob("node[0-9]*"))
    except OSError:
        return []
    for node in entries:
        try:
            if wanted & set(parse_cpulist((node / "cpulist").read_text())):
                found.add(int(node.name[4:]))
        except (OSError, ValueError):
            continue
    return sorted(found)


def _gpu_identity(index: int) -> tuple[str, str | None]:
    """(a stable id of GPU `index` of this process: UUID or PCI address, its PCI address or None)."""
    props = torch.cuda.get_device_properties(index)
    domain, bus, dev = (getattr(props, n, None) for n in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    pci = f"{domain:04x}:{bus:02x}:{dev:02x}.0" if bus is not None and domain is not None and dev is not None else None
    uuid = getattr(props, "uuid", None)
    return (f"GPU-{uuid}" if uuid else pci or f"cuda:{index}"), pci


def _versions() -> dict[str, Any]:
    nccl = None
    if torch.cuda.is_available():
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception:  # no NCCL/RCCL in this build
            nccl = None
    try:
        deepspeed = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        deepspeed = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "nccl": nccl,
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "deepspeed": deepspeed,
    }


def rank_facts(rt: Runtime, environ_at_start: Mapping[str, str]) -> dict[str, Any]:
    """This rank's facts: placement, devices, versions and starting environment."""
    env = rt.env
    cores = allowed_cores()
    facts: dict[str, Any] = {
        "host": rt.host,
        "rank": env.rank,
        "local_rank": env.local_rank,
        "node_rank": env.node_rank,
        "world_size": env.world_size,
        "local_world_size": env.local_world_size,
        "launcher": env.launcher,
        "master": f"{env.master_addr}:{env.master_port}",
        "device": str(rt.device),
        "visible_devices": ",".join(visible_devices(environ_at_start) or []) or None,
        "gpu": None, "gpu_index": None, "gpu_pci": None, "gpu_numa": None, "gpus_seen": [],
        "gpus_allocated": int(environ_at_start["SLURM_GPUS_ON_NODE"]) if environ_at_start.get("SLURM_GPUS_ON_NODE", "").isdigit() else None,
        "cores": cores,
        "cores_numa": core_numa_nodes(cores),
        "threads": torch.get_num_threads(),
        "binding": rt.binding.source,
        "versions": _versions(),
        "has_tokenizers": importlib.util.find_spec("tokenizers") is not None,
        "interfaces": sorted(p.name for p in SYSFS_NET.iterdir()) if SYSFS_NET.is_dir() else [],
        "environ": relevant_environment(environ_at_start),
        "gloo": gloo_endpoint(environ_at_start, rt.host),
        "pid": os.getpid(),
    }
    if rt.device.type == "cuda":
        index = rt.device.index or 0
        facts["gpus_seen"] = [_gpu_identity(i)[0] for i in range(torch.cuda.device_count())]
        facts["gpu"], facts["gpu_pci"] = _gpu_identity(index)
        facts["gpu_numa"] = numa_node_of_pci(facts["gpu_pci"]) if facts["gpu_pci"] else None
        visible = visible_devices(environ_at_start)
        if visible is None:
            facts["gpu_index"] = index
        elif index < len(visible) and visible[index].isdigit():
            facts["gpu_index"] = int(visible[index])
        facts["device_name"] = torch.cuda.get_device_name(rt.device)
    else:
        facts["device_name"] = "cpu"
    return facts
