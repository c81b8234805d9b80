"""One training step for every strategy: `gpuscale.setup` and the `Training` it returns.

    training = gpuscale.setup(model, optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
                              plan=plan, strategy=args.strategy, precision=args.precision)
    for x, y in train_loader:
        with training.autocast():
            loss = F.cross_entropy(training.model(x), y)
        training.backward(loss)        # scaled, divided over accumulation, synchronised when due
        if training.step():            # True once per optimizer step (every grad_accum_steps calls)
            ...

DDP, FSDP and DeepSpeed ZeRO differ in who owns the step: with DDP and FSDP the script's
optimizer steps and a gradient scaler guards fp16; with DeepSpeed the engine scales, reduces and
steps. `Training` hides that difference, and with it the details that go wrong by hand: gradient
accumulation that skips the all-reduce (DDP) or reduce-scatter (FSDP) on all but the last
micro-batch, the loss divided by the number of micro-batches, unscaling before clipping, and
zeroing gradients after the step.

The optimizer is passed as a function of the parameters because FSDP and DeepSpeed must build
it after they have sharded the model. `training.optimizer` is the torch optimizer it returned
(under DeepSpeed, the one inside ZeRO's wrapper), so learning-rate schedulers attach to it as
usual: step them when `step()` returns True.

Scripts offer the same switch on their command lines with `add_arguments(parser)` and pass
``**training_options(args)`` to `setup`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import torch
from torch import nn

from gpuscale.base import wrapped as wrapped_facts
from gpuscale.base.precision import PRECISIONS, Precision, resolve_precision
from gpuscale.detect.log import get_logger
from gpuscale.measure import syncprobe
from gpuscale.runtime import speed
from gpuscale.runtime.data import BatchPlan
from gpuscale.runtime.init import Runtime, current
from gpuscale.strategy import STRATEGIES, Strategy, get_strategy, gradient_bytes, no_sync, unwrap, wrap_and_describe
from gpuscale.strategy.deepspeed import import_deepspeed
from gpuscale.strategy.deepspeed_config import DEFAULT_ZERO_STAGE, ZERO_STAGES, build_config, config_precision, load_config

__all__ = ["Training", "setup", "add_arguments", "training_options", "loader_options", "ds_config_setting"]

SWITCH = ("auto", "on", "off")

ELEMENTWISE_OPTIMIZERS = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.Adadelta,
    torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop,
)
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
log = get_logger("training")


class Training:
    """The model, optimizer and step of one run; built by `setup`."""

    def __init__(self, *, model: nn.Module, optimizer: Any, plan: BatchPlan, precision: Precision,
                 strategy: Strategy, clip_grad_norm: float | None, facts: wrapped_facts.Wrapped,
                 ds_config: dict[str, Any] | None = None, device: torch.device | None = None) -> None:
        self.model = model
        """What to call for the forward pass (a DDP wrapper, an FSDP module, a DeepSpeed engine)."""
        self.optimizer = optimizer
        """The torch optimizer (attach schedulers to it; pass it to `Checkpointer`)."""
        self.plan = plan
        self.precision = precision
        self.strategy = strategy.name
        """The strategy's name (``ddp``, ``fsdp``, ``deepspeed``)."""
        self.facts = facts
        """What the model's wrapping means for measuring: gradient bytes per step, collective forward passes."""
        self.clip_grad_norm = clip_grad_norm
        self.ds_config = ds_config
        """The DeepSpeed config the engine was built with (None for other strategies)."""
        self._grad_norm: Any = None  # the last step's norm before clipping, a device tensor until read
        self._strategy = strategy
        self._scaler = strategy.grad_scaler(precision)
        self._micro = 0
        self.device = device if device is not None else next(iter(model.parameters()), torch.empty(0)).device
        self._capture: syncprobe.Capture | None = None
        self._probe_blocker = strategy.sync_probe_blocker(model) or syncprobe.unsupported_reason(model)

    @property
    def module(self) -> nn.Module:
        """The user's own module inside `model`."""
        return unwrap(self.model)

    def autocast(self) -> AbstractContextManager[Any]:
        """Run the forward pass and the loss in this context: mixed precision, and under DDP no
        gradient all-reduce for micro-batches before the last of a step (DDP decides that in the
        forward pass, so a forward outside this block synchronises every micro-batch: correct, slower)."""
        stack = ExitStack()
        stack.enter_context(self.precision.autocast())
        last = self._micro + 1 >= self.plan.grad_accum_steps
        stack.enter_context(self._strategy.forward_context(self.model, last))
        self._arm_probe(last)
        return stack

    def _arm_probe(self, last_micro_batch: bool) -> None:
        """Capture this forward pass if it is the synchronising micro-batch of a probed step (`gpuscale.measure.syncprobe`)."""
        if self._capture is not None:  # armed before but never consumed by backward (an evaluation pass)
            self._capture.remove()
            self._capture = None
        if not (last_micro_batch and syncprobe.is_probe_step(syncprobe.RECORD.steps) and torch.is_grad_enabled()
                and self.model.training and syncprobe.probe_enabled()):  # the step's number first: it rules out most calls
            return
        if self._probe_blocker is not None:
            syncprobe.RECORD.unsupported = self._probe_blocker
            return
        self._capture = syncprobe.Capture(self.model)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's mean loss; gradients are synchronised on the last one."""
        self._micro += 1
        last = self._micro >= self.plan.grad_accum_steps
        loss = self._strategy.scale_loss(loss, self.plan.grad_accum_steps, self._scaler)
        capture, self._capture = self._capture, None
        if capture is not None:
            capture.stop_recording()
        if capture is None or capture.calls != 1 or not last:
            self._strategy.backward(self.model, loss, last)
            if capture is not None:
                capture.remove()
            return
        syncprobe.synchronize(self.device)
        start = time.perf_counter()
        self._strategy.backward(self.model, loss, last)
        syncprobe.synchronize(self.device)
        capture.remove()
        self._probe(capture, synced_backward_s=time.perf_counter() - start)

    def _probe(self, capture: syncprobe.Capture, synced_backward_s: float) -> None:
        """Replay the micro-batch just back-propagated without synchronisation and record both timings."""
        if not capture.valid:
            return
        started = time.perf_counter()
        forward_s, backward_s = syncprobe.replay(
            self.model, capture, unsynchronised=lambda: no_sync(self.model, skip=True),
            autocast=self.precision.autocast, device=self.device)
        record = syncprobe.RECORD
        record.samples.append(syncprobe.ProbeSample(step=record.steps, forward_s=forward_s, backward_s=backward_s,
                                                    synced_backward_s=synced_backward_s,
                                                    micro_batches=self.plan.grad_accum_steps))
        record.seconds += time.perf_counter() - started

    def step(self) -> bool:
        """Step the optimizer if this was the last micro-batch of a step; True if it stepped."""
        stepped, norm = self._strategy.step(self.model, self.optimizer, due=self._micro >= self.plan.grad_accum_steps,
                                            scaler=self._scaler, clip_grad_norm=self.clip_grad_norm)
        if stepped:
            self._micro = 0
            syncprobe.RECORD.steps += 1
            self._grad_norm = norm
        return stepped

    @property
    def pending_micro_batches(self) -> int:
        """Micro-batches back-propagated since the last optimizer step: their gradients wait for the step's last one."""
        return self._micro

    @property
    def grad_norm(self) -> float | None:
        """The gradients' global norm before clipping at the last optimizer step (None without clipping). Kept on
        the device by the step and read here, so a step never waits for the GPU unless this is asked for."""
        norm = self._grad_norm
        if isinstance(norm, torch.Tensor):
            norm = self._grad_norm = float(norm)
        return norm


def setup(
    model: nn.Module,
    optimizer: OptimizerFactory | None,
    *,
    plan: BatchPlan,
    strategy: str = "ddp",
    precision: str = "auto",
    zero_stage: int | None = None,
    offload: bool = False,
    ds_config: str | dict[str, Any] | None = None,
    clip_grad_norm: float | None = None,
    channels_last: bool | None = None,
    fused: bool | None = None,
    compile: bool | str = False,
    compile_mode: str | None = None,
    rt: Runtime | None = None,
) -> Training:
    """Spread `model` over the ranks with `strategy` and build its optimizer; see the module docstring.

    optimizer: a function from the trainable parameters to a torch optimizer (None only with a
    DeepSpeed config that has its own 'optimizer' section). Call `setup` again after unfreezing
    parameters (with the returned model): DDP re-wraps, FSDP keeps its shards, DeepSpeed ZeRO-1/2
    builds a new engine (its fp32 master weights restart from the module's, bf16 under bf16);
    ZeRO-3 refuses (its parameters are partitioned).
    plan: the `BatchPlan` the loaders use; DeepSpeed's batch is set from it.
    precision: 'auto', 'fp32', 'bf16' or 'fp16' (see `gpuscale.base.precision`).
    zero_stage, offload, ds_config: DeepSpeed only (ds_config: a path to JSON/hjson, or a dict).
    clip_grad_norm: clip the gradients' global norm to this value before each step.
    channels_last, fused, compile: the speed defaults of `gpuscale.runtime.speed` (None = auto: channels-last
    for convolutional models and fused SGD/Adam/AdamW, both under ddp on GPUs only; compile off).
    compile_mode: torch.compile's mode (`gpuscale.runtime.speed.COMPILE_MODES`; None: its default), with compile only.
    DeepSpeed runs its own step and keeps flat shards: there, an explicit True of any is refused.
    """
    rt = rt or current()
    speed.check_compile_mode(compile_mode, compile)
    chosen = get_strategy(strategy)  # unknown names fail here, listing the valid ones
    if chosen.builds_engine:
        if fused or compile:
            raise ValueError(f"fused and compile are not available with strategy {chosen.name!r} (its engine runs its "
                             "own optimizer step); leave them at their defaults")
        speed.use_channels_last(channels_last, unwrap(model), rt.device, chosen)  # refuses an explicit True
        return _setup_deepspeed(chosen, model, optimizer, plan=plan, precision=precision, zero_stage=zero_stage,
                                offload=offload, ds_config=ds_config, clip_grad_norm=clip_grad_norm, rt=rt)
    given = [name for name, value in (("zero_stage", zero_stage), ("offload", offload or None), ("ds_config", ds_config)) if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: for strategy 'deepspeed' only, not {strategy!r}")
    if optimizer is None:
        raise ValueError("pass optimizer=, a function from parameters to a torch optimizer")
    resolved = resolve_precision(precision, rt.device)
    if speed.use_channels_last(channels_last, unwrap(model), rt.device, chosen):
        speed.to_channels_last(unwrap(model))
    wrapped, facts = wrap_and_describe(model, strategy=strategy, rt=rt, precision=resolved)
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    built = speed.fuse_optimizer(optimizer(trainable), fused, rt.device, chosen)
    return Training(model=speed.compile_model(wrapped, compile, compile_mode), optimizer=built, plan=plan, precision=resolved,
                    strategy=chosen, clip_grad_norm=clip_grad_norm, facts=facts, device=rt.device)


def _setup_deepspeed(chosen: Strategy, model: nn.Module, optimizer: OptimizerFactory | None, *, plan: BatchPlan, precision: str,
                     zero_stage: int | None, offload: bool, ds_config: str | dict[str, Any] | None,
                     clip_grad_norm: float | None, rt: Runtime) -> Training:
    user_config = load_config(ds_config) if isinstance(ds_config, str) else ds_config
    if precision == "auto" and user_config is not None:
        precision = config_precision(user_config) or "auto"
    resolved = resolve_precision(precision, rt.device)
    if resolved.name == "fp16" and rt.device.type != "cuda":
        raise ValueError("DeepSpeed runs fp16 only on GPUs; use --precision bf16 or fp32 on CPU")
    if plan.world_size != rt.world_size:
        raise ValueError(f"the batch plan is for {plan.world_size} ranks but this job has {rt.world_size}; "
                         "plan it with gpuscale.plan_batch(..., world_size=rt.world_size)")
    config = build_config(plan, resolved, zero_stage=zero_stage, offload=offload, clip_grad_norm=clip_grad_norm,
                          user_config=user_config, client_optimizer=optimizer is not None)
    import_deepspeed()  # the install hint before any process-group work
    rt.ensure_process_group()  # DeepSpeed needs one even for a single process
    if getattr(model, "zero_optimization_stage", lambda: 0)() == 3:
        raise ValueError("this model's parameters are partitioned by ZeRO-3 and cannot be set up again; choose the "
                         "trainable parameters before the first gpuscale.setup, or use --zero-stage 1 or 2")
    module = unwrap(model).to(rt.device)
    synchronised_bytes = gradient_bytes(module)  # before ZeRO-3 partitions the parameters away
    torch_optimizer = optimizer(p for p in module.parameters() if p.requires_grad) if optimizer is not None else None
    if isinstance(torch_optimizer, ELEMENTWISE_OPTIMIZERS):
        # ZeRO runs the optimizer on flat slices of the parameters: right for optimizers that
        # update each element on its own (these), wrong for per-tensor ones (LAMB, factored Adafactor).
        config.setdefault("zero_allow_untested_optimizer", True)
    engine, engine_optimizer = chosen.initialize(module, torch_optimizer, config)  # type: ignore[attr-defined]  # deepspeed's own
    engine._gpuscale_strategy = chosen
    gathers = chosen.gathers_parameters(engine)
    facts = wrapped_facts.Wrapped(strategy=chosen.name, gradient_bytes=synchronised_bytes, gathers_parameters=gathers,
                                  collective_forward=gathers and rt.world_size > 1)
    wrapped_facts.announce(facts)
    if torch_optimizer is None:  # built by DeepSpeed from the config
        torch_optimizer = getattr(engine_optimizer, "optimizer", engine_optimizer)
    if rt.is_main:
        zero = config["zero_optimization"]
        log.info("deepspeed: ZeRO stage %d%s, %s, global batch %d = %d ranks x %d x %d accumulation",
                 zero["stage"], " with CPU offload" if "offload_optimizer" in zero else "", resolved.name,
                 config["train_batch_size"], plan.world_size, plan.per_device_batch, plan.grad_accum_steps)
    return Training(model=engine, optimizer=torch_optimizer, plan=plan, precision=resolved, strategy=chosen,
                    clip_grad_norm=config["gradient_clipping"] or None, facts=facts, ds_config=config, device=rt.device)


def add_arguments(parser: argparse.ArgumentParser, *, default_strategy: str = "ddp", default_zero_stage: int | None = None,
                  strategies: Sequence[str] | None = None) -> None:
    """Add the strategy switch and the speed switches to a script's parser.

    Strategy: --strategy, --precision, --zero-stage, --offload, --ds-config. Speed (`gpuscale.runtime.speed`,
    each auto by default): --channels-last, --fused, --compile, --loader-workers, --pin-memory; the
    course's way of running is ``--precision fp32 --channels-last off --fused off --loader-workers 0
    --pin-memory off``.

    strategies: the --strategy choices the script supports (default: all of `gpuscale.strategy.STRATEGIES`), so
    that argparse refuses the others at once. default_zero_stage: the script's ZeRO stage when --zero-stage is
    not given and no --ds-config states one (None: `DEFAULT_ZERO_STAGE`). ``args.zero_stage`` stays None unless
    --zero-stage is typed; `training_options` resolves the default.
    """
    choices = list(STRATEGIES) if strategies is None else list(strategies)
    unknown = [name for name in choices if name not in STRATEGIES]
    if unknown or default_strategy not in choices:
        raise ValueError(f"strategies {choices} with default {default_strategy!r}: each must be one of "
                         f"{', '.join(STRATEGIES)}, the default among them")
    if default_zero_stage is not None and default_zero_stage not in ZERO_STAGES:
        raise ValueError(f"default_zero_stage={default_zero_stage!r} is not one of {', '.join(map(str, ZERO_STAGES))}")
    stage = DEFAULT_ZERO_STAGE if default_zero_stage is None else default_zero_stage
    group = parser.add_argument_group("parallelism (gpuscale)")
    group.add_argument("--strategy", choices=choices, default=default_strategy,
                       help=f"how the model is spread over ranks (default {default_strategy})")
    group.add_argument("--precision", choices=PRECISIONS, default="auto",
                       help="mixed precision: auto = bf16 on GPUs that have it, else fp32 (default auto)")
    # default None: an explicit --zero-stage (even one equal to the script's default) is told from an unset one
    group.add_argument("--zero-stage", type=int, choices=ZERO_STAGES, default=None,
                       help=f"DeepSpeed ZeRO stage (deepspeed only; default: the --ds-config's stage, else {stage})")
    group.add_argument("--offload", action="store_true", help="DeepSpeed: keep optimizer states in CPU memory")
    group.add_argument("--ds-config", metavar="FILE", help="your DeepSpeed config (JSON or hjson); gpuscale checks its batch")
    parser.set_defaults(_default_zero_stage=default_zero_stage)  # the script's stage, for an unset --zero-stage
    fast = parser.add_argument_group("speed (gpuscale)")
    fast.add_argument("--channels-last", choices=SWITCH, default="auto",
                      help="channels-last memory format for convolutions (default auto: on GPUs, under ddp, for models with Conv2d)")
    fast.add_argument("--fused", choices=SWITCH, default="auto",
                      help="fused optimizer kernel for SGD/Adam/AdamW (default auto: on GPUs, under ddp; other optimizers refuse 'on')")
    fast.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                      help="torch.compile the model (backend default inductor; first steps are slow while it compiles)")
    fast.add_argument("--compile-mode", choices=speed.COMPILE_MODES, default=None,
                      help="torch.compile's mode with --compile (reduce-overhead: CUDA graphs, for steps the host bounds)")
    fast.add_argument("--loader-workers", type=int, default=None, metavar="N",
                      help="data-loader worker processes per rank (default: the rank's cores minus one on GPUs, 0 on CPUs)")
    fast.add_argument("--pin-memory", choices=SWITCH, default="auto",
                      help="page-locked loader batches for asynchronous copies to the GPU (default auto: on GPUs)")


def _switch(value: str) -> bool | None:
    return None if value == "auto" else value == "on"


def training_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `setup` (and of `gpuscale.integrations.hf.trainer_arguments`) from a namespace
    parsed with `add_arguments`.

    Under deepspeed an unset --zero-stage is the --ds-config's stage when the config states one, else the
    script's default (`add_arguments`' default_zero_stage); only a typed --zero-stage that the config
    contradicts is refused (by `setup` or `trainer_arguments`). DeepSpeed-only options left unset are
    dropped for the other strategies; given explicitly, they are refused.
    Speed switches left at auto are dropped too, so `setup` decides them for the device.
    """
    options: dict[str, Any] = {"strategy": args.strategy, "precision": args.precision}
    if get_strategy(args.strategy).builds_engine:  # DeepSpeed: its options go to its engine's config
        options.update(zero_stage=_zero_stage(args), offload=args.offload, ds_config=args.ds_config)
    else:
        given = [flag for flag, value in (("--zero-stage", args.zero_stage is not None), ("--offload", args.offload),
                                          ("--ds-config", args.ds_config)) if value]
        if given:
            raise ValueError(f"{' and '.join(given)}: for --strategy deepspeed only")
    for name in ("channels_last", "fused"):
        if getattr(args, name, "auto") != "auto":
            options[name] = _switch(getattr(args, name))
    if getattr(args, "compile", None):
        options["compile"] = args.compile
    if getattr(args, "compile_mode", None):
        options["compile_mode"] = args.compile_mode  # checked by setup and trainer_arguments, which take it
    return options


def _zero_stage(args: argparse.Namespace) -> int | None:
    """The ZeRO stage to pass to DeepSpeed's config: the typed one, else None where the --ds-config states one
    (`build_config` takes the config's), else the script's default (None: `DEFAULT_ZERO_STAGE`)."""
    if args.zero_stage is not None:
        return args.zero_stage  # typed: a config that says otherwise is refused, naming both
    default = getattr(args, "_default_zero_stage", None)
    if default is not None and ds_config_setting(args, "zero_optimization", "stage") is not None:
        return None
    return default


def ds_config_setting(args: argparse.Namespace, *keys: str) -> Any:
    """What the --ds-config of a deepspeed run sets at `keys`, e.g. ``ds_config_setting(args, "gradient_clipping")``;
    None when the run is not deepspeed, has no --ds-config or the config leaves it out or says "auto".

    For a script's own option whose default must yield to the user's config, as --zero-stage's does: pass None
    where the config sets it (`setup` and `trainer_arguments` then take the config's), the default elsewhere.
    """
    if not get_strategy(args.strategy).builds_engine or not getattr(args, "ds_config", None):
        return None
    value: Any = load_config(args.ds_config)
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return None if value == "auto" else value  # "auto": the script's to fill in, as in the HF Trainer's configs


def loader_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of `gpuscale.make_loader` from a namespace parsed with `add_arguments`."""
    workers = getattr(args, "loader_workers", None)
    if workers is not None and workers < 0:
        raise ValueError(f"--loader-workers {workers}: give 0 (load in the training process) or more")
    options: dict[str, Any] = {} if workers is None else {"num_workers": workers}
    if getattr(args, "pin_memory", "auto") != "auto":
        options["pin_memory"] = _switch(args.pin_memory)
    return options
