"""GPT-neo's attention through torch.nn.functional.scaled_dot_product_attention (gptneo_imdb.py --attention).

transformers' GPT-neo has only eager attention (``_supports_sdpa`` is False, its flash path needs the flash-attn
package): every layer multiplies out the full (sequence x sequence) score matrix of each head, in fp32, masks it
and takes its softmax. `use_sdpa_attention(model)` gives each of its attention layers (GPTNeoSelfAttention) another
forward that computes the same through PyTorch's fused kernels; the weights, the checkpoints, the wrapping (DDP,
DeepSpeed, FSDP) and autocast are untouched. What eager GPT-neo computes (transformers 5.17 to 5.24,
models/gpt_neo/modeling_gpt_neo.py):

- scores q . k with no division by sqrt(head size) (``_attn``: a plain matmul): ``scale=1.0`` here;
- query and key in fp32 (``_attn`` casts them), the softmax's weights cast back to the value's dtype; here the
  kernels take q, k and v in their own dtype (bf16 under autocast) and accumulate in fp32;
- "global" layers causal; "local" layers a causal window of ``config.window_size`` tokens, the query's own
  included: query i sees keys i - window + 1 .. i (the mask is tril(ones) xor tril(ones, -window));
- the padding mask added to the scores, dropout (``attention_dropout``) on the weights while training, then the
  output projection and ``resid_dropout``.

The kernels here:

- global layers, and local layers whose sequence fits in the window: SDPA with ``is_causal`` (on a GPU
  FlashAttention's kernel: no score matrix in memory);
- local layers on longer sequences, ``local="chunks"`` (the default): SDPA over chunks of ``window`` queries, each
  attending to the keys of its own chunk and the one before under a (window x 2 window) band mask, so memory and
  work grow as sequence x window and no (sequence x sequence) matrix is formed; ``local="flex"``: torch's
  FlexAttention with a block mask of the window, compiled (once per shape) on a GPU. Elsewhere FlexAttention runs
  its reference code, which forms the full score matrix and has no backward on a CPU: for checks, not for speed.
  The chunks run instead where gradients are needed off a GPU, and while training with ``attention_dropout`` > 0
  (FlexAttention has no dropout).

The fast path needs what training on chunks gives: queries and keys the same tokens from position 0, causal
masking, and padding, if any, only at the end of each row (transformers' tokenizers pad on the right). Padding
there needs no mask: a causal query never sees the tokens after it, so every real position gets eager's result;
only the positions of padding (whose labels are -100, ignored by the loss) get other values. Everything else
runs transformers' eager computation unchanged, with transformers' own mask: incremental decoding with a KV cache
(generate() after its first step), padding on the left or inside a row, sequences packed by restarting position
ids, ``output_attentions``. So generate() gives eager's tokens.

The plumbing: the model's config names this module's mask function (``config._attn_implementation``, which
transformers does not write into a saved config.json), so transformers calls it once per forward instead of
building a (batch x sequence x sequence) mask, and it tells the layers whether the fast path applies. A batch with a
padding mask costs one check of it per forward (on a GPU a synchronisation, and a graph break when compiled), so the
example trains on batches from `EndPaddingCollator`, which leaves the mask out where padding is only at row ends. A
forward with neither mask nor position ids nor cache (such a batch under the Trainer, which turns the cache off) gets
its all-ones mask from `mark_unpadded`, a hook on the model (gpuscale's, from `gpuscale.integrations.hf_sdpa`, which does the
same for transformers' own SDPA models), and so escapes transformers' search for packed sequences:
a synchronisation every forward, and compiled a mask that would send every layer to eager attention.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from gpuscale.integrations.hf_sdpa import mark_unpadded  # the rows' all-ones mask where a forward gives none

NAME = "gpuscale_sdpa"  # the model config's _attn_implementation once switched, and our mask function's name
LOCAL_KERNELS = ("chunks", "flex")


class CausalMask:
    """What a switched model's forward hands its layers when the fast path applies: causal attention from position 0,
    no padding except at the ends of rows. Layers that fall back get transformers' eager mask from `eager()`."""

    def __init__(self, arguments: dict[str, Any]) -> None:
        self.arguments = arguments  # those transformers gave the mask function
        self._eager: torch.Tensor | None = None

    def eager(self) -> torch.Tensor:
        """The additive float mask transformers builds for eager attention (built once, on first use)."""
        from transformers.masking_utils import eager_mask

        if self._eager is None:
            self._eager = eager_mask(**self.arguments)
        return self._eager


def padding_only_at_ends(padding: torch.Tensor | None, length: int) -> bool:
    """Whether a (batch x length) mask of real tokens (True) has its padding only after each row's tokens."""
    if padding is None:
        return True
    if padding.shape[-1] != length:
        return False
    if padding.stride(-1) == 0:  # one value per row (`mark_unpadded`'s mask): all real or all padding, read from the strides
        return True
    padding = padding.bool()
    return not bool((padding[:, 1:] & ~padding[:, :-1]).any())  # a real token after a padding one


def layer_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: Any = 0,
               mask_function: Any = None, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """transformers' mask function for NAME (AttentionMaskInterface): a CausalMask where the fast path applies,
    otherwise the eager mask. Called once per forward with transformers' arguments, all passed on to eager_mask."""
    from transformers.masking_utils import causal_mask_function, eager_mask

    mask_function = causal_mask_function if mask_function is None else mask_function
    arguments = {"batch_size": batch_size, "q_length": q_length, "kv_length": kv_length, "q_offset": q_offset,
                 "kv_offset": kv_offset, "mask_function": mask_function, "attention_mask": attention_mask, **kwargs}
    from_start = all(not isinstance(offset, torch.Tensor) and offset == 0 for offset in (q_offset, kv_offset))  # no cache
    fast = (mask_function is causal_mask_function and from_start and q_length == kv_length
            and padding_only_at_ends(attention_mask, kv_length))
    return CausalMask(arguments) if fast else eager_mask(**arguments)


def drop_end_padding_mask(batch: dict[str, Any]) -> dict[str, Any]:
    """`batch` without its ``attention_mask`` where the mask adds nothing on the fast path: every row's padding, if
    any, at its end (a causal query never sees what comes after it). Checked on the host, where the collator made the
    batch, so the model's forward needs neither the check (a device synchronisation) nor a graph break for it."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and padding_only_at_ends(mask, mask.shape[-1]):
        batch = {key: value for key, value in batch.items() if key != "attention_mask"}
    return batch


class EndPaddingCollator:
    """A collator whose batches leave out the attention mask where `drop_end_padding_mask` allows (training on packed
    or right-padded chunks); batches with padding elsewhere keep it."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, features: list[Any]) -> dict[str, Any]:
        return drop_end_padding_mask(dict(self.collate(features)))


def register() -> None:
    """Make NAME known to transformers' mask creation (idempotent)."""
    from transformers.masking_utils import AttentionMaskInterface

    if NAME not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(NAME, layer_mask)


def make_band(window: int, device: torch.device) -> torch.Tensor:
    """(window x 2 window) booleans: query i of a chunk sees key j of [previous chunk, own chunk] iff i < j <= i + window
    (the key's position is then 0 to window - 1 tokens back)."""
    i = torch.arange(window, device=device)[:, None]
    j = torch.arange(2 * window, device=device)[None, :]
    return (j > i) & (j <= i + window)


cached_band = functools.lru_cache(maxsize=8)(make_band)


def band(window: int, device: torch.device) -> torch.Tensor:
    """`make_band`, made once per window and device in eager mode; inside a compiled graph made in the graph (a
    constant the compiler folds), since Dynamo does not trace into a cache."""
    return make_band(window, device) if torch.compiler.is_compiling() else cached_band(window, device)


def chunks_of(t: torch.Tensor, window: int) -> torch.Tensor:
    """(batch, heads, n x window, d) -> (batch, heads x n, window, d): consecutive chunks of `window` tokens."""
    b, h, s, d = t.shape
    return t.reshape(b, h * (s // window), window, d)


def windowed_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, dropout_p: float = 0.0) -> torch.Tensor:
    """Causal sliding-window attention (query i sees keys i - window + 1 .. i), scale 1, through SDPA over chunks of
    `window` queries: the first chunk causal, each later one against its previous and own chunk under `band`."""
    s = q.shape[-2]
    if s <= window:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=1.0)
    pad = -s % window  # the last chunk filled with zeros: keys after every real query, queries dropped at the end
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    first = F.scaled_dot_product_attention(q[:, :, :window], k[:, :, :window], v[:, :, :window], dropout_p=dropout_p,
                                           is_causal=True, scale=1.0)
    keys, values = (torch.cat([chunks_of(t[:, :, :-window], window), chunks_of(t[:, :, window:], window)], dim=-2)
                    for t in (k, v))
    rest = F.scaled_dot_product_attention(chunks_of(q[:, :, window:], window), keys, values,
                                          attn_mask=band(window, q.device), dropout_p=dropout_p, scale=1.0)
    out = torch.cat([first, rest.reshape(q.shape[0], q.shape[1], -1, q.shape[-1])], dim=-2)
    return out[:, :, :s]


@functools.lru_cache(maxsize=16)
def window_block_mask(length: int, window: int, device: torch.device) -> Any:
    """FlexAttention's block mask of the causal window for `length` tokens (any batch, any head), made once."""
    from torch.nn.attention.flex_attention import create_block_mask

    def in_window(b: Any, h: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return create_block_mask(in_window, None, None, length, length, device=device)


@functools.lru_cache(maxsize=1)
def compiled_flex() -> Any:
    """flex_attention compiled (on a GPU; uncompiled it forms the full score matrix)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Causal sliding-window attention, scale 1, through FlexAttention (compiled on CUDA, reference code elsewhere)."""
    from torch.nn.attention.flex_attention import flex_attention

    attend = compiled_flex() if q.device.type == "cuda" else flex_attention
    return attend(q, k, v, block_mask=window_block_mask(q.shape[-2], window, q.device), scale=1.0)


def attend(layer: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A layer's attention on the fast path: (batch, heads, sequence, head size) in, the same out."""
    dropout_p = layer.attn_dropout.p if layer.training else 0.0
    window = layer.config.window_size
    if layer.attention_type != "local" or q.shape[-2] <= window:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=1.0)
    if layer.local_kernel == "flex" and dropout_p == 0.0 and (q.device.type == "cuda" or not q.requires_grad):
        return flex_window(q, k, v, window)
    return windowed_sdpa(q, k, v, window, dropout_p)


def sdpa_forward(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None, layer_past: Any = None,
                 use_cache: bool = False, output_attentions: bool = False, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """GPTNeoSelfAttention.forward, the attention itself through `attend` when the mask allows, else eager's `_attn`."""
    query, key, value = (self._split_heads(proj(hidden_states), self.num_heads, self.head_dim)
                         for proj in (self.q_proj, self.k_proj, self.v_proj))
    if layer_past is not None:  # the cache (transformers makes one in training too while config.use_cache)
        key, value = layer_past.update(key, value, self.layer_id)
    weights = None
    if isinstance(attention_mask, CausalMask) and not output_attentions and key.shape[-2] == query.shape[-2]:
        output = attend(self, query, key, value)
    else:
        eager = attention_mask.eager() if isinstance(attention_mask, CausalMask) else attention_mask
        output, weights = self._attn(query, key, value, eager)
    output = self.out_proj(self._merge_heads(output, self.num_heads, self.head_dim))
    return self.resid_dropout(output), weights


@functools.cache
def sdpa_class(base: type) -> type:
    """The subclass of an eager attention class whose forward is `sdpa_forward` (made once per class, and kept in
    this module under its name, where pickle looks for it)."""
    cls = type(f"Sdpa{base.__name__}", (base,), {"forward": sdpa_forward, "__module__": __name__})
    globals()[cls.__name__] = cls
    return cls


def use_sdpa_attention(model: torch.nn.Module, local: str = "chunks") -> int:
    """Switch every GPT-neo attention layer of `model` to SDPA (see the module's docstring); returns how many.

    Only GPT-neo models on eager attention change (another attention implementation, flash_attention_2, is left
    alone); `local` picks the local layers' kernel beyond the window ("chunks" or "flex"). Call it before wrapping
    the model (DDP, DeepSpeed); calling it again changes only `local`.
    """
    from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoModel, GPTNeoSelfAttention

    if local not in LOCAL_KERNELS:
        raise ValueError(f"local kernel {local!r} is not one of {', '.join(LOCAL_KERNELS)}")
    register()
    fast = sdpa_class(GPTNeoSelfAttention)
    switched = 0
    for stack in (m for m in model.modules() if isinstance(m, GPTNeoModel)):
        layers = [m for m in stack.modules() if isinstance(m, GPTNeoSelfAttention)]
        if stack.config._attn_implementation not in ("eager", NAME) or any(type(m) not in (GPTNeoSelfAttention, fast) for m in layers):
            continue  # another implementation, or layers of someone's own class: left as they are
        for layer in layers:
            layer.__class__ = fast
            layer.local_kernel = local
        if mark_unpadded not in stack._forward_pre_hooks.values():
            stack.register_forward_pre_hook(mark_unpadded, with_kwargs=True)
        stack.config._attn_implementation = NAME
        switched += len(layers)
    return switched


def attention_in_use(model: torch.nn.Module) -> str:
    """The attention `model` runs: sdpa (sdpa+flex with FlexAttention's local layers) once switched, else its
    config's attention implementation (eager for GPT-neo's own)."""
    layers = [m for m in model.modules() if hasattr(m, "local_kernel")]
    if layers:
        kernel = layers[0].local_kernel
        return "sdpa" if kernel == "chunks" else f"sdpa+{kernel}"
    return str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager")
