"""What a job costs in its cluster's billing units, from the billing rule its profile keeps. Pure.

A profile that knows its cluster's rule names the unit and where the rule is published, and gives each
partition its rate (lumi-g.toml; docs/billing.md has LUMI's rule, its source and a worked check):

    billing_unit = "GPU-hours"
    billing_source = "https://docs.lumi-supercomputer.eu/runjobs/lumi_env/billing/"
    [partitions.standard-g.billing]     # whole nodes are billed, whatever the job uses of them
    node_hour = 4.0                     #   units per node per hour
    [partitions.small-g.billing]        # billed per slice of a node; a job holds the most slices of
    slice_hour = 0.5                    #   units per slice per hour
    slice_gpus = 1                      #   its GPUs / slice_gpus,
    slice_cores = 8                     #   ceil(its cores / slice_cores),
    slice_mem_gb = 64                   #   ceil(its memory in GB / slice_mem_gb), counted over the whole job

A job that owns whole nodes on a partition billed by slices (``--exclusive``, or all GPUs of a node, which
gpuscale asks to own) holds all of each node's slices. The time billed is the job's elapsed time, start-up
included: `units` takes it from the caller (a run's time to result, a predicted time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpuscale.slurm.values import check_keys, memory_gb

__all__ = ["Billing", "Allocation", "billing_from_dict", "check_billing", "units_per_hour", "rule_words", "allocation_of_plan",
           "default_allocation", "record_for"]



@dataclass(frozen=True, kw_only=True)
class Billing:
    """One partition's billing rule: per whole node (`node_hour`), or per slice (`slice_hour` and the slice's size)."""

    node_hour: float | None = None
    slice_hour: float | None = None
    slice_gpus: int = 1
    slice_cores: int | None = None
    slice_mem_gb: float | None = None

    def check(self, where: str) -> None:
        """ValueError, in one line, unless exactly one rate is given and every figure is positive."""
        if (self.node_hour is None) == (self.slice_hour is None):
            raise ValueError(f"{where}: give one of node_hour (whole nodes billed) and slice_hour (billed per slice)")
        for key in ("node_hour", "slice_hour", "slice_gpus", "slice_cores", "slice_mem_gb"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf):
                raise ValueError(f"{where}: {key}={value!r} must be a positive number")


_KEYS = ("node_hour", "slice_hour", "slice_gpus", "slice_cores", "slice_mem_gb")


def billing_from_dict(data: Any, where: str) -> Billing:
    """A partition's ``billing`` table, checked."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: billing must be a table, e.g. billing = {{ node_hour = 4.0 }}")
    check_keys(data, set(_KEYS), f"{where} billing")
    rule = Billing(**data)
    rule.check(where)
    return rule


def check_billing(unit: Any, source: Any, billed: list[str], where: str) -> None:
    """A profile's billing_unit and billing_source are one line of text each; partitions with a rule (`billed`, their
    tables) need the unit."""
    for key, value in (("billing_unit", unit), ("billing_source", source)):
        if value is not None and not (isinstance(value, str) and value.strip() and value.isprintable()):
            raise ValueError(f"{where}: {key}={value!r} must be text on one line, e.g. {key} = \"...\"")
    if billed and not unit:
        raise ValueError(f"{where}: {billed[0]} has a billing rule but the profile names no billing_unit; "
                         "add e.g. billing_unit = \"GPU-hours\" (and billing_source, where the rule is published)")


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """What one job holds: its partition, nodes, and on each node its GPUs, cores and memory (None: the whole node's)."""

    partition: str
    nodes: int
    gpus_per_node: int
    cores_per_node: int
    mem_gb_per_node: float | None
    whole_nodes: bool


def allocation_of_plan(profile: Any, plan: Any, nodes: int) -> Allocation:
    """What a rendered job asks for (`gpuscale.slurm.validate.JobPlan`)."""
    whole = bool(plan.exclusive) or profile.partition(plan.partition).whole_node
    cores = plan.tasks_per_node * plan.cpus_per_task
    if plan.mem_per_node is not None:
        mem = memory_gb(plan.mem_per_node)
    else:
        per_gpu = memory_gb(plan.mem_per_gpu)
        mem = None if per_gpu is None else per_gpu * plan.gpus_per_node
    return Allocation(partition=plan.partition, nodes=nodes, gpus_per_node=plan.gpus_per_node, cores_per_node=cores,
                      mem_gb_per_node=mem, whole_nodes=whole)


def default_allocation(profile: Any, nodes: int, gpus_per_node: int) -> Allocation:
    """What gpuscale's batch script asks for by default on `profile` for `gpus_per_node` GPUs on each node: the
    profile's partition for that share, its cores per GPU and memory per GPU (a job of every GPU owns its nodes)."""
    partition = profile.partition_for(gpus_per_node)
    whole = gpus_per_node >= profile.gpus_per_node or profile.partition(partition).whole_node
    per_gpu = memory_gb(profile.mem_per_gpu)
    return Allocation(partition=partition, nodes=nodes, gpus_per_node=gpus_per_node,
                      cores_per_node=profile.cpus_per_gpu() * gpus_per_node,
                      mem_gb_per_node=None if per_gpu is None else per_gpu * gpus_per_node, whole_nodes=whole)


def units_per_hour(profile: Any, alloc: Allocation) -> float | None:
    """Billing units one hour of the job costs; None where the profile has no rule for its partition."""
    part = profile.partitions.get(alloc.partition)
    rule: Billing | None = getattr(part, "billing", None)
    if rule is None or not getattr(profile, "billing_unit", None):
        return None
    if rule.node_hour is not None:
        return rule.node_hour * alloc.nodes
    assert rule.slice_hour is not None
    if alloc.whole_nodes:
        gpus, cores, mem = profile.gpus_per_node, profile.cpus_per_node, None
    else:
        gpus, cores, mem = alloc.gpus_per_node, alloc.cores_per_node, alloc.mem_gb_per_node
    slices = [math.ceil(gpus * alloc.nodes / rule.slice_gpus)]
    if rule.slice_cores:
        slices.append(math.ceil(cores * alloc.nodes / rule.slice_cores))
    if rule.slice_mem_gb and mem is not None:
        slices.append(math.ceil(mem * alloc.nodes / rule.slice_mem_gb - 1e-9))
    return rule.slice_hour * max(slices)


def rule_words(profile: Any, partition: str) -> str | None:
    """The partition's rule in words: "small-g: 0.5 GPU-hours an hour per slice of 1 GPU, 8 cores or 64 GB (...)"."""
    rule: Billing | None = getattr(profile.partitions.get(partition), "billing", None)
    unit = getattr(profile, "billing_unit", None)
    if rule is None or not unit:
        return None
    if rule.node_hour is not None:
        return f"{partition}: {rule.node_hour:g} {unit} per node-hour (whole nodes)"
    sizes = [f"{rule.slice_gpus:g} GPU" + ("s" if rule.slice_gpus != 1 else "")]
    if rule.slice_cores:
        sizes.append(f"{rule.slice_cores:g} cores")
    if rule.slice_mem_gb:
        sizes.append(f"{rule.slice_mem_gb:g} GB of memory")
    sizes_text = sizes[0] if len(sizes) == 1 else f"{', '.join(sizes[:-1])} or {sizes[-1]}, whichever makes more slices"
    return f"{partition}: {rule.slice_hour:g} {unit} per hour for each slice of {sizes_text}"


def record_for(profile: Any, alloc: Allocation) -> dict[str, Any] | None:
    """What a run keeps of its cost (billing.json): the unit, the units per hour, the rule in words and its source."""
    rate = units_per_hour(profile, alloc)
    if rate is None:
        return None
    return {"unit": profile.billing_unit, "per_hour": rate, "partition": alloc.partition, "nodes": alloc.nodes,
            "gpus_per_node": alloc.gpus_per_node, "rule": rule_words(profile, alloc.partition),
            "source": getattr(profile, "billing_source", None)}
