"""The HF Trainer under gpuscale: arguments that agree with the batch plan, a check, and the summary.

The Trainer runs its own loop, so `Meter.iter` cannot see its batches. Three pieces make a
Trainer run a gpuscale run all the same:

    from transformers import Trainer, TrainingArguments
    from gpuscale.integrations.hf import MeterCallback, check_trainer, trainer_arguments

    with gpuscale.init() as rt:                      # exports RANK, WORLD_SIZE, ... for the Trainer
        plan = gpuscale.plan_batch(32, rt.world_size, scaling="strong", max_per_device=8)
        args = TrainingArguments(output_dir=out, learning_rate=2e-5, eval_strategy="steps", eval_on_start=True,
                                 **trainer_arguments(plan, strategy="deepspeed", precision="auto"))
        meter = gpuscale.Meter(plan)
        metered = MeterCallback(meter)
        trainer = Trainer(model=model, args=args, ..., callbacks=[metered])
        check_trainer(trainer, plan)                 # really distributed, with the planned batch
        trainer.train()                              # metered.evaluations[0]: the model as training began
        with meter.phase("eval"):
            metrics = trainer.evaluate()
        meter.write_summary(out, final_loss=metered.final_loss, ...)   # summary.json on rank 0

`trainer_arguments` returns the `TrainingArguments` keywords gpuscale owns: the per-device batch
and gradient accumulation from the `BatchPlan` (so the global batch is exact, docs/classic-bugs.md, bug 7),
``use_cpu`` on a CPU (without it the Trainer on CPU is not distributed: every rank trains alone
and exits 0, docs/traps.md), the precision flags, the gradient-clipping norm and, for ``deepspeed``, a
config dict built by `gpuscale.strategy.deepspeed_config.build_config`, whose batch equals the
loader's (docs/classic-bugs.md, bug 5) and whose clipping and precision equal the Trainer's, so that the
Trainer's own consistency checks pass. The Trainer builds the optimizer and the scheduler and
hands them to DeepSpeed (a config with an ``optimizer`` section is refused). ``fsdp`` is not
offered: the Trainer's FSDP goes through Accelerate's plugin, which gpuscale does not configure.

`check_trainer` raises ValueError when the Trainer's world size or global batch differs from
gpuscale's, which is how a missed ``use_cpu`` or a launcher mix-up shows up before any step runs.

`check_checkpoint` scans a Trainer checkpoint's DeepSpeed files before a resume: DeepSpeed loads
them with ``weights_only=False``, so each pickle must name only tensors, plain data and
DeepSpeed's bookkeeping classes (as `gpuscale.strategy.deepspeed` does for its own checkpoints).

`MeterCallback` feeds a `gpuscale.Meter` from the Trainer's events, so `write_summary` has the
same keys and meaning as for a hand-written loop. Time in ``Trainer.train`` is split as:

- data wait: from the end of one step (or the start of an epoch) until the next step begins,
  minus logging, evaluation and saving: fetching and collating the batch (with the Trainer's
  count of label tokens over ranks);
- eval: the runtime the Trainer reports for each evaluation during training;
- checkpoint: from the previous event to ``on_save`` (the Trainer saves right before it);
- compute: the rest.

Measure the model before training with ``eval_on_start=True`` rather than ``trainer.evaluate()``
before ``train()``: under DeepSpeed ZeRO-1 and 2 the Trainer cannot evaluate before it has built
its engine ("ZeRO inference only makes sense with ZeRO Stage 3").

Steps and samples count optimizer steps run in this call (a resumed run counts only its own);
``epochs`` is the fraction of an epoch trained in this call, as the Trainer counts it.
Evaluations after ``train()`` belong in ``meter.phase("eval")``, as in a hand-written loop.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gpuscale.base import wrapped
from gpuscale.base.precision import resolve_precision
from gpuscale.measure import syncprobe
from gpuscale.measure.metrics import Meter
from gpuscale.runtime.data import BatchPlan
from gpuscale.runtime.init import Runtime, current
from gpuscale.runtime.pinning import withdraw_cpu_flag
from gpuscale.runtime.speed import check_compile_mode, warn_compiled_sdpa
from gpuscale.strategy import gradient_bytes
from gpuscale.strategy.deepspeed import refuse_unsafe_pickles
from gpuscale.strategy.deepspeed_config import build_config, config_precision, load_config

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - the examples extra brings it
    raise ImportError("gpuscale.integrations.hf needs transformers and accelerate: pip install 'gpuscale[examples]'") from exc

__all__ = ["MeterCallback", "StopCallback", "trainer_arguments", "check_trainer", "check_checkpoint", "TRAINER_STRATEGIES"]

TRAINER_STRATEGIES = ("ddp", "deepspeed")


def trainer_arguments(
    plan: BatchPlan,
    *,
    strategy: str = "ddp",
    precision: str = "auto",
    zero_stage: int | None = None,
    offload: bool = False,
    ds_config: str | dict[str, Any] | None = None,
    max_grad_norm: float = 1.0,
    channels_last: bool | None = None,
    fused: bool | None = None,
    compile: bool | str = False,
    compile_mode: str | None = None,
    rt: Runtime | None = None,
) -> dict[str, Any]:
    """The `TrainingArguments` keywords that must agree with gpuscale; see the module docstring.

    The keywords mirror `gpuscale.setup`, so ``**gpuscale.train.step.training_options(args)``
    from a parser built with `gpuscale.train.step.add_arguments` fits. max_grad_norm: the
    Trainer's clipping norm (its default, 1.0; 0 turns clipping off), also DeepSpeed's.
    fused: True or False picks the Trainer's ``adamw_torch_fused`` or ``adamw_torch`` optimizer (None:
    the Trainer's default, fused where torch has it); compile: ``torch_compile`` with that backend, in
    ``compile_mode`` (``torch_compile_mode``). Under
    deepspeed fused=True and compile are refused, as in `gpuscale.setup`. channels_last=True is refused: the Trainer does not
    change memory formats (the language models here have no convolutions).
    """
    rt = rt or current()
    if strategy not in TRAINER_STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not available with the HF Trainer; choose one of: {', '.join(TRAINER_STRATEGIES)}")
    if plan.world_size != rt.world_size:
        raise ValueError(f"the batch plan is for {plan.world_size} ranks but this job has {rt.world_size}; "
                         "plan it with gpuscale.plan_batch(..., world_size=rt.world_size)")
    user_config = None
    if strategy == "deepspeed":
        user_config = load_config(ds_config) if isinstance(ds_config, str) else ds_config
        if precision == "auto" and user_config is not None:
            precision = config_precision(user_config) or "auto"
    elif zero_stage is not None or offload or ds_config is not None:
        raise ValueError(f"zero_stage, offload and ds_config only apply to strategy 'deepspeed', not {strategy!r}")
    resolved = resolve_precision(precision, rt.device)
    arguments: dict[str, Any] = {
        "per_device_train_batch_size": plan.per_device_batch,
        "gradient_accumulation_steps": plan.grad_accum_steps,
        "use_cpu": rt.device.type == "cpu",
        "max_grad_norm": max_grad_norm,
        **resolved.trainer_arguments(),
    }
    if channels_last:
        raise ValueError("channels-last is not applied by the HF Trainer; leave --channels-last at auto or off")
    if strategy == "deepspeed" and (fused or compile):
        raise ValueError("--fused and --compile are not available with strategy 'deepspeed' (DeepSpeed runs its own "
                         "optimizer step); leave them at their defaults")
    if fused is not None:
        arguments["optim"] = "adamw_torch_fused" if fused else "adamw_torch"
    check_compile_mode(compile_mode, compile)
    if compile:
        arguments.update(torch_compile=True, torch_compile_backend=compile if isinstance(compile, str) else "inductor")
        if compile_mode:
            arguments["torch_compile_mode"] = compile_mode
    if strategy == "deepspeed":
        withdraw_cpu_flag(os.environ)  # Accelerate turns DeepSpeed off under the ACCELERATE_USE_CPU gpuscale set
        arguments["deepspeed"] = build_config(plan, resolved, zero_stage=zero_stage, offload=offload,
                                              clip_grad_norm=float(max_grad_norm), user_config=user_config,
                                              client_optimizer=True)
    return arguments


def check_trainer(trainer: Any, plan: BatchPlan, rt: Runtime | None = None) -> None:
    """Raise ValueError unless the Trainer is distributed over gpuscale's ranks with the planned batch; warn when it
    compiles a model on transformers' own SDPA (`gpuscale.runtime.speed.warn_compiled_sdpa`)."""
    rt = rt or current()
    args = trainer.args
    if args.world_size != rt.world_size:
        hint = (" On a CPU the Trainer is distributed only with use_cpu=True (gpuscale.integrations.hf.trainer_arguments sets it)"
                if rt.device.type == "cpu" else "")
        raise ValueError(f"the Trainer sees {args.world_size} process(es) but the job has {rt.world_size}: every rank would "
                         f"train alone.{hint}")
    batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    if batch != plan.global_batch:
        raise ValueError(f"the Trainer's global batch is {args.world_size} ranks x {args.per_device_train_batch_size} x "
                         f"{args.gradient_accumulation_steps} accumulation = {batch}, the plan's {plan.global_batch}; "
                         "pass **gpuscale.integrations.hf.trainer_arguments(plan, ...) to TrainingArguments")
    if getattr(trainer, "is_deepspeed_enabled", False):
        config = trainer.accelerator.state.deepspeed_plugin.deepspeed_config
        if config.get("train_batch_size") != plan.global_batch:
            raise ValueError(f"DeepSpeed's train_batch_size is {config.get('train_batch_size')}, the loader's global batch "
                             f"{plan.global_batch}")
    if getattr(args, "torch_compile", False):
        warn_compiled_sdpa(trainer.model)


def check_checkpoint(path: str | Path) -> None:
    """Refuse a checkpoint-N folder whose DeepSpeed files (global_step*/*.pt) name objects other than data."""
    refuse_unsafe_pickles(sorted(Path(path).glob("global_step*/*.pt")), "resume from it")


class MeterCallback(TrainerCallback):
    """Feeds a `gpuscale.Meter` from the Trainer's events (see the module docstring)."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.final_loss: float | None = None
        """The last training loss the Trainer logged (mean over ranks and the logging interval)."""
        self.evaluations: list[dict[str, Any]] = []
        """The metrics of each evaluation during ``train()``, in order, with its ``step`` and
        ``time_s`` (seconds since training began, when it ended); with ``eval_on_start=True``
        the first is the model as this run starts training."""
        self._mark = self._began = time.perf_counter()
        self._training = False
        self._first_epoch = 0.0
        syncprobe.RECORD.unsupported = ("HF Trainer: it runs its own backward pass, which the sync probe cannot replay; "
                                        "only the data wait is measured")

    def _now(self) -> float:
        self._mark = time.perf_counter()
        return self._mark

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.meter.train_started is None:
            self.meter.train_started = time.time()
        if wrapped.latest() is None:  # the Trainer wrapped the model itself
            # under ZeRO-3 the parameters are partitioned away and count 0 bytes here: unknown, not zero
            model = kwargs.get("model")
            wrapped.announce(wrapped.Wrapped(strategy="deepspeed" if args.deepspeed else "ddp",
                                             gradient_bytes=(gradient_bytes(model) or None) if model is not None else None))
        self._training = True
        self._first_epoch = float(state.epoch or 0.0)
        self._began = self._now()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._now()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        before = self._mark
        self.meter.seconds["data_wait"] += self._now() - before

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.meter.batches += args.gradient_accumulation_steps
        self.meter.samples += args.gradient_accumulation_steps * args.per_device_train_batch_size
        self.meter.mark_warmup()
        self._now()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self._training and logs and "loss" in logs:
            self.final_loss = float(logs["loss"])
        self._now()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **kwargs: Any) -> None:
        now = self._now()
        if self._training:
            runtime = next((v for k, v in (metrics or {}).items() if k.endswith("_runtime")), None)
            self.meter.seconds["eval"] += float(runtime) if runtime is not None else 0.0
            self.evaluations.append({"step": state.global_step, "time_s": now - self._began, **(metrics or {})})

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._training:
            before = self._mark
            self.meter.seconds["checkpoint"] += self._now() - before

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._training = False
        self.meter.epochs = round(float(state.epoch or 0.0) - self._first_epoch, 4)


class StopCallback(TrainerCallback):
    """Ends `Trainer.train()` at a checkpoint when the run is told to stop (a `gpuscale.StopSignal`).

        stop = gpuscale.StopSignal()
        trainer = Trainer(..., callbacks=[StopCallback(stop)])
        trainer.train(resume_from_checkpoint=last_checkpoint)
        if stop.requested():
            stop.exit()          # exit code 75; run again (the batch script requeues) to resume

    After every optimizer step (on every rank, so the collective check stays in step) it asks
    whether any rank got USR1 or TERM; if so the Trainer saves a checkpoint at this step and stops.
    """

    def __init__(self, stop: Any) -> None:
        self.stop = stop

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stop.requested():
            control.should_save = True
            control.should_training_stop = True
