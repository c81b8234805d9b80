"""SLURM's compact lists, expanded: host lists (``nid[005001-005003],login1``) and tasks per node (``4(x2),3``).

Pure string functions: `gpuscale.detect.env` reads the ranks of an srun step with them; tests and tools
that need a job's node names use `expand_hostlist`.
"""

from __future__ import annotations

import re

__all__ = ["expand_hostlist", "tasks_per_node"]


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM hostlist expression: ``nid[005001-005003,005007],login1`` -> host names.

    Zero padding is kept (``nid[08-10]`` -> nid08, nid09, nid10). Several bracket groups in one
    name (``rack[1-2]-node[1-2]``) expand as a product, like ``scontrol show hostnames``.
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        hosts.extend(_expand_one(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def _expand_one(item: str) -> list[str]:
    match = re.search(r"\[([^\]]+)\]", item)
    if not match:
        return [item]
    prefix, suffix = item[: match.start()], item[match.end() :]
    names: list[str] = []
    for part in match.group(1).split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            width = len(lo)
            names.extend(f"{n:0{width}d}" for n in range(int(lo), int(hi) + 1))
        else:
            names.append(part)
    return [host for name in names for host in _expand_one(prefix + name + suffix)]


def tasks_per_node(spec: str) -> list[int]:
    """Expand SLURM's tasks-per-node notation: ``"4(x2),3"`` -> [4, 4, 3]."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ValueError(f"cannot read SLURM tasks-per-node value {spec!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
