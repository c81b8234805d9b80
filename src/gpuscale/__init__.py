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

from gpuscale.checkpoint import Checkpointer, ResumeState
from gpuscale.data import BatchPlan, ShardedLoader, make_loader, plan_batch
from gpuscale.env import DistEnv, detect_env
from gpuscale.epochs import EpochLoop
from gpuscale.log import get_logger, print0, progress
from gpuscale.lr import ScaledLR, scale_lr
from gpuscale.metrics import Average, Meter, all_reduce_max, all_reduce_sum
from gpuscale.runtime import Runtime, current, init
from gpuscale.precision import Precision, resolve_precision
from gpuscale.exits import EXIT_STOPPED
from gpuscale.preempt import StopSignal
from gpuscale.strategy import full_state_dict, no_sync, unwrap, wrap
from gpuscale.training import Training, add_arguments, loader_options, setup, training_options

from gpuscale._version import __version__

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
