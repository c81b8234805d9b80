"""Device-speed defaults that leave the numbers alone: channels-last convolutions, fused optimizers, compile.

`gpuscale.setup` applies them; each has a switch (`setup(channels_last=, fused=, compile=)`, and on
a script's command line ``--channels-last``, ``--fused``, ``--compile`` from
`gpuscale.train.step.add_arguments`) so that a benchmark can turn them off one at a time.

- **Channels-last** (``auto``: on a GPU, under ddp, for a model with 2-D convolutions). cuDNN's convolution
  kernels, and the tensor cores under bf16 autocast, want NHWC: with NCHW weights every
  convolution transposes its operands first. The `Conv2d` weights are converted in place (the
  state dict's values and keys stay the same; only the strides change), and a convolution fed an
  NCHW batch returns channels-last itself, so the training loop needs no change. FSDP and
  DeepSpeed keep contiguous flat shards, so it is for ddp only.
- **Fused optimizer** (``auto``: on a GPU, strategy ddp, for torch's SGD, Adam and AdamW built
  without an explicit ``fused`` or ``foreach``). One kernel updates all parameters instead of a
  few per parameter: on many small parameters the launches, not the arithmetic, bound the step.
  The optimizer is built again, before any step, from the same parameter groups and options with
  ``fused=True``; where torch could not fuse it (a parameter that is not floating point, or not
  on the device) the script's own optimizer is kept. `keeping_implementation` keeps the choice
  across a resume from a checkpoint written with another.
- **Compile** (off unless asked): ``module.compile()`` on the wrapped model, so the object the
  script holds stays the DDP or FSDP model (``no_sync``, checkpoints and their keys unchanged) and
  DDP's compiler splits the graph at its buckets to keep communication overlapped. The first steps
  are slow while it compiles; a string names a backend (``"inductor"`` by default, ``"aot_eager"``
  where no C compiler is at hand). A transformers model on transformers' own SDPA gets a warning
  (`warn_compiled_sdpa`): compiled, its attention runs with an explicit mask (on a GPU, off the flash kernels).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch
from torch import nn

from gpuscale.detect.log import current_rank, get_logger
from gpuscale.runtime.causal_sdpa import switchable_sdpa_model

__all__ = ["COMPILE_MODES", "FUSABLE_OPTIMIZERS", "StrategyTraits", "has_convolutions", "use_channels_last", "to_channels_last", "fuse_optimizer",
           "keeping_implementation", "compile_model", "masked_sdpa_model", "warn_compiled_sdpa"]

FUSABLE_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)  # fused on CUDA and CPU since torch 2.4
log = get_logger("speed")


def has_convolutions(model: nn.Module) -> bool:
    """Whether `model` contains a 2-D convolution (the layers channels-last speeds up)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


class StrategyTraits(Protocol):
    """What the speed switches ask of a strategy (`gpuscale.strategy.base.Strategy` answers it)."""

    name: str
    channels_last_ok: bool
    fused_by_default: bool


def use_channels_last(choice: bool | None, model: nn.Module, device: torch.device, strategy: StrategyTraits) -> bool:
    """Resolve ``channels_last``: None (auto) means on a GPU, under a strategy that allows it (ddp), for a
    model with 2-D convolutions.

    FSDP and DeepSpeed keep parameters in flat, contiguous shards (FSDP2 refuses other strides), so
    there channels-last is off by default and an explicit True is a ValueError.
    """
    if choice and not strategy.channels_last_ok:
        raise ValueError(f"channels-last does not work under {strategy.name}: it keeps parameters in contiguous "
                         "shards; leave --channels-last at auto or off")
    if choice is not None:
        return bool(choice)
    return device.type == "cuda" and strategy.channels_last_ok and has_convolutions(model)


def to_channels_last(model: nn.Module) -> nn.Module:
    """Give the weights of every `nn.Conv2d` in `model` channels-last strides, in place; returns `model`.

    Only 2-D convolutions are converted: other 4-D (or 5-D) tensors keep their layout, so code that
    views them keeps working.
    """
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.to(memory_format=torch.channels_last)
    return model


def _fused(choice: bool | None, device: torch.device, strategy: StrategyTraits) -> bool:
    if choice is not None:
        return bool(choice)
    return device.type == "cuda" and strategy.fused_by_default


def _fusable_parameters(optimizer: Any, device: torch.device) -> str | None:
    """Why torch could not fuse `optimizer`'s parameters (None if it can): floating point, all on `device`'s kind.

    Torch checks this only at the first step, so it is checked here, before the optimizer is replaced.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not torch.is_floating_point(p):
                return f"a parameter of dtype {p.dtype}"
            if p.device.type != device.type or p.device.type not in ("cuda", "cpu"):
                return f"a parameter on {p.device}, not on {device.type}"
    return None


def fuse_optimizer(optimizer: Any, choice: bool | None, device: torch.device, strategy: StrategyTraits) -> Any:
    """The optimizer with ``fused=True`` where asked (or by default, see the module docstring).

    Built again from the same parameter groups and options before any step; an optimizer that
    set ``fused`` or ``foreach`` itself (True or False), or whose parameters torch cannot fuse, is
    returned unchanged. An explicit ``fused=True`` that cannot be honoured is a ValueError naming the reason.
    """
    if not _fused(choice, device, strategy):
        return optimizer
    if type(optimizer) not in FUSABLE_OPTIMIZERS:
        if choice:
            raise ValueError(f"fused=True: {type(optimizer).__name__} has no fused implementation; "
                             f"use one of {', '.join(c.__name__ for c in FUSABLE_OPTIMIZERS)} or fused=False")
        return optimizer
    if any(group.get("fused") is not None or group.get("foreach") is not None for group in optimizer.param_groups):
        return optimizer  # the script chose its implementation
    if optimizer.state:
        raise ValueError("the optimizer has already stepped; gpuscale fuses it only when it is new")
    reason = _fusable_parameters(optimizer, device)
    if reason is not None:
        if choice:
            raise ValueError(f"fused=True: torch cannot fuse this {type(optimizer).__name__} ({reason}); use fused=False")
        log.debug("keeping the unfused %s: %s", type(optimizer).__name__, reason)
        return optimizer
    accepted = inspect.signature(type(optimizer)).parameters
    options = {k: v for k, v in optimizer.defaults.items() if k in accepted and k not in ("params", "fused", "foreach")}
    groups = [{**{k: v for k, v in group.items() if k not in ("fused", "foreach")}, "fused": True} for group in optimizer.param_groups]
    return type(optimizer)(groups, **options, fused=True)


@contextmanager
def keeping_implementation(optimizer: Any) -> Iterator[None]:
    """Load optimizer state inside this block and keep this run's fused/foreach choice, not the checkpoint's.

    Loading a state dict replaces each parameter group, flags included, with the saved one, so a run
    resumed with another --fused than the run that wrote the checkpoint would take the saved flags.
    Fused kernels also want each step count as a float32 tensor on the parameter's device, and a
    checkpoint of an unfused run holds CPU step counts: they are moved. `gpuscale.Checkpointer`
    wraps every strategy's optimizer loading in it; None (no optimizer) is allowed.
    """
    groups = getattr(optimizer, "param_groups", None) or []
    flags = [{k: group[k] for k in ("fused", "foreach") if k in group} for group in groups]
    yield
    for group, kept in zip(getattr(optimizer, "param_groups", None) or [], flags, strict=False):
        group.update(kept)
        if group.get("fused"):
            for p in group["params"]:
                step = optimizer.state.get(p, {}).get("step")
                if isinstance(step, torch.Tensor) and (step.device != p.device or step.dtype != torch.float32):
                    optimizer.state[p]["step"] = step.to(device=p.device, dtype=torch.float32)


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""torch.compile's modes: reduce-overhead replays the compiled kernels as CUDA graphs (one launch for all of them),
which removes the host's per-kernel work that bounds a small step (BENCHMARKS.md, "Issue 27")."""


def check_compile_mode(mode: str | None, compile: bool | str) -> None:
    """Refuse a mode that torch.compile does not have, or a mode without compiling."""
    if mode is None:
        return
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode {mode!r} is not one of {', '.join(COMPILE_MODES)}")
    if not compile:
        raise ValueError(f"compile mode {mode!r} needs compile (--compile)")


def compile_model(model: nn.Module, choice: bool | str, mode: str | None = None) -> nn.Module:
    """Compile `model`'s forward in place (``module.compile``) when `choice` is True or a backend name, in `mode`
    (one of `COMPILE_MODES`, checked by `check_compile_mode` where it was asked for; None: torch's default)."""
    if not choice:
        return model
    backend = choice if isinstance(choice, str) else "inductor"
    warn_compiled_sdpa(model)
    model.compile(backend=backend, **({"mode": mode} if mode else {}))
    return model


def masked_sdpa_model(model: nn.Module) -> str | None:
    """The class of the transformers model in `model` (itself, or inside a DDP, FSDP, DeepSpeed or PEFT wrapper) that
    runs transformers' own SDPA and that ``gpuscale.integrations.hf_sdpa.use_causal_sdpa`` can switch
    (`gpuscale.runtime.causal_sdpa`); None if there is none.

    Compiled, such a model cannot leave out the causal mask: transformers decides that by reading the batch (an
    all-ones padding mask, position ids that restart nowhere), which a traced graph cannot do, so every layer gets an
    explicit mask and SDPA runs a kernel that takes one, not FlashAttention's (docs/traps.md)."""
    found = switchable_sdpa_model(model)
    return None if found is None else type(found).__name__


def warn_compiled_sdpa(model: nn.Module) -> bool:
    """Warn (on rank 0) that `model`, about to be compiled, holds a transformers model on its own SDPA
    (`masked_sdpa_model`); whether it did."""
    name = masked_sdpa_model(model)
    if name is None:
        return False
    if current_rank()[0] == 0:
        log.warning("%s is compiled on transformers' SDPA: a compiled forward cannot leave out the causal mask, so "
                    "attention runs with an explicit mask (on a GPU, not FlashAttention's kernel); call "
                    "gpuscale.integrations.hf_sdpa.use_causal_sdpa(model) before compiling (docs/traps.md)", name)
    return True
