"""transformers decoders on their own SDPA: which ones a compiled step gives an explicit mask, and which of them
`gpuscale.integrations.hf_sdpa.use_causal_sdpa` can switch (read from the model's classes; transformers not imported).

Compiled, a decoder-only transformers model on SDPA gets an explicit causal mask in every layer (docs/traps.md). The
switch renames its attention implementation, so it is for models whose code reaches attention only through
transformers' attention interface (``_supports_attention_backend``) and never tests the name itself: a model whose
modeling code compares ``config._attn_implementation`` with ``"sdpa"`` (Gemma 4, Falcon, GLM-5 next, ...) would take
another path once renamed, and is refused (`switch_refusal`).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys

from torch import nn

__all__ = ["is_decoder_only_lm", "switch_refusal", "switchable_sdpa_model", "transformers_model"]

_TESTS_THE_NAME = re.compile(r"""_attn_implementation[^\n]{0,60}["']sdpa["']|["']sdpa["'][^\n]{0,60}_attn_implementation""")
_LIBRARY = ("transformers.", "torch.", "peft.", "accelerate.", "builtins", "typing", "abc", "collections")


def _model_modules(cls: type) -> list[str]:
    """The modules of `cls`'s classes that hold model code: transformers' modeling files and the user's own, not the
    libraries' machinery (transformers' base classes, torch, peft)."""
    names = dict.fromkeys(c.__module__ for c in cls.__mro__)
    return [n for n in names if n.startswith("transformers.models.") or not n.startswith(_LIBRARY)]


def _own_classes(cls: type) -> list[type]:
    """The classes of `cls`'s line that the user wrote (outside transformers and the other libraries)."""
    return [c for c in cls.__mro__ if not c.__module__.startswith(_LIBRARY)]


def transformers_model(model: nn.Module) -> nn.Module | None:
    """The transformers model in `model`: itself, or the first one inside a wrapper (DDP, FSDP, DeepSpeed, PEFT)."""
    return next((m for m in model.modules() if hasattr(m, "set_attn_implementation") and getattr(m, "config", None) is not None), None)


def is_decoder_only_lm(module: nn.Module) -> bool:
    """Whether `module` is a transformers language model of decoder layers alone that builds a causal mask: one of its
    classes' modeling files uses ``create_causal_mask`` (a subclass of the user's own counts), it generates
    (``can_generate()``: a ``...ForCausalLM``, GPT-2's ``LMHeadModel``), and it is not an encoder-decoder. Encoders
    (BERT, ViT) and encoder-decoders (T5) are not."""
    can_generate = getattr(module, "can_generate", None)
    uses_causal_mask = any(hasattr(sys.modules.get(name), "create_causal_mask") for name in _model_modules(type(module)))
    return (uses_causal_mask and not getattr(getattr(module, "config", None), "is_encoder_decoder", False)
            and callable(can_generate) and bool(can_generate()))


@functools.cache
def _tests_the_name(module_name: str) -> bool | None:
    """Whether the source of the module `module_name` compares the attention implementation's name with "sdpa"
    (None: no source to read)."""
    try:
        source = inspect.getsource(sys.modules[module_name])
    except (KeyError, OSError, TypeError):
        return None
    return bool(_TESTS_THE_NAME.search(source))


def _class_tests_the_name(cls: type) -> bool:
    """Whether a class the user wrote compares the name with "sdpa" in its own code (a class without source, made at
    run time, says nothing against it)."""
    try:
        return bool(_TESTS_THE_NAME.search(inspect.getsource(cls)))
    except (OSError, TypeError):
        return False


def switch_refusal(module: nn.Module) -> str | None:
    """Why `use_causal_sdpa` cannot switch the transformers model `module`; None where it can: a decoder-only
    language model on transformers' SDPA through its attention interface, whose code never tests the name."""
    name = type(module).__name__
    attention = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if not is_decoder_only_lm(module):
        return (f"it is for decoder-only language models (a ...ForCausalLM); {name} is not one (an encoder or an "
                "encoder-decoder gets no causal mask to leave out)")
    if attention != "sdpa":
        return (f"{name} runs attention {attention!r}, not transformers' SDPA; load it with attn_implementation='sdpa' "
                "(a model without an SDPA path, such as GPT-neo, has no use for it)")
    if not getattr(module, "_supports_attention_backend", False):
        return (f"{name} calls SDPA from code of its own, not through transformers' attention interface, which the switch "
                "plugs into: nothing to switch")
    for source in (n for n in _model_modules(type(module)) if n.startswith("transformers.models.")):
        tests = _tests_the_name(source)
        if tests or tests is None:
            why = "compares the attention's name with 'sdpa'" if tests else "cannot be read to check"
            return f"{name}'s code ({source}) {why}: renamed, the model could take another path, so it is left as it is"
    for cls in _own_classes(type(module)):
        if _class_tests_the_name(cls):
            return (f"{name}'s own class {cls.__qualname__} compares the attention's name with 'sdpa': renamed, the "
                    "model could take another path, so it is left as it is")
    return None


def switchable_sdpa_model(model: nn.Module) -> nn.Module | None:
    """The transformers model in `model` (`transformers_model`) if it runs transformers' own SDPA and `switch_refusal`
    has nothing against it; None otherwise."""
    found = transformers_model(model)
    return found if found is not None and switch_refusal(found) is None else None
