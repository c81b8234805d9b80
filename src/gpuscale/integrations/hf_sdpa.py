"""transformers' SDPA attention, compiled, without a mask where the batch needs none.

A transformers model on SDPA (``attn_implementation="sdpa"``, the default where the model offers it) lets
`torch.nn.functional.scaled_dot_product_attention` choose its kernel. The fastest ones on a GPU (FlashAttention's,
cuDNN's) take no mask: they need ``is_causal=True`` and ``attn_mask=None``. Uncompiled, transformers gets there by
reading the batch: the padding mask is all ones, the position ids restart nowhere (packed sequences), so the causal
mask can be left out. Each read is a device synchronisation. Compiled (``TrainingArguments.torch_compile``,
``torch.compile(model)``), it cannot read values, so it keeps the mask: every layer of every step gets an explicit
(batch x 1 x sequence x sequence) mask, and SDPA takes a slower kernel that accepts one (transformers 5.17 always;
5.24 unless a KV cache is in use, and the Trainer turns it off). docs/traps.md has the details.

`use_causal_sdpa(model)` lets a compiled model skip the mask where the batch gives it nothing to do. It answers
from what is known when the graph is traced, not from values:

- a forward of the model's decoder given no attention mask, no position ids and no cache (a batch of packed or
  unpadded rows whose collator left the mask out, see `UnmaskedCollator`) gets the mask its rows have, all ones:
  one True expanded over (batch x sequence), which the mask function recognises by its strides (all 0) without
  reading it. transformers then has no packed sequences to look for;
- the mask function, registered under `NAME` with transformers' SDPA attention beside it, returns no mask (so
  SDPA runs ``is_causal=True``) for that all-ones mask, or no mask, when the pattern is plain causal attention
  over the whole sequence from its first position (no cache offset, queries and keys the same tokens). Everything
  else goes to transformers' own SDPA mask unchanged: padding, packed sequences given by position ids, sliding
  windows, bidirectional layers, decoding with a KV cache (so ``generate()`` is unchanged).

So what attention computes is what the unswitched model computes; only the kernel changes (for models whose code
reaches attention only through transformers' interface: `gpuscale.runtime.causal_sdpa` refuses the others). A batch
with a real padding mask, even one of all ones, keeps transformers' path: `UnmaskedCollator` drops an all-ones mask
on the host, where the collator made the batch, for no device synchronisation (not where the batch carries position
ids: see `drop_all_ones_mask`).

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="sdpa")
    use_causal_sdpa(model)                                   # before the Trainer (or torch.compile) wraps it
    trainer = Trainer(model=model, args=TrainingArguments(..., torch_compile=True),
                      data_collator=UnmaskedCollator(default_data_collator), ...)

`check_trainer` (gpuscale.integrations.hf) warns when a compiled Trainer's model runs transformers' SDPA without
this switch. The switch lives in this process: ``config._attn_implementation`` is not saved with the model, and a
model loaded again starts on transformers' own SDPA.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from gpuscale.runtime.causal_sdpa import switch_refusal, transformers_model

NAME = "gpuscale_causal_sdpa"  # the attention implementation and mask function registered with transformers
DECODER_INPUTS = ("attention_mask", "position_ids", "cache", "past_key_values")  # a decoder's forward (cache: 5.24's)


def is_all_ones_marker(mask: Any) -> bool:
    """Whether `mask` is `mark_unpadded`'s: a 2-D mask over more than one token made of one value expanded (stride 0
    along every dimension longer than 1: a traced graph may give a dimension of 1 another), known without reading
    it. A mask of real values, even all ones, is not (reading it costs a device synchronisation). A caller's own mask
    made of one value expanded is taken for the marker too: one False expanded, a batch with no token to attend to,
    would be misread, which no training batch is."""
    return (isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] > 1
            and all(stride == 0 for stride, size in zip(mask.stride(), mask.shape, strict=True) if size > 1))


def causal_sdpa_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: Any = 0,
                     mask_function: Callable[..., Any] | None = None, attention_mask: torch.Tensor | None = None,
                     **kwargs: Any) -> Any:
    """transformers' mask function for `NAME` (AttentionMaskInterface): None, so that SDPA runs ``is_causal=True``,
    where the pattern is plain causal attention from position 0 and the padding mask is absent or the all-ones
    marker; otherwise transformers' own SDPA mask with the arguments as given."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    plain_causal = mask_function is None or mask_function is causal_mask_function
    from_start = all(not isinstance(offset, torch.Tensor) and offset == 0 for offset in (q_offset, kv_offset))
    if (plain_causal and from_start and q_length == kv_length and q_length > 1 and kwargs.get("local_size") is None
            and kwargs.get("allow_is_causal_skip", True) and (attention_mask is None or is_all_ones_marker(attention_mask))):
        return None
    if mask_function is not None:
        kwargs["mask_function"] = mask_function
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, attention_mask=attention_mask, **kwargs)


def mark_unpadded(decoder: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A forward pre-hook on the model's decoder: a call given no attention mask, no position ids and no cache gets
    the all-ones marker as its mask (see the module's docstring). A call that passes more than the tokens by
    position, or any of those inputs, is left as it is."""
    if len(args) > 1 or any(kwargs.get(name) is not None for name in DECODER_INPUTS):
        return None
    tokens = args[0] if args else kwargs.get("input_ids")
    tokens = tokens if tokens is not None else kwargs.get("inputs_embeds")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() < 2:
        return None
    ones = torch.ones((), dtype=torch.bool, device=tokens.device).expand(tokens.shape[0], tokens.shape[1])
    return args, {**kwargs, "attention_mask": ones}


def register() -> None:
    """Make `NAME` known to transformers: its SDPA attention function, and `causal_sdpa_mask` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, AttentionInterface._global_mapping["sdpa"])
    if NAME not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(NAME, causal_sdpa_mask)


def use_causal_sdpa(model: torch.nn.Module) -> None:
    """Switch the transformers model in `model` (itself, or inside a DDP, FSDP, DeepSpeed or PEFT wrapper) from
    transformers' SDPA to `NAME` (see the module's docstring); call it before compiling. Calling it again changes
    nothing.

    Raises ValueError, saying what to do, where there is nothing it may switch (`gpuscale.runtime.causal_sdpa`): no
    transformers model; not a decoder-only language model (encoders such as BERT and ViT, encoder-decoders such as
    T5, have no causal mask to leave out); not on transformers' SDPA through its attention interface (eager,
    flash_attention_2, GPT-neo); code that tests the attention's name for "sdpa" (Gemma 4, Falcon), which would take
    another path once renamed; or a transformers older than 4.53 (no mask interface)."""
    target = transformers_model(model)
    if target is None:
        raise ValueError(f"use_causal_sdpa needs a transformers model (PreTrainedModel), not {type(model).__name__}")
    if target.config._attn_implementation == NAME:
        return
    refusal = switch_refusal(target)
    if refusal is not None:
        raise ValueError(f"use_causal_sdpa: {refusal}")
    try:
        register()
    except ImportError:
        raise ValueError("use_causal_sdpa needs transformers 4.53 or later (its attention-mask interface): "
                         "pip install -U transformers") from None
    target.set_attn_implementation(NAME)
    decoder = getattr(target, "base_model", target)
    if mark_unpadded not in decoder._forward_pre_hooks.values():
        decoder.register_forward_pre_hook(mark_unpadded, with_kwargs=True)


PACKING_INPUTS = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx")  # DataCollatorWithFlattening's, and the like


def drop_all_ones_mask(batch: Mapping[str, Any]) -> dict[str, Any]:
    """`batch` without its ``attention_mask`` where that mask is all ones and on the host, and the batch gives no
    position ids or sequence boundaries (no padding anywhere and nothing packed: the model then computes the same
    without it); any other batch as it is. With position ids a mask must stay: transformers looks for sequences
    packed by restarting position ids only where no mask is given, so dropping it would end attention at each
    restart. Reads the mask where the collator made it, so the model's forward needs no device synchronisation."""
    mask = batch.get("attention_mask")
    packed = any(batch.get(name) is not None for name in PACKING_INPUTS)
    if isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and not packed and bool(mask.all()):
        return {key: value for key, value in batch.items() if key != "attention_mask"}
    return dict(batch)


class UnmaskedCollator:
    """A collator whose batches leave out an all-ones attention mask (`drop_all_ones_mask`), around any collator
    that returns a mapping (``default_data_collator``, ``DataCollatorForLanguageModeling``)."""

    def __init__(self, collate: Callable[[list[Any]], Mapping[str, Any]]) -> None:
        self.collate = collate

    def __call__(self, features: list[Any]) -> dict[str, Any]:
        return drop_all_ones_mask(self.collate(features))
