"""Which CPU cores sit next to which GPU, and which cores each local rank should be bound to.

A process bound to cores far from its GPU copies every batch across the socket interconnect, and
two ranks sharing cores fight over them (data-loader workers included). `plan_binding` is a pure
function from what the node offers (the cores this process may use, the cores next to each local
rank's GPU) to one core set per local rank; every local rank computes the same plan and takes its
own row. The cores next to a GPU come from sysfs (``local_cpulist`` of its PCI device, NVIDIA and
AMD alike) or from a cluster profile's map (LUMI's GCD-to-cores table).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BindingPlan",
    "parse_cpulist",
    "format_cpulist",
    "parse_gpu_core_map",
    "split_evenly",
    "plan_binding",
    "allowed_cores",
    "gpu_local_cores",
    "numa_node_of_pci",
    "pci_gpus",
    "set_affinity",
]

SYSFS_PCI = Path("/sys/bus/pci/devices")


@dataclass(frozen=True)
class BindingPlan:
    """Cores for every local rank of a node, and how they were chosen."""

    cores: tuple[tuple[int, ...], ...]
    """cores[local_rank]: the CPU ids that rank is bound to."""
    source: str
    """'gpu-local' (cores next to each GPU), 'even-split' (disjoint shares of the allowed cores),
    'launcher' (kept as the launcher set it), or 'none' (binding switched off)."""
    note: str | None = None
    """Why the plan is not ideal (shared cores, GPU topology unknown), or None."""

    def for_rank(self, local_rank: int) -> tuple[int, ...]:
        return self.cores[local_rank]


def parse_cpulist(text: str) -> list[int]:
    """Parse the kernel's cpulist format: ``"0-3,8,10-11"`` -> [0, 1, 2, 3, 8, 10, 11]."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            step = 1
            if ":" in hi:  # "0-15:2" strides appear in some kernels' lists
                hi, stride = hi.split(":", 1)
                step = int(stride.split("/")[0])
            cores.update(range(int(lo), int(hi) + 1, step))
        else:
            cores.add(int(part))
    return sorted(cores)


def parse_gpu_core_map(text: str) -> list[list[int] | None]:
    """The cores next to each GPU of a node, in GPU order: ``"49-55;57-63;;1-7"`` -> [[49..55], [57..63], None, [1..7]].

    An empty entry means unknown. Raises ValueError on anything that is not core lists separated by ';'.
    """
    return [parse_cpulist(part) or None for part in text.split(";")]


def format_cpulist(cores: Sequence[int]) -> str:
    """The inverse of `parse_cpulist`: [0, 1, 2, 3, 8] -> ``"0-3,8"``."""
    ordered = sorted(set(cores))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def split_evenly(cores: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """Split cores into `parts` disjoint contiguous shares; the first shares get one more if uneven.

    With fewer cores than parts, shares cannot be disjoint: share i gets core i mod len(cores).
    """
    ordered = sorted(set(cores))
    if parts < 1:
        raise ValueError(f"cannot split cores into {parts} parts")
    if not ordered:
        raise ValueError("no CPU cores to split")
    if len(ordered) < parts:
        return [(ordered[i % len(ordered)],) for i in range(parts)]
    base, extra = divmod(len(ordered), parts)
    shares, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        shares.append(tuple(ordered[start : start + size]))
        start += size
    return shares


def plan_binding(
    allowed: Sequence[int],
    local_world_size: int,
    gpu_cores: Sequence[Sequence[int] | None] | None = None,
) -> BindingPlan:
    """Choose disjoint cores for each local rank. Pure.

    allowed: the cores this node's processes may use (the affinity they were started with).
    gpu_cores: for each local rank, the cores next to its GPU (None if unknown), or None on a
    CPU-only node. Ranks whose GPUs share the same nearby cores (several GPUs on one socket) split
    those cores among themselves. If any rank's nearby cores are unknown or outside `allowed`, the
    plan falls back to an even split of `allowed`, with a note saying why.
    """
    allowed_set = set(allowed)
    if len(allowed_set) < local_world_size:
        shares = split_evenly(sorted(allowed_set), local_world_size)
        return BindingPlan(
            tuple(shares), "even-split",
            f"{local_world_size} local ranks share {len(allowed_set)} cores; ranks share cores",
        )
    if gpu_cores is None:
        return BindingPlan(tuple(split_evenly(sorted(allowed_set), local_world_size)), "even-split")

    if len(gpu_cores) != local_world_size:
        raise ValueError(f"gpu_cores has {len(gpu_cores)} entries for {local_world_size} local ranks")
    near = [frozenset(c) & allowed_set if c is not None else frozenset() for c in gpu_cores]
    if not all(near):
        unknown = [r for r, cores in enumerate(near) if not cores]
        return BindingPlan(
            tuple(split_evenly(sorted(allowed_set), local_world_size)), "even-split",
            f"no allowed cores known next to the GPU of local rank(s) {unknown}; split the allowed cores evenly",
        )
    groups: dict[frozenset[int], list[int]] = {}
    for rank, cores in enumerate(near):
        groups.setdefault(cores, []).append(rank)
    plan: list[tuple[int, ...]] = [()] * local_world_size
    notes = []
    claimed: set[int] = set()
    for cores, ranks in groups.items():
        # Overlapping neighbourhoods (odd firmware tables): a core goes to the first GPU claiming it.
        free = sorted(cores - claimed)
        if not free:
            return BindingPlan(
                tuple(split_evenly(sorted(allowed_set), local_world_size)), "even-split",
                f"the cores next to the GPUs of local ranks {ranks} are taken by other GPUs; split the allowed cores evenly",
            )
        if len(free) < len(ranks):
            notes.append(f"local ranks {ranks} share {len(free)} cores next to their GPUs")
        elif len(free) < len(cores):
            notes.append(f"GPUs of local ranks {ranks} share nearby cores with other GPUs; gave them {format_cpulist(free)}")
        claimed |= cores
        for rank, share in zip(ranks, split_evenly(free, len(ranks)), strict=True):
            plan[rank] = share
    return BindingPlan(tuple(plan), "gpu-local", "; ".join(notes) or None)


def check_cpu_processes(nproc: int, cores: int, option: str, otherwise: str = "") -> None:
    """Refuse `nproc` CPU processes on fewer `cores` (ValueError naming the option and the fix): processes sharing
    cores spin in gloo's waits, and 4 of them on this project's 2 cores trained 7x slower than 2.
    `gpuscale run` and `gpuscale study` refuse alike; `otherwise` is the caller's way round it, if it has one."""
    if nproc > cores:
        raise ValueError(f"{option} asks for {nproc} CPU processes but this process may use {cores} cores; on CPUs every "
                         f"process needs a core of its own (processes sharing cores spin in gloo's waits): "
                         f"use at most {cores}{otherwise}")


def allowed_cores() -> list[int]:
    """The cores this process may run on now (its affinity: cgroup, taskset or srun binding)."""
    return sorted(os.sched_getaffinity(0))


def _pci_path(pci_bus_id: str) -> Path:
    # torch and NVML report "00000000:1B:00.0" (8-digit domain); sysfs names it "0000:1b:00.0".
    parts = pci_bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    domain, bus, devfn = parts
    return SYSFS_PCI / f"{int(domain, 16):04x}:{bus}:{devfn}"


def gpu_local_cores(pci_bus_id: str) -> list[int] | None:
    """The cores next to a PCI device (its ``local_cpulist`` in sysfs), or None if unknown."""
    try:
        text = (_pci_path(pci_bus_id) / "local_cpulist").read_text()
    except OSError:
        return None
    cores = parse_cpulist(text)
    return cores or None


GPU_VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD"}
"""PCI vendor ids of the GPUs gpuscale places ranks next to."""
GPU_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")
"""PCI classes a GPU shows as: VGA, 3D controller (data-centre NVIDIA), display controller (AMD Instinct),
processing accelerator. An NVIDIA GPU's audio function (0x0403) or an NVSwitch (0x0680) is none of them."""


def pci_gpus(root: Path = SYSFS_PCI) -> list[str]:
    """The PCI addresses of this node's NVIDIA and AMD GPUs, in bus order (torch's order on a node of
    identical GPUs: CUDA breaks its fastest-first ties by bus id, ROCm enumerates by bus), from sysfs
    without loading any GPU library; [] where there are none or sysfs does not say."""
    found = []
    try:
        devices = sorted(root.iterdir())
    except OSError:
        return []
    for device in devices:
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            kind = (device / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor in GPU_VENDORS and kind[:6] in GPU_CLASSES:
            found.append(device.name)
    return found


def numa_node_of_pci(pci_bus_id: str) -> int | None:
    """The NUMA node of a PCI device, or None if the kernel does not say (-1 or missing)."""
    try:
        node = int((_pci_path(pci_bus_id) / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def set_affinity(cores: Sequence[int]) -> None:
    """Bind this process and all its threads that exist now (and so the ones they start) to `cores`."""
    target = set(cores)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, target)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that ended meanwhile
