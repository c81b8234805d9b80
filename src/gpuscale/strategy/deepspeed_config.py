"""DeepSpeed's configuration, built from gpuscale's options so that it cannot disagree with the loader.

DeepSpeed reads its batch from its config: ``train_batch_size`` (global), the micro batch per GPU
and the gradient-accumulation steps, and it must equal what the loader delivers. The course's
config said ``train_batch_size: 32`` while its loader gave 32 per rank (docs/classic-bugs.md, bug 5): the
learning rate was tuned for one batch and the run trained with another. Here the three batch
keys always come from the `BatchPlan`; a user's own config may leave them out or say ``"auto"``,
and one that states other numbers is refused, naming both.

Gradient clipping is off unless asked for (``clip_grad_norm``, or the config's
``gradient_clipping``): DeepSpeed's own default clips at 1.0, which would make the same script
train differently under deepspeed than under ddp.

A user's config file may be JSON or hjson (comments, trailing commas, as in the course's files);
hjson is part of the ``deepspeed`` extra. Everything else in it (scheduler, communication
options, ...) is passed through untouched, but the keys gpuscale also has options for (ZeRO
stage, precision, gradient clipping) must agree with those options when both are given.

Pure functions: nothing here imports DeepSpeed, so the unit tests run without it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from gpuscale.base.precision import Precision
from gpuscale.runtime.data import BatchPlan

__all__ = ["ZERO_STAGES", "DEFAULT_ZERO_STAGE", "load_config", "config_precision", "build_config"]

ZERO_STAGES = (1, 2, 3)
DEFAULT_ZERO_STAGE = 2
QUIET_STEPS = 10**9  # DeepSpeed prints a line every `steps_per_print` steps; gpuscale reports progress itself


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a DeepSpeed config file: JSON, or hjson (comments and trailing commas allowed)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read DeepSpeed config {path}: {exc.strerror or exc}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as json_error:
        try:
            import hjson
        except ImportError:
            raise ValueError(f"{path} is not JSON ({json_error}); for hjson (trailing commas, comments) "
                             "install it: pip install 'gpuscale[deepspeed]'") from None
        try:
            config = json.loads(json.dumps(hjson.loads(text)))  # plain dicts, not hjson's OrderedDicts
        except Exception as exc:  # hjson raises its own HjsonDecodeError, a ValueError subclass
            raise ValueError(f"{path} is neither JSON nor hjson: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a {type(config).__name__}, not a DeepSpeed config object {{...}}")
    return config


def config_precision(config: dict[str, Any]) -> str | None:
    """'bf16' or 'fp16' if the config enables one, else None."""
    enabled = [name for name in ("bf16", "fp16") if (config.get(name) or {}).get("enabled") in (True, "true")]
    if len(enabled) > 1:
        raise ValueError("the DeepSpeed config enables both bf16 and fp16; enable one of them")
    return enabled[0] if enabled else None


def build_config(
    plan: BatchPlan,
    precision: Precision,
    *,
    zero_stage: int | None = None,
    offload: bool = False,
    clip_grad_norm: float | None = None,
    user_config: dict[str, Any] | None = None,
    client_optimizer: bool = True,
) -> dict[str, Any]:
    """The config to hand to ``deepspeed.initialize``: the user's (if any) checked and completed.

    zero_stage: 1, 2 or 3; None takes the user config's stage, else DEFAULT_ZERO_STAGE.
    offload: keep optimizer states (and, at stage 3, parameters) in CPU memory.
    client_optimizer: True when gpuscale hands DeepSpeed a torch optimizer; the user config must
    then have no ``optimizer`` section (one or the other builds it, never both).
    """
    config = copy.deepcopy(user_config or {})
    _fill_batch(config, plan)

    zero = dict(config.get("zero_optimization") or {})
    stage = _agree("ZeRO stage", zero_stage, zero.get("stage"), default=DEFAULT_ZERO_STAGE)
    if stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage {stage!r} is not one of {', '.join(map(str, ZERO_STAGES))}")
    zero["stage"] = stage
    if offload:
        zero.setdefault("offload_optimizer", {"device": "cpu", "pin_memory": precision.device_type == "cuda"})
        if stage == 3:
            zero.setdefault("offload_param", {"device": "cpu", "pin_memory": precision.device_type == "cuda"})
    config["zero_optimization"] = zero

    wanted = None if precision.name == "fp32" else precision.name
    stated = config_precision(config)
    if stated is not None and stated != wanted:
        raise ValueError(f"the DeepSpeed config enables {stated} but the run's precision is {precision.name}; "
                         f"pass --precision {stated} or remove the {stated} section from the config")
    for name, section in precision.deepspeed_config().items():
        # gpuscale's loss-scaling settings are defaults: the user's own (loss_scale, ...) win.
        config[name] = {**section, **(config.get(name) or {}), "enabled": True} if section["enabled"] else section

    # DeepSpeed's own default is 1.0 (since 0.1x): left unset, every run would clip silently and
    # train differently from the same script under DDP. 0 turns clipping off.
    config["gradient_clipping"] = _agree("gradient clipping", clip_grad_norm, config.get("gradient_clipping"), default=0.0)

    if client_optimizer and "optimizer" in config:
        raise ValueError("both the DeepSpeed config and the script define an optimizer; remove the config's "
                         "'optimizer' section, or let the script pass optimizer=None")
    if not client_optimizer and "optimizer" not in config:
        raise ValueError("no optimizer: pass one to gpuscale.setup(optimizer=...) or add an 'optimizer' section to the DeepSpeed config")
    if client_optimizer and zero.get("offload_optimizer") is not None:
        # A torch optimizer on offloaded states works (slower than DeepSpeedCPUAdam, which must be compiled).
        config.setdefault("zero_force_ds_cpu_optimizer", False)
    config.setdefault("steps_per_print", QUIET_STEPS)
    config.setdefault("wall_clock_breakdown", False)
    return config


def _fill_batch(config: dict[str, Any], plan: BatchPlan) -> None:
    """Set the three batch keys from the plan; refuse a config that states other numbers."""
    expected = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.per_device_batch,
        "gradient_accumulation_steps": plan.grad_accum_steps,
    }
    wrong = [f"{key}={config[key]!r} (the loader gives {value})" for key, value in expected.items()
             if config.get(key, "auto") not in ("auto", value)]
    if wrong:
        raise ValueError(
            f"the DeepSpeed config disagrees with the loader: {'; '.join(wrong)}; the loader's global batch is "
            f"{plan.world_size} ranks x {plan.per_device_batch} x {plan.grad_accum_steps} accumulation = {plan.global_batch}. "
            "Remove the batch keys from the config (gpuscale fills them in) or change the script's batch size"
        )
    config.update(expected)


def _agree(what: str, option: Any, in_config: Any, *, default: Any) -> Any:
    """The option's value, the config's, or the default; ValueError if option and config differ. A config's "auto"
    (as the HF Trainer's configs write it: filled in from the script) is no value of its own."""
    if in_config == "auto":
        in_config = None
    if option is not None and in_config is not None and option != in_config:
        raise ValueError(f"{what} is {option} on the command line but {in_config} in the DeepSpeed config; make them agree")
    if option is not None:
        return option
    return in_config if in_config is not None else default
