"""A cluster profile's SLURM partitions: whether each hands out whole nodes, its time and node limits, its billing.

A profile lists the partitions it knows in ``[partitions.NAME]`` tables (`gpuscale.slurm.profiles`). A generic profile
(``other_partitions = true``, as generic-nvidia) cannot know a site's partitions: any name given with --partition is
taken as `UNLISTED`, a partition that may share nodes and whose limits SLURM checks when the job is submitted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Any

from gpuscale.slurm.billing import Billing, billing_from_dict
from gpuscale.slurm.times import parse_time
from gpuscale.slurm.values import SBATCH_SAFE, check_keys

__all__ = ["Partition", "UNLISTED", "partitions_from_dict", "check_partitions", "table_name"]


@dataclass(frozen=True, kw_only=True)
class Partition:
    """A SLURM partition of the cluster."""

    whole_node: bool
    """True if jobs always get whole nodes (then CPU masks are safe without --exclusive)."""
    max_time: str | None = None
    """The partition's time limit (SLURM time); None where the profile does not know it (SLURM checks it)."""
    max_nodes: int | None = None
    """Most nodes one job may use, if limited."""
    billing: Billing | None = None
    """How the cluster bills a job here (`gpuscale.slurm.billing`), if the profile knows; its unit is the profile's."""


UNLISTED = Partition(whole_node=False)
"""A partition a generic profile does not list: it may share nodes (a job on every GPU of its nodes asks for
--exclusive), its limits are SLURM's to check."""

_KEYS = {f.name for f in fields(Partition)}


def table_name(partition: Any) -> str:
    """How the partition's table is written in TOML: [partitions.gpu], or quoted: [partitions."a b"]."""
    bare = isinstance(partition, str) and re.fullmatch(r"[A-Za-z0-9_-]+", partition)
    return f"[partitions.{partition}]" if bare else f"[partitions.{json.dumps(str(partition))}]"


def partitions_from_dict(data: Any, where: str) -> dict[str, Partition]:
    """The ``[partitions.NAME]`` tables of a profile's TOML, each checked (`check_partitions`)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: partitions must be tables, e.g. [partitions.gpu] with whole_node and max_time")
    partitions = {}
    for name, part in data.items():
        if not isinstance(part, dict):
            raise ValueError(f"{where}: {table_name(name)} must be a table")
        check_keys(part, _KEYS, f"{where} {table_name(name)}")
        if "whole_node" not in part:
            raise ValueError(f"{where} {table_name(name)}: needs whole_node (true if jobs there always get whole nodes)")
        if "billing" in part:
            part = {**part, "billing": billing_from_dict(part["billing"], f"{where} {table_name(name)}")}
        partitions[name] = Partition(**part)
    check_partitions(partitions, where)
    return partitions


def check_partitions(partitions: dict[str, Partition], where: str) -> None:
    """Each partition's name fits an #SBATCH line, its limits are SLURM's kind of values."""
    if not partitions:
        raise ValueError(f"{where}: needs at least one [partitions.NAME] table")
    for name, part in partitions.items():
        if not SBATCH_SAFE.match(name):
            raise ValueError(f"{where}: partition name {name!r} cannot go on an #SBATCH line; "
                             "use letters, digits and _ . , : % @ / + = - only")
        if part.max_time is not None:
            try:
                parse_time(part.max_time)
            except ValueError as exc:
                raise ValueError(f"{where} {table_name(name)}: max_time: {exc}") from None
        if not isinstance(part.whole_node, bool):
            raise ValueError(f"{where} {table_name(name)}: whole_node must be true or false")
        if part.max_nodes is not None and (not isinstance(part.max_nodes, int) or isinstance(part.max_nodes, bool) or part.max_nodes < 1):
            raise ValueError(f"{where} {table_name(name)}: max_nodes={part.max_nodes!r} must be a positive whole number")
