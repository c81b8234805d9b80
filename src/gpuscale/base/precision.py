"""Mixed precision, chosen in one place: ``fp32``, ``bf16`` or ``fp16`` (with loss scaling), or ``auto``.

    precision = resolve_precision("auto", rt.device)   # bf16 on a GPU that has it, else fp32
    with precision.autocast():
        loss = model(x)

One `Precision` answers every strategy's question, so that a run never mixes two answers:
autocast for the forward pass, a gradient scaler for fp16 (DDP and FSDP), FSDP2's
`MixedPrecisionPolicy`, the ``bf16``/``fp16`` sections of a DeepSpeed config, and the
``bf16``/``fp16`` flags of HF `TrainingArguments`.

``auto`` is bf16 where the device computes in it natively (CUDA GPUs from Ampere on, and AMD
MI200/MI300, which torch reports as CUDA devices), fp32 elsewhere: a CPU gains nothing reliable
from bf16 autocast, and fp16 needs loss scaling that ``auto`` should never switch on behind the
user's back. bf16 keeps fp32's exponent range, so it needs no loss scaling; fp16 does, and gets a
dynamic scaler. Parameters and optimizer states stay fp32 (master weights) with DDP and FSDP;
gradients are reduced in fp32 under FSDP.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PRECISIONS", "Precision", "resolve_precision"]

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class Precision:
    """A resolved precision for one device type (never ``auto``)."""

    name: str
    """'fp32', 'bf16' or 'fp16'."""
    device_type: str
    """'cuda' or 'cpu': where autocast runs."""

    def __post_init__(self) -> None:
        assert self.name in _DTYPES, self.name

    @property
    def dtype(self) -> torch.dtype:
        """The dtype matrix multiplications run in."""
        return _DTYPES[self.name]

    @property
    def scales_loss(self) -> bool:
        """Whether gradients need loss scaling (fp16 only)."""
        return self.name == "fp16"

    def autocast(self) -> AbstractContextManager[Any]:
        """The context to run forward passes (and the loss) in; does nothing for fp32."""
        if self.name == "fp32":
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """A dynamic loss scaler for fp16, None otherwise."""
        return torch.amp.GradScaler(self.device_type) if self.scales_loss else None

    def fsdp_policy(self) -> Any:
        """FSDP2's MixedPrecisionPolicy: compute in bf16/fp16, reduce gradients in fp32; None for fp32."""
        if self.name == "fp32":
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)

    def deepspeed_config(self) -> dict[str, Any]:
        """The ``bf16`` and ``fp16`` sections of a DeepSpeed config (fp16 with dynamic loss scaling)."""
        return {
            "bf16": {"enabled": self.name == "bf16"},
            "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
            if self.name == "fp16" else {"enabled": False},
        }

    def trainer_arguments(self) -> dict[str, bool]:
        """The precision flags of HF `TrainingArguments`."""
        return {"bf16": self.name == "bf16", "fp16": self.name == "fp16"}


def bf16_supported(device: torch.device) -> bool:
    """Whether `device` computes natively in bf16 (False on CPU: see the module docstring)."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_precision(name: str, device: torch.device) -> Precision:
    """Turn a user's choice into a `Precision` for `device`; ValueError for a choice it cannot run."""
    if name not in PRECISIONS:
        raise ValueError(f"precision={name!r} is not one of {', '.join(PRECISIONS)}")
    if name == "auto":
        name = "bf16" if bf16_supported(device) else "fp32"
    elif name == "bf16" and device.type == "cuda" and not bf16_supported(device):
        raise ValueError(f"precision=bf16 but {torch.cuda.get_device_name(device)} has no native bf16; use fp16 or fp32")
    return Precision(name=name, device_type="cuda" if device.type == "cuda" else "cpu")
