"""gpuscale: one PyTorch training script, unchanged from 1 CPU to all GPUs of many nodes.

The library in ten lines (see README.md for the whole story):

    import gpuscale

    with gpuscale.init() as rt:                                  # ranks, device, cores, process group
        plan = gpuscale.plan_batch(32, rt.world_size, scaling="strong")   # exact global batch
        train = gpuscale.make_loader(train_set, plan)            # sharded; epochs reshuffle by themselves
        training = gpuscale.setup(Net(), lambda p: torch.optim.AdamW(p), plan=plan,
                                  strategy="ddp")               # or "fsdp", "deepspeed"; precision="auto"
        meter = gpuscale.Meter(plan)
        for epoch in range(10):
            for x, y in meter.iter(train):                       # data wait, samples, steps
                training.backward(loss_fn(training.model(x), y)); training.step()
        meter.write_summary("out", final_loss=loss)              # summary.json on rank 0
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpuscale._version import __version__

# Where each public name lives. They are imported on first use (PEP 562), so that importing one
# light module of the package (`gpuscale.pinning`, which places a rank before its script imports
# torch) does not import torch and the whole library with it.
_HOMES = {
    "Checkpointer": "checkpoint", "ResumeState": "checkpoint",
    "BatchPlan": "data", "ShardedLoader": "data", "make_loader": "data", "plan_batch": "data",
    "DistEnv": "env", "detect_env": "env",
    "EpochLoop": "epochs",
    "get_logger": "log", "print0": "log", "progress": "log",
    "ScaledLR": "lr", "scale_lr": "lr",
    "Average": "metrics", "Meter": "metrics", "all_reduce_max": "metrics", "all_reduce_sum": "metrics",
    "Runtime": "runtime", "current": "runtime", "init": "runtime",
    "Precision": "precision", "resolve_precision": "precision",
    "EXIT_STOPPED": "exits",
    "StopSignal": "preempt",
    "full_state_dict": "strategy", "no_sync": "strategy", "unwrap": "strategy", "wrap": "strategy",
    "Training": "training", "add_arguments": "training", "loader_options": "training", "setup": "training",
    "training_options": "training",
}

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from gpuscale.checkpoint import Checkpointer, ResumeState
    from gpuscale.data import BatchPlan, ShardedLoader, make_loader, plan_batch
    from gpuscale.env import DistEnv, detect_env
    from gpuscale.epochs import EpochLoop
    from gpuscale.exits import EXIT_STOPPED
    from gpuscale.log import get_logger, print0, progress
    from gpuscale.lr import ScaledLR, scale_lr
    from gpuscale.metrics import Average, Meter, all_reduce_max, all_reduce_sum
    from gpuscale.precision import Precision, resolve_precision
    from gpuscale.preempt import StopSignal
    from gpuscale.runtime import Runtime, current, init
    from gpuscale.strategy import full_state_dict, no_sync, unwrap, wrap
    from gpuscale.training import Training, add_arguments, loader_options, setup, training_options


def __getattr__(name: str) -> Any:
    """`gpuscale.init`, `gpuscale.Meter`, ...: the public name, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gpuscale' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gpuscale.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])



__all__ = [
    "Average",
    "BatchPlan",
    "Checkpointer",
    "DistEnv",
    "EpochLoop",
    "Meter",
    "Precision",
    "ResumeState",
    "Runtime",
    "ScaledLR",
    "Training",
    "ShardedLoader",
    "StopSignal",
    "EXIT_STOPPED",
    "add_arguments",
    "all_reduce_max",
    "all_reduce_sum",
    "current",
    "detect_env",
    "full_state_dict",
    "get_logger",
    "init",
    "loader_options",
    "make_loader",
    "no_sync",
    "plan_batch",
    "print0",
    "progress",
    "resolve_precision",
    "scale_lr",
    "setup",
    "training_options",
    "unwrap",
    "wrap",
    "__version__",
]
