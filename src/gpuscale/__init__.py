"""gpuscale: one PyTorch training script, unchanged from 1 CPU to all GPUs of many nodes.

The library in ten lines (docs/training.md has the whole story):

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
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from gpuscale._version import __version__

# Where each public name lives. They are imported on first use (PEP 562), so that importing one
# light module of the package (`gpuscale.runtime.pinning`, which places a rank before its script imports
# torch) does not import torch and the whole library with it.
_HOMES = {
    "Checkpointer": "train.checkpoint", "ResumeState": "train.checkpoint",
    "BatchPlan": "runtime.data", "ShardedLoader": "runtime.data", "make_loader": "runtime.data", "plan_batch": "runtime.data",
    "DistEnv": "detect.env", "detect_env": "detect.env",
    "EpochLoop": "integrations.epochs",
    "get_logger": "detect.log", "print0": "detect.log", "progress": "detect.log",
    "ScaledLR": "train.lr", "scale_lr": "train.lr",
    "Average": "measure.metrics", "Meter": "measure.metrics", "all_reduce_max": "measure.metrics", "all_reduce_sum": "measure.metrics",
    "Runtime": "runtime.init", "current": "runtime.init", "init": "runtime.init", "already_reported": "runtime.failures",
    "Precision": "base.precision", "resolve_precision": "base.precision",
    "EXIT_STOPPED": "base.exits",
    "StopSignal": "train.preempt",
    "full_state_dict": "strategy", "no_sync": "strategy", "unwrap": "strategy", "wrap": "strategy",
    "Training": "train.step", "add_arguments": "train.step", "loader_options": "train.step", "setup": "train.step",
    "training_options": "train.step",
}

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from gpuscale.base.exits import EXIT_STOPPED
    from gpuscale.base.precision import Precision, resolve_precision
    from gpuscale.detect.env import DistEnv, detect_env
    from gpuscale.detect.log import get_logger, print0, progress
    from gpuscale.integrations.epochs import EpochLoop
    from gpuscale.measure.metrics import Average, Meter, all_reduce_max, all_reduce_sum
    from gpuscale.runtime.data import BatchPlan, ShardedLoader, make_loader, plan_batch
    from gpuscale.runtime.failures import already_reported
    from gpuscale.runtime.init import Runtime, current, init
    from gpuscale.strategy import full_state_dict, no_sync, unwrap, wrap
    from gpuscale.train.checkpoint import Checkpointer, ResumeState
    from gpuscale.train.lr import ScaledLR, scale_lr
    from gpuscale.train.preempt import StopSignal
    from gpuscale.train.step import Training, add_arguments, loader_options, setup, training_options


# Deep import paths that the README or the examples showed before the layers became folders, and where those
# modules live now: `import gpuscale.lr` and `from gpuscale.device_waits import find_device_waits` still work,
# and give the module itself (one module object under two names, so its classes and state are not doubled).
MOVED = {
    "gpuscale.training": "gpuscale.train.step", "gpuscale.lr": "gpuscale.train.lr", "gpuscale.hf": "gpuscale.integrations.hf",
    "gpuscale.device_waits": "gpuscale.measure.device_waits", "gpuscale.precision": "gpuscale.base.precision",
    "gpuscale.speed": "gpuscale.runtime.speed",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name of `MOVED` and loads it as the module at its new home."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: Any) -> None:
        """Nothing to run: `create_module` returned the module at its new home, already run."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


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
    "already_reported",
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
