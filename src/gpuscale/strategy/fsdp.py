"""Strategy ``fsdp``: parameters, gradients and optimizer states sharded over ranks (FSDP2, `fully_shard`).

Each rank keeps 1/N of every sharded unit and gathers a unit's full parameters just for its
forward and backward pass; gradients are reduce-scattered. That moves about 1.5x DDP's bytes per
step (docs/measuring.md, the prediction) and divides the model's memory by N.

Units: the blocks a model declares unsplittable (HF models' ``_no_split_modules``), else every
child of a ModuleList or Sequential that holds parameters; then the root. FSDP2 keeps the
original parameters (as DTensors), so parameters unfrozen later simply start receiving sharded
gradients: no re-wrap is needed, and `wrap` again is a no-op.

Checkpoints are sharded: every rank writes its own shards with torch.distributed.checkpoint
(DCP) into one directory, so no rank ever holds the whole model; resuming reads them back, also on
another number of ranks. `gpuscale consolidate` turns such a directory into one plain state dict.
`full_state_dict` (for inference, or a small model) gathers everything on rank 0 instead. With a
single process the model is left unsharded and a checkpoint is one plain file, as DDP's: it resumes on
more ranks too (its optimizer state, numbered in the optimizer's order, is renamed by parameter).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from gpuscale.base.precision import Precision
from gpuscale.runtime import sharded
from gpuscale.runtime.init import Runtime
from gpuscale.strategy.base import ScriptStep

__all__ = ["FSDPStrategy"]


def _units(module: nn.Module) -> list[nn.Module]:
    """The sub-modules to shard as units, innermost first (fully_shard needs children before parents)."""
    names = set(getattr(module, "_no_split_modules", None) or ())
    if names:
        units = [m for m in module.modules() if type(m).__name__ in names]
    else:
        units = [
            child
            for container in module.modules()
            if isinstance(container, (nn.ModuleList, nn.Sequential))
            for child in container.children()
            if any(True for _ in child.parameters())
        ]
    seen: set[int] = set()
    ordered = []
    for unit in reversed(units):  # modules() is outer-first; shard inner units first
        if id(unit) not in seen and unit is not module:
            seen.add(id(unit))
            ordered.append(unit)
    return ordered


def _full_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDPStrategy(ScriptStep):
    """Shard parameters, gradients and optimizer states over all ranks (torch FSDP2)."""

    name = "fsdp"
    sharded = True
    reshards = True  # torch.distributed.checkpoint reshards on load
    channels_last_ok = False  # FSDP2 keeps flat, contiguous shards and refuses other strides
    fused_by_default = False

    def sync_probe_blocker(self, model: nn.Module) -> str | None:
        """A sharded model cannot be replayed; one process leaves the model unsharded, and that one can."""
        if not hasattr(model, "set_requires_gradient_sync"):  # not an FSDP2 module
            return None
        return ("fsdp: a replay without reduce-scatter leaves unsharded gradients that the next step would "
                "reduce, so it cannot be taken without changing training")

    def forward_context(self, model: nn.Module, last_micro_batch: bool) -> AbstractContextManager[Any]:
        """Nothing: FSDP2 decides in the backward pass whether to reduce-scatter (`ScriptStep.backward`)."""
        return nullcontext()

    def wrap(self, module: nn.Module, rt: Runtime, precision: Precision | None = None) -> nn.Module:
        """Shard `module` over all ranks; `precision` (a `gpuscale.base.precision.Precision`) sets the
        dtype units compute in (gradients are still reduced in fp32)."""
        from torch.distributed.fsdp import FSDPModule, fully_shard

        module = module.to(rt.device)
        if not any(p.requires_grad for p in module.parameters()):
            raise ValueError("the model has no trainable parameters; unfreeze some before gpuscale.wrap")
        if not rt.is_distributed or isinstance(module, FSDPModule):
            return module  # one process: nothing to shard; already sharded: FSDP2 needs no re-wrap
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(rt.device.type, (rt.world_size,))
        options: dict[str, Any] = {"mesh": mesh}
        policy = precision.fsdp_policy() if precision is not None else None
        if policy is not None:
            options["mp_policy"] = policy
        for unit in _units(module):
            fully_shard(unit, **options)
        fully_shard(module, **options)
        return module

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        if not _is_sharded(model):
            return model.state_dict()
        return get_model_state_dict(model, options=_full_options())  # collective; full on rank 0

    def load_state_dict(self, model: nn.Module, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if not _is_sharded(model):
            model.load_state_dict(state)
            return
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        if not _is_sharded(model):
            return optimizer.state_dict()
        return get_optimizer_state_dict(model, optimizer, options=_full_options())

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if not _is_sharded(model):
            optimizer.load_state_dict(state)
            return
        state = _keyed_by_name(model, optimizer, state)
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))

    def writes_checkpoint(self, rt: Runtime) -> bool:
        return rt.rank == 0

    def save_sharded(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, directory: str) -> None:
        """Every rank writes its shards of model and optimizer into `directory` (collective)."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._sharded_state(model, optimizer), checkpoint_id=directory)

    def load_sharded(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, directory: str) -> None:
        """Read this rank's shards back from a directory written by `save_sharded` (collective)."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict


        state = self._sharded_state(model, optimizer)
        sharded.load(state, directory, no_dist=not (dist.is_available() and dist.is_initialized()))
        set_model_state_dict(model, state["model"])
        if optimizer is not None:
            set_optimizer_state_dict(model, optimizer, state["optimizer"])

    @staticmethod
    def _sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        state: dict[str, Any] = {"model": get_model_state_dict(model)}
        if optimizer is not None:
            state["optimizer"] = get_optimizer_state_dict(model, optimizer)
        return state


def _is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _keyed_by_name(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """A full optimizer state keyed by parameter name, as set_optimizer_state_dict(full_state_dict=True) reads it.

    One process writes the optimizer's own ``optimizer.state_dict()``, which numbers the parameters
    in the optimizer's order (as DDP and plain runs do); sharded ranks key states by name. A numbered
    state is renamed by that order, which the same script gives the optimizer on any number of ranks,
    to the names torch itself gives this optimizer's parameters (read locally: no collective).
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    groups = state["param_groups"]
    if all(isinstance(pid, str) for group in groups for pid in group["params"]):
        return state  # keyed by name already (written by sharded ranks)
    names = [group["params"] for group in get_optimizer_state_dict(model, optimizer)["param_groups"]]
    if [len(group["params"]) for group in groups] != [len(group) for group in names]:
        raise ValueError(
            f"the checkpoint's optimizer has {[len(g['params']) for g in groups]} parameters per group and this "
            f"one {[len(g) for g in names]}; build the optimizer over the same parameters, in the same groups"
        )
    name_of = {
        pid: name
        for group, named in zip(groups, names, strict=True)
        for pid, name in zip(group["params"], named, strict=True)
    }
    return {
        "state": {name_of[pid]: value for pid, value in state["state"].items()},
        "param_groups": [{**group, "params": named} for group, named in zip(groups, names, strict=True)],
    }
