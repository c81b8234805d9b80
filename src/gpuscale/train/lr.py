"""Learning-rate scaling: keep accuracy when more devices make the global batch larger.

Weak scaling keeps each device's batch, so N devices train with an N times larger global batch:
N times fewer optimizer steps per epoch, each averaging more samples. At the learning rate tuned
for the small batch the model then moves N times less far per epoch and ends less accurate (the
dogs-vs-cats example at global batch 256 instead of 32: validation accuracy 0.60 instead of 0.95;
0.93 with the linear rule).
`scale_lr` scales the learning rate with the global batch and can warm it up gradually:

    plan = gpuscale.plan_batch(32, rt.world_size, scaling="weak")    # global batch 32 x N
    scaled = gpuscale.scale_lr(0.003, plan, rule="linear", warmup_steps=5)
    training = gpuscale.setup(model, lambda p: torch.optim.SGD(p, lr=scaled.lr, momentum=0.9), plan=plan)
    scheduler = scaled.scheduler(training.optimizer)                 # a LambdaLR: the warm-up
    for x, y in loader:
        ...
        training.backward(loss)
        if training.step():                                          # once per optimizer step
            scheduler.step()
    meter.write_summary(out, lr=scaled.as_dict())                    # which rule, which factor

Rules (factor = how much larger the learning rate gets):

- ``linear``: factor = global batch / base batch (Goyal et al. 2017, "Accurate, Large Minibatch
  SGD"): k times the batch, k times the learning rate, so an epoch moves the weights as far as
  before. The rule to start from for SGD with momentum.
- ``sqrt``: factor = sqrt(global batch / base batch): keeps the variance of the update the same
  (Krizhevsky 2014; often used with Adam). More conservative than linear.
- ``none``: factor = 1, the learning rate as given (what a script without gpuscale does).

``base_batch`` is the global batch ``base_lr`` was tuned for. By default it is the global batch the
same plan has on one device: ``per_device_batch x grad_accum_steps`` under weak scaling (so 1
device keeps base_lr, N devices get the factor of N) and ``global_batch`` under strong scaling
(the global batch does not change with the devices, so neither does the learning rate). Pass it
when the learning rate was tuned for another batch, e.g. ``base_batch=32`` for a strong-scaling
run with a global batch of 256.

Warm-up (Goyal et al.'s "gradual warm-up"): a large learning rate at the very first steps, while
the weights are far from any minimum, can throw the training off for good. With
``warmup_steps=W`` the learning rate rises linearly from ``base_lr`` at step 0 to the scaled
``lr`` at step W and stays there: ``lr_at(step)``. Goyal et al. warmed up over 5 of 90 epochs at
factors up to 32. Warm-up costs steps at less than the full rate: when the scaled rate trains
stably from the start it only loses accuracy (the dogs-vs-cats example at 8 x its batch, 56 steps
in all: 0.932 without warm-up, 0.931 with 3 steps, 0.900 with 14; batch 32 reaches 0.951), so
the default is none; turn it on for large factors or when the first epochs' loss jumps. ``scheduler(optimizer)`` applies it to a torch
optimizer as a `torch.optim.lr_scheduler.LambdaLR`; step it once per optimizer step (when
`Training.step()` returns True), and save it in checkpoints with
``Checkpointer.save(..., scheduler=scheduler)`` / ``Checkpointer.resume(..., scheduler=scheduler)``
so that a resumed run continues the warm-up where it stopped. A script with a schedule of its own
(cosine decay, the HF Trainer's linear decay) uses ``scaled.lr`` as its peak instead.

Other learning rates of the same script (a fine-tuning phase's, a second parameter group's) scale
by the same factor: ``scaled.scale(1e-5)``.

On the command line, `add_arguments(parser)` adds ``--lr-scaling {none,linear,sqrt}`` (default
none: the script's learning rate unchanged), ``--lr-warmup-steps N`` (default 0: no warm-up; a
script may choose its own default) and ``--lr-base-batch N``; ``scale_lr(lr, plan,
**lr_options(args))`` applies them.

Bad input (an unknown rule, a learning rate that is not a positive finite number, a negative
warm-up, a base batch that is not a positive integer) raises ValueError with one line saying
what was wrong and what is valid; a plan that is not a `BatchPlan`, TypeError.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gpuscale.runtime.data import BatchPlan

__all__ = ["RULES", "ScaledLR", "add_arguments", "lr_options", "scale_lr"]

RULES = ("none", "linear", "sqrt")


@dataclass(frozen=True, kw_only=True)
class ScaledLR:
    """A learning rate scaled for a batch plan, with its warm-up; built by `scale_lr`."""

    rule: str
    """The scaling rule: 'none', 'linear' or 'sqrt'."""
    base_lr: float
    """The learning rate as tuned for `base_batch` (where the warm-up starts)."""
    lr: float
    """The learning rate to train with: base_lr x factor (where the warm-up ends)."""
    factor: float
    """lr / base_lr: global/base (linear), sqrt(global/base) (sqrt) or 1 (none)."""
    base_batch: int
    """The global batch base_lr was tuned for."""
    global_batch: int
    """The global batch of the plan: samples per optimizer step over all ranks."""
    warmup_steps: int
    """Optimizer steps over which the learning rate rises linearly from base_lr to lr (0: none)."""

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0 = the first): base_lr rising linearly to lr over
        warmup_steps steps, then lr."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step {step!r} must be a non-negative integer (optimizer steps taken so far)")
        if step >= self.warmup_steps:
            return self.lr
        return self.base_lr + (self.lr - self.base_lr) * step / self.warmup_steps

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        """A LambdaLR that makes `optimizer`'s learning rate follow `lr_at`; step it once per optimizer step.

        The optimizer must have been built with ``lr=self.lr``: each parameter group's learning
        rate is multiplied by lr_at(step) / lr, so a group with its own learning rate keeps its
        ratio to the others. Raises ValueError when no group has lr (an optimizer built with
        base_lr would otherwise warm up to base_lr x base_lr / lr, silently).
        """
        rates = [group.get("initial_lr", group["lr"]) for group in optimizer.param_groups]
        if not any(math.isclose(rate, self.lr, rel_tol=1e-9) for rate in rates):
            raise ValueError(f"the optimizer's learning rates are {rates}, none the scaled lr {self.lr:g}; build it with "
                             "lr=scaled.lr before attaching scaled.scheduler(optimizer)")
        lr, lr_at = self.lr, self.lr_at

        def multiplier(step: int) -> float:  # a plain function: LambdaLR's state_dict then stays plain data
            return lr_at(step) / lr

        return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)

    def scale(self, other_lr: float) -> float:
        """Another learning rate of the same script (a fine-tuning phase's, say) scaled by the same factor."""
        return _positive_lr(other_lr, "learning rate") * self.factor

    def as_dict(self) -> dict[str, Any]:
        """Every field, for summary.json."""
        return asdict(self)

    def describe(self) -> str:
        """One line for the log: the learning rate, where it came from, the warm-up."""
        if self.rule == "none" or self.factor == 1:
            source = f"lr {self.lr:g} (rule {self.rule}: global batch {self.global_batch}, base batch {self.base_batch})"
        else:
            source = (f"lr {self.lr:g} = {self.base_lr:g} x {self.factor:.4g} ({self.rule} rule: global batch "
                      f"{self.global_batch} / base batch {self.base_batch})")
        warmup = f", warm-up from {self.base_lr:g} over {self.warmup_steps} steps" if self.warmup_steps and self.factor != 1 else ""
        return source + warmup


def _positive_lr(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} {value!r} must be a positive finite number")
    return float(value)


def _base_batch(plan: BatchPlan, base_batch: Any) -> int:
    """The global batch base_lr was tuned for: as given, or the plan's global batch on one device."""
    if base_batch is None:
        return plan.per_device_batch * plan.grad_accum_steps if plan.scaling == "weak" else plan.global_batch
    if isinstance(base_batch, bool) or not isinstance(base_batch, int) or base_batch < 1:
        raise ValueError(f"base batch {base_batch!r} must be a positive integer (the global batch the learning rate "
                         "was tuned for), or None for the plan's global batch on one device")
    return base_batch


def _factor(rule: str, global_batch: int, base_batch: int) -> float:
    if rule == "linear":
        return global_batch / base_batch
    if rule == "sqrt":
        return math.sqrt(global_batch / base_batch)
    return 1.0


def scale_lr(base_lr: float, plan: BatchPlan, rule: str = "linear", warmup_steps: int = 0,
             base_batch: int | None = None) -> ScaledLR:
    """Scale `base_lr`, tuned for a global batch of `base_batch`, to the global batch of `plan`.

    rule: 'linear' (factor global/base), 'sqrt' (sqrt(global/base)) or 'none' (1).
    warmup_steps: optimizer steps over which the learning rate rises from base_lr to the scaled lr.
    base_batch: default, the global batch the plan has on one device (per-device batch x
    accumulation under weak scaling; the global batch under strong scaling, so that strong
    scaling keeps the learning rate). See the module docstring.
    """
    if rule not in RULES:
        raise ValueError(f"learning-rate scaling rule {rule!r} is not one of: {', '.join(RULES)}")
    if not isinstance(plan, BatchPlan):
        raise TypeError(f"plan must be a gpuscale.BatchPlan (from gpuscale.plan_batch), not {type(plan).__name__}")
    base_lr = _positive_lr(base_lr, "base learning rate")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warm-up steps {warmup_steps!r} must be a non-negative integer (0: no warm-up)")
    base = _base_batch(plan, base_batch)
    factor = _factor(rule, plan.global_batch, base)
    return ScaledLR(rule=rule, base_lr=base_lr, lr=base_lr * factor, factor=factor, base_batch=base,
                    global_batch=plan.global_batch, warmup_steps=warmup_steps)


# --- command line -------------------------------------------------------------------------------


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser, *, default_warmup_steps: int | None = 0) -> None:
    """Add the 'learning rate (gpuscale)' options: --lr-scaling, --lr-warmup-steps, --lr-base-batch.

    default_warmup_steps: the script's default warm-up (0: none; None: the script decides, e.g.
    from a warm-up option of its own).
    """
    group = parser.add_argument_group("learning rate (gpuscale)")
    group.add_argument("--lr-scaling", choices=RULES, default="none",
                       help="scale the learning rate with the global batch: linear (global/base, Goyal et al.; "
                            "recommended for larger global batches), sqrt (sqrt(global/base)), none (default: as given)")
    default = "none" if default_warmup_steps == 0 else "the script's" if default_warmup_steps is None else default_warmup_steps
    group.add_argument("--lr-warmup-steps", type=_count(0), default=default_warmup_steps, metavar="N",
                       help=f"optimizer steps over which the learning rate rises from the given to the scaled one "
                            f"(default: {default})")
    group.add_argument("--lr-base-batch", type=_count(1), default=None, metavar="N",
                       help="the global batch the learning rate was tuned for (default: the global batch on one "
                            "device: the per-device batch under weak scaling, the global batch under strong)")


def lr_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of `scale_lr` from options added by `add_arguments`: ``scale_lr(lr, plan, **lr_options(args))``."""
    return {"rule": args.lr_scaling, "warmup_steps": args.lr_warmup_steps, "base_batch": args.lr_base_batch}
