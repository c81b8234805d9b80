"""Strategies: how a model is spread over ranks, behind one switch.

A strategy is a small object that answers the `Strategy` protocol (`gpuscale.strategy.base`) and
has a name in `STRATEGIES`. Training scripts never touch it directly:

    model = gpuscale.wrap(model, strategy="ddp")   # or "fsdp"; after deciding what is trainable
    ...
    for p in model_to_finetune.parameters(): p.requires_grad = True
    model = gpuscale.wrap(model)                    # re-wrap: the new parameters now sync

`wrap` on an already wrapped model re-wraps it around the current trainable parameters. A model
whose trainable parameters change after wrapping refuses its next forward pass with the fix,
because DDP would silently never synchronise the newly unfrozen gradients (docs/classic-bugs.md, bug 1).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from gpuscale.base import wrapped as wrapped_facts
from gpuscale.base.precision import Precision
from gpuscale.runtime.init import Runtime, current
from gpuscale.strategy.base import Strategy, no_sync
from gpuscale.strategy.ddp import DDPStrategy
from gpuscale.strategy.deepspeed import DeepSpeedStrategy
from gpuscale.strategy.fsdp import FSDPStrategy

__all__ = ["Strategy", "STRATEGIES", "get_strategy", "wrap", "wrap_and_describe", "unwrap", "strategy_of", "full_state_dict", "no_sync",
           "gradient_bytes"]


STRATEGIES: dict[str, type[Strategy]] = {"ddp": DDPStrategy, "fsdp": FSDPStrategy, "deepspeed": DeepSpeedStrategy}


def get_strategy(name: str) -> Strategy:
    """The strategy called `name`; ValueError listing the valid names otherwise."""
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGIES)}") from None


def _strategy_of(model: nn.Module) -> Strategy | None:
    return getattr(model, "_gpuscale_strategy", None)


def wrap(model: nn.Module, strategy: str | None = None, rt: Runtime | None = None,
         precision: Precision | None = None) -> nn.Module:
    """Wrap `model` for data-parallel training (re-wrap it if it was wrapped before).

    Call it after choosing which parameters train; the returned model is what you call, build
    the optimizer on, and hand to `Checkpointer`. With one process the model is returned as is
    (moved to the device), so the same script runs everywhere.
    """
    return wrap_and_describe(model, strategy, rt, precision)[0]


def wrap_and_describe(model: nn.Module, strategy: str | None = None, rt: Runtime | None = None,
                      precision: Precision | None = None) -> tuple[nn.Module, wrapped_facts.Wrapped]:
    """`wrap`, also returning the facts it announced (`gpuscale.base.wrapped`)."""
    rt = rt or current()
    previous = _strategy_of(model)
    chosen = get_strategy(strategy) if strategy else (previous or get_strategy("ddp"))
    if previous is not None and previous.sharded and chosen.name != previous.name and rt.is_distributed:
        raise ValueError(f"this model was sharded in place by {previous.name} and cannot be re-wrapped with {chosen.name}; "
                         "build a fresh model")
    module = previous.unwrap(model) if previous else model
    wrapped = chosen.wrap(module, rt, precision)
    wrapped._gpuscale_strategy = chosen  # type: ignore[assignment]
    gathers = chosen.gathers_parameters(wrapped)
    facts = wrapped_facts.Wrapped(strategy=chosen.name, gradient_bytes=gradient_bytes(module), gathers_parameters=gathers,
                                  collective_forward=gathers and rt.is_distributed)
    wrapped_facts.announce(facts)
    return wrapped, facts


def gradient_bytes(module: nn.Module) -> int:
    """Bytes of the gradients of `module`'s trainable parameters: what data parallelism all-reduces per step.

    Gradients have their parameter's dtype (fp32 also under autocast; bf16 when the weights are bf16).
    """
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's own module inside a wrapped model (the model itself if it is not wrapped)."""
    strategy = _strategy_of(model)
    return strategy.unwrap(model) if strategy else model


def strategy_of(model: nn.Module) -> Strategy:
    """The strategy a model was wrapped with (DDP semantics for a model never wrapped)."""
    return _strategy_of(model) or get_strategy("ddp")


def full_state_dict(model: nn.Module) -> dict[str, Any]:
    """The model's complete state dict with the user's own keys, on CPU where gathered.

    Collective for sharding strategies (every rank calls it; rank 0 receives the whole); for DDP
    and single processes it is the module's own state dict without the ``module.`` prefix.
    """
    return strategy_of(model).state_dict(model)
