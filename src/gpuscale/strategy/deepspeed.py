"""Strategy ``deepspeed``: ZeRO stage 1, 2 or 3 (optionally offloaded to CPU memory) through DeepSpeed.

ZeRO shards what DDP replicates: stage 1 the optimizer states, stage 2 also the gradients, stage
3 also the parameters (docs/measuring.md, the prediction). DeepSpeed owns the training step: its engine scales the loss
for accumulation and precision, reduces the gradients and steps the optimizer, so a deepspeed run
goes through `gpuscale.setup` (which builds the engine around the model and the optimizer
together) rather than `gpuscale.wrap`. Its config is built from the `BatchPlan` so that its batch
agrees with the loader (`gpuscale.strategy.deepspeed_config`).

DeepSpeed is an optional dependency (``pip install 'gpuscale[deepspeed]'``, with DS_BUILD_OPS=0 so
nothing is compiled at install time) imported only when this strategy is used. It needs a process
group even for one process; `setup` starts a one-rank group then.

Checkpoints are DeepSpeed's own sharded format (each rank writes its optimizer partition) inside
gpuscale's checkpoint directory, committed by the same rename as FSDP's. DeepSpeed reads them with
``weights_only=False``; before it does, every file's pickle is scanned and refused unless it names
only tensors, plain data and the few DeepSpeed classes its checkpoints hold, so a checkpoint cannot
run code. ZeRO checkpoints resume on the same number of ranks; `gpuscale consolidate` turns one
into a plain fp32 state dict (DeepSpeed's zero_to_fp32) for inference or another world size.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.serialization import get_unsafe_globals_in_checkpoint

from gpuscale.base.precision import Precision
from gpuscale.runtime.init import Runtime
from gpuscale.strategy.ddp import install_trainable_guard
from gpuscale.strategy.deepspeed_config import config_precision

__all__ = ["DeepSpeedStrategy", "import_deepspeed", "check_checkpoint_files", "consolidate_deepspeed", "TAG"]

TAG = "deepspeed"  # DeepSpeed's tag directory inside a gpuscale checkpoint directory
INSTALL_HINT = "DeepSpeed is not installed; install it with: DS_BUILD_OPS=0 pip install 'gpuscale[deepspeed]'"
# Classes DeepSpeed pickles into its checkpoints besides tensors and containers: data, no code.
SAFE_GLOBALS = frozenset({
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
})


def import_deepspeed() -> Any:
    """Import DeepSpeed, or fail with the install command."""
    try:
        import deepspeed
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return deepspeed


class DeepSpeedStrategy:
    """ZeRO data parallelism through a DeepSpeed engine (built by `gpuscale.setup`)."""

    name = "deepspeed"
    sharded = True
    reshards = False  # ZeRO checkpoints load on the number of ranks that wrote them
    channels_last_ok = False  # ZeRO keeps flat, contiguous partitions
    fused_by_default = False  # the engine runs its own optimizer step
    builds_engine = True

    def wrap(self, module: nn.Module, rt: Runtime, precision: Precision | None = None) -> nn.Module:
        raise ValueError("deepspeed builds its engine from the model and the optimizer together: use "
                         "gpuscale.setup(model, optimizer=..., strategy='deepspeed', plan=plan) instead of gpuscale.wrap")

    def initialize(self, module: nn.Module, optimizer: Any, config: dict[str, Any]) -> tuple[nn.Module, Any]:
        """Build the engine; returns (engine, its optimizer). `optimizer` is a torch optimizer or None."""
        deepspeed = import_deepspeed()
        if not any(p.requires_grad for p in module.parameters()):
            raise ValueError("the model has no trainable parameters; unfreeze some before gpuscale.setup")
        engine, ds_optimizer, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config_precision(config) or "")
        if dtype is not None:
            # DeepSpeed casts the parameters to bf16/fp16 but not the inputs: cast floating inputs
            # as FSDP does, so an evaluation loop without autocast works under every strategy.
            module.register_forward_pre_hook(_input_caster(dtype), with_kwargs=True)
        # ZeRO partitions the parameters that train now; unfrozen ones would never be updated.
        install_trainable_guard(engine, module)
        return engine, ds_optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        return getattr(model, "module", model)

    def gathers_parameters(self, model: nn.Module) -> bool:
        """ZeRO-3 gathers the partitioned parameters in every forward pass (stages 1 and 2 keep them whole)."""
        return model.zero_optimization_stage() == 3

    def sync_probe_blocker(self, model: nn.Module) -> str | None:
        return "deepspeed: the engine owns the backward pass and its buckets; synchronisation cannot be switched off for a replay"

    def grad_scaler(self, precision: Precision) -> torch.amp.GradScaler | None:
        return None  # the engine scales fp16 losses itself

    def forward_context(self, model: nn.Module, last_micro_batch: bool) -> AbstractContextManager[Any]:
        return nullcontext()  # the engine decides at its accumulation boundary

    def scale_loss(self, loss: torch.Tensor, micro_batches: int, scaler: torch.amp.GradScaler | None) -> torch.Tensor:
        return loss  # the engine divides by its accumulation steps and scales

    def backward(self, model: nn.Module, loss: torch.Tensor, last_micro_batch: bool) -> None:
        model.backward(loss)  # reduces at the engine's own accumulation boundary

    def step(self, model: nn.Module, optimizer: Any, *, due: bool, scaler: torch.amp.GradScaler | None,
             clip_grad_norm: float | None) -> tuple[bool, Any]:
        """Step the engine on every micro-batch (it steps the optimizer at its boundary, clipping by its config)."""
        boundary = model.is_gradient_accumulation_boundary()
        model.step()
        if not boundary:
            return False, None
        norm = model.get_global_grad_norm()
        return True, norm  # a tensor or a number; Training.grad_norm reads it when asked

    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        if model.zero_optimization_stage() == 3:
            # Collective: gathers the partitioned parameters; rank 0 receives them.
            return model._zero3_consolidated_16bit_state_dict() or {}
        return {k: v.detach().cpu() for k, v in self.unwrap(model).state_dict().items()}

    def load_state_dict(self, model: nn.Module, state: dict[str, Any]) -> None:
        raise ValueError("a deepspeed run resumes from its own sharded checkpoints; to start from plain weights, "
                         "load them into the model before gpuscale.setup")

    def optimizer_state_dict(self, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        raise ValueError("a deepspeed optimizer's state is sharded; it is saved with the checkpoint (gpuscale.Checkpointer)")

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
        raise ValueError("a deepspeed optimizer's state is sharded; it is loaded with the checkpoint (gpuscale.Checkpointer.resume)")

    def writes_checkpoint(self, rt: Runtime) -> bool:
        return rt.rank == 0

    def save_sharded(self, model: nn.Module, optimizer: Any, directory: str) -> None:
        """Every rank writes its partition into `directory`/deepspeed (collective)."""
        model.save_checkpoint(directory, tag=TAG, client_state={}, save_latest=False)

    def load_sharded(self, model: nn.Module, optimizer: Any, directory: str) -> None:
        """Read this rank's partition back after checking every file holds data only (collective)."""
        check_checkpoint_files(Path(directory))
        path, _ = model.load_checkpoint(
            directory, tag=TAG, load_optimizer_states=optimizer is not None, load_lr_scheduler_states=True,
            load_module_strict=True,
        )
        if path is None:
            raise ValueError(f"{directory} holds no DeepSpeed checkpoint (no {TAG}/ inside)")


def _input_caster(dtype: torch.dtype) -> Any:
    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(cast(v) for v in value)
        if isinstance(value, dict):
            return {k: cast(v) for k, v in value.items()}
        return value

    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return cast(args), cast(kwargs)

    return hook


def check_checkpoint_files(directory: Path, tag: str = TAG) -> None:
    """Refuse a DeepSpeed checkpoint whose pickles name anything but data (they are loaded unsafely)."""
    files = sorted((directory / tag).glob("*.pt"))
    if not files:
        raise ValueError(f"{directory} holds no DeepSpeed checkpoint files ({tag}/*.pt)")
    refuse_unsafe_pickles(files, "load it")


def deepspeed_tag(source: Path) -> tuple[Path, str] | None:
    """(checkpoint directory, tag) where `source` is a DeepSpeed checkpoint: gpuscale's (its `TAG` folder), one
    DeepSpeed's own save_checkpoint wrote (the HF Trainer's checkpoint-N: a `latest` file naming its global_stepN
    folder), or such a tag folder itself (its mp_rank_00_model_states.pt, or ZeRO-3's zero_pp_rank_N_mp_rank_00_...);
    None for anything else."""
    if not source.is_dir():
        return None
    if (source / TAG).is_dir():
        return source, TAG
    latest = source / "latest"
    if latest.is_file():
        tag = latest.read_text().strip()
        if tag and (source / tag).is_dir():
            return source, tag
    if any(source.glob("*mp_rank_*_model_states.pt")):  # ZeRO-3's are zero_pp_rank_N_mp_rank_00_model_states.pt
        return source.parent, source.name
    return None


def refuse_unsafe_pickles(files: Iterable[Path], refusing: str) -> None:
    """ValueError naming the first of `files` that cannot be read, or whose pickle names objects other than
    tensors and DeepSpeed's bookkeeping (DeepSpeed loads them with ``weights_only=False``: such a file could run
    code). `refusing` says what is refused ("load it", "resume from it")."""
    for file in files:
        try:
            unsafe = set(get_unsafe_globals_in_checkpoint(str(file)))
        except Exception as exc:
            raise ValueError(f"{file} cannot be read as a checkpoint ({type(exc).__name__}); it may be truncated") from None
        forbidden = sorted(unsafe - SAFE_GLOBALS)
        if forbidden:
            raise ValueError(f"{file} names {', '.join(forbidden[:3])}: objects other than tensors and DeepSpeed's "
                             f"bookkeeping; refusing to {refusing} (a checkpoint must not run code)")


def consolidate_deepspeed(directory: Path, tag: str = TAG) -> dict[str, Any]:
    """The fp32 weights of a DeepSpeed checkpoint directory (`deepspeed_tag`) as one plain state dict (no process group)."""
    check_checkpoint_files(directory, tag)
    import_deepspeed()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=tag)
    return {name: tensor.detach().clone() for name, tensor in state.items()}
