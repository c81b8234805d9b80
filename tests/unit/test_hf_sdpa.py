"""transformers' own SDPA models, compiled (gpuscale.integrations.hf_sdpa): what SDPA is called with in the graph
Dynamo captures, against what the unswitched model computes uncompiled.

The independent truths: the SDPA calls in Dynamo's graph (their ``attn_mask`` and ``is_causal``, read from the graph a
backend receives), and the logits, gradients and generated tokens of the same weights on transformers' own SDPA,
uncompiled. Tiny Llama and GPT-2 models on the CPU (backend ``eager``: the graph is the one inductor would get)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoConfig,
    GPTNeoForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

from gpuscale.integrations.hf import check_trainer  # noqa: E402
from gpuscale.integrations.hf_sdpa import NAME, UnmaskedCollator, drop_all_ones_mask, mark_unpadded, use_causal_sdpa  # noqa: E402
from gpuscale.runtime.speed import compile_model, masked_sdpa_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench
from bench.hf_sdpa import SdpaCalls  # noqa: E402  (a Dynamo backend that notes each SDPA call's mask and is_causal)

VOCAB, SEQ, BATCH, LAYERS = 61, 12, 3, 2


def llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        use_cache=False, attn_implementation="sdpa"))


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64, use_cache=False,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                      attn_implementation="sdpa"))


MODELS = {"llama": llama, "gpt2": gpt2}


def tokens(seed: int = 1, batch: int = BATCH) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_logits(net: torch.nn.Module, **inputs) -> tuple[torch.Tensor, list[tuple[bool, bool]]]:
    seen = SdpaCalls()
    with torch.no_grad():
        logits = torch.compile(net, backend=seen)(**inputs).logits
    return logits, seen.calls


@pytest.mark.parametrize("batch", [1, BATCH])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_compiled_without_padding_every_layer_calls_sdpa_causal_without_a_mask(family, batch):
    """The trap first (transformers' own SDPA, compiled: a mask in every layer, is_causal off), then the switch: the
    same layers with no mask and is_causal, and the logits of the unswitched model uncompiled. A batch of one row too:
    Dynamo gives the expanded marker's row dimension a stride of its own."""
    ids = tokens(batch=batch)
    with torch.no_grad():
        truth = MODELS[family]().eval()(input_ids=ids).logits
    _, plain = compiled_logits(MODELS[family]().eval(), input_ids=ids)
    assert plain == [(True, False)] * LAYERS, plain  # docs/traps.md: the trap this module is for
    net = MODELS[family]().eval()
    use_causal_sdpa(net)
    logits, switched = compiled_logits(net, input_ids=ids)
    assert switched == [(False, True)] * LAYERS, switched
    torch.testing.assert_close(logits, truth, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_a_training_step_gets_the_unswitched_models_loss_and_gradients(family):
    ids = tokens()
    reference = MODELS[family]().train()  # no dropout in either model: the same step twice
    loss = reference(input_ids=ids, labels=ids).loss
    loss.backward()
    net = MODELS[family]().train()
    use_causal_sdpa(net)
    seen = SdpaCalls()
    compiled_loss = torch.compile(net, backend=seen)(input_ids=ids, labels=ids).loss
    compiled_loss.backward()
    assert seen.calls == [(False, True)] * LAYERS
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(reference.named_parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def _padded(side: str) -> torch.Tensor:
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    if side == "right":
        mask[0, -4:] = 0
    else:
        mask[1, :3] = 0
    return mask


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("case", ["right-padding", "left-padding", "packed", "all-ones-mask"])
def test_what_needs_a_mask_keeps_transformers_mask_and_its_result(case, compiled):
    """Padding (either side), sequences packed by restarting position ids, and a real all-ones mask (a value the
    compiled graph cannot read) keep transformers' own path: the SDPA calls get a mask, the logits are the unswitched
    model's. Uncompiled, the packed rows and the all-ones mask are transformers' to decide, as before."""
    ids = tokens()
    inputs: dict[str, torch.Tensor] = {"input_ids": ids}
    if case.endswith("padding"):
        inputs["attention_mask"] = _padded(case.split("-")[0])
    elif case == "packed":
        inputs["position_ids"] = torch.cat([torch.arange(5), torch.arange(SEQ - 5)]).expand(BATCH, SEQ)
    else:
        inputs["attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    with torch.no_grad():
        truth = llama().eval()(**inputs).logits
        net = llama().eval()
        use_causal_sdpa(net)
        if compiled:
            logits, calls = compiled_logits(net, **inputs)
            assert calls == [(True, False)] * LAYERS, calls
        else:
            logits = net(**inputs).logits
    real = inputs["attention_mask"].bool()[..., None] if "attention_mask" in inputs else torch.ones(BATCH, SEQ, 1, dtype=torch.bool)
    torch.testing.assert_close(logits * real, truth * real, rtol=1e-5, atol=1e-5)  # padded positions' values are no one's


def test_generation_gives_the_unswitched_models_tokens():
    """generate() prefills a padded prompt with its mask, then decodes with a KV cache: transformers' path throughout."""
    prompt, mask = tokens(batch=2)[:, :6], torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    options = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0, "use_cache": True}
    truth = llama().eval().generate(input_ids=prompt, attention_mask=mask, **options)
    net = llama().eval()
    use_causal_sdpa(net)
    assert torch.equal(net.generate(input_ids=prompt, attention_mask=mask, **options), truth)


def test_the_compiled_training_forward_has_no_graph_break_and_no_recompile():
    net = llama().train()
    use_causal_sdpa(net)
    explained = torch._dynamo.explain(net)(input_ids=tokens(), labels=tokens())
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="eager")
    compiled(input_ids=tokens(1), labels=tokens(1)).loss.backward()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in (2, 3):
            compiled(input_ids=tokens(seed), labels=tokens(seed)).loss.backward()


def test_the_hf_trainer_compiled_with_the_collator_runs_every_layer_causal(monkeypatch):
    """The Trainer as a run_clm-style script uses it: rows with an all-ones attention mask, torch_compile on. The
    Trainer's backend must be one accelerate names, so the test's backend sits under ``eager`` for the run."""
    import torch._dynamo.backends.registry as registry

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = tokens(seed=10 + i, batch=1)[0]
            return {"input_ids": ids, "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": ids}

    losses = {}
    for switched in (False, True):
        torch._dynamo.reset()
        seen = SdpaCalls()
        registry.lookup_backend("eager")
        monkeypatch.setitem(registry._COMPILER_FNS, "eager", seen)
        net = llama()
        if switched:
            use_causal_sdpa(net)
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(output_dir=out, torch_compile=True, torch_compile_backend="eager", use_cpu=True,
                                     report_to=[], max_steps=2, per_device_train_batch_size=4, save_strategy="no",
                                     disable_tqdm=True, seed=0, data_seed=0)
            collate = UnmaskedCollator(default_data_collator) if switched else default_data_collator
            result = Trainer(model=net, args=args, train_dataset=Rows(), data_collator=collate).train()
        losses[switched] = result.training_loss
        assert seen.calls == ([(False, True)] if switched else [(True, False)]) * LAYERS, (switched, seen.calls)
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


def test_compiling_a_model_on_transformers_sdpa_warns_and_a_switched_one_does_not(warnings_seen):
    wrapped = torch.nn.Sequential(llama())  # inside a wrapper, as DDP holds it
    assert masked_sdpa_model(wrapped) == "LlamaForCausalLM"
    compile_model(wrapped, "eager")
    assert len(warnings_seen) == 1 and "use_causal_sdpa" in warnings_seen[0], warnings_seen
    switched = llama()
    use_causal_sdpa(switched)
    compile_model(switched, "eager")
    assert masked_sdpa_model(switched) is None and len(warnings_seen) == 1


def test_encoders_and_encoder_decoders_on_sdpa_get_no_warning_and_no_switch(warnings_seen):
    """A ViT or BERT has no causal mask to leave out (ViT none at all: compiled it already runs SDPA without a mask,
    as examples/vit.py does), and T5's encoder must keep its padding mask: no warning, and the switch says no."""
    from transformers import BertConfig, BertForMaskedLM, T5Config, T5ForConditionalGeneration, ViTConfig, ViTForImageClassification

    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 64}
    models = [ViTForImageClassification(ViTConfig(image_size=16, patch_size=8, **small, attn_implementation="sdpa")),
              BertForMaskedLM(BertConfig(vocab_size=VOCAB, **small, attn_implementation="sdpa")),
              T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                                                  attn_implementation="sdpa"))]
    for net in models:
        assert net.config._attn_implementation == "sdpa", type(net).__name__
        assert masked_sdpa_model(net) is None, type(net).__name__
        compile_model(net, "eager")
        with pytest.raises(ValueError, match=f"for decoder-only language models.*{type(net).__name__} is not one"):
            use_causal_sdpa(net)
    assert warnings_seen == []


def test_check_trainer_warns_only_when_the_trainer_compiles(warnings_seen):
    import gpuscale

    plan = gpuscale.plan_batch(4, 1)
    runtime = type("Rt", (), {"world_size": 1, "device": torch.device("cpu")})()
    for compile_it in (False, True):
        args = type("Args", (), {"world_size": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
                                 "torch_compile": compile_it})()
        check_trainer(type("T", (), {"args": args, "model": llama(), "is_deepspeed_enabled": False})(), plan, rt=runtime)
    assert len(warnings_seen) == 1 and "LlamaForCausalLM is compiled on transformers' SDPA" in warnings_seen[0]


def test_the_switch_is_refused_in_words_where_it_has_nothing_to_switch():
    eager = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, attn_implementation="eager"))
    with pytest.raises(ValueError, match="runs attention 'eager'.*attn_implementation='sdpa'"):
        use_causal_sdpa(eager)
    neo = GPTNeoForCausalLM(GPTNeoConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                                         attention_types=[[["global", "local"], 1]]))
    with pytest.raises(ValueError, match="GPTNeoForCausalLM runs attention 'eager'"):
        use_causal_sdpa(neo)
    with pytest.raises(ValueError, match="needs a transformers model"):
        use_causal_sdpa(torch.nn.Linear(2, 2))


class OwnLM(LlamaForCausalLM):
    """A user's own subclass, as a training script defines one."""

    def extra(self) -> int:
        return 1


class NamedLM(LlamaForCausalLM):
    """A subclass whose own code takes another path when the attention is named "sdpa" (as Gemma 4's does)."""

    def path(self) -> str:
        return "fast" if self.config._attn_implementation == "sdpa" else "other"


def test_a_subclass_and_a_wrapped_model_are_switched_and_a_model_that_tests_the_name_is_left_alone(warnings_seen):
    """A subclass of the user's own (its module is not transformers') and a model inside a wrapper (a DDP, FSDP or PEFT
    module) are found and switched; Falcon (SDPA called from its own code) and a class that tests the attention's name
    for "sdpa" are refused, and compiling them gives no advice to call the switch."""
    from transformers import FalconConfig, FalconForCausalLM

    torch.manual_seed(0)
    own = OwnLM(llama().config)
    assert masked_sdpa_model(own) == "OwnLM"
    use_causal_sdpa(own)
    assert own.config._attn_implementation == NAME
    wrapped = torch.nn.ModuleDict({"inner": llama()})
    assert masked_sdpa_model(wrapped) == "LlamaForCausalLM"
    use_causal_sdpa(wrapped)
    _, calls = compiled_logits(wrapped["inner"], input_ids=tokens())
    assert calls == [(False, True)] * LAYERS
    falcon = FalconForCausalLM(FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                            attn_implementation="sdpa"))
    assert falcon.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="FalconForCausalLM calls SDPA from code of its own, not through transformers' "
                                         "attention interface"):
        use_causal_sdpa(falcon)
    named = NamedLM(llama().config)
    with pytest.raises(ValueError, match="NamedLM's own class NamedLM compares the attention's name with 'sdpa'"):
        use_causal_sdpa(named)
    assert masked_sdpa_model(falcon) is None and masked_sdpa_model(named) is None
    compile_model(falcon, "eager")
    compile_model(named, "eager")
    assert warnings_seen == []


def test_an_all_ones_mask_beside_position_ids_is_kept_and_the_result_unchanged():
    """Packed rows (position ids restarting at 0) with an all-ones mask: transformers attends across the restart, as
    the mask says; without the mask it would split attention there. The collator keeps the mask: the same logits."""
    ids = tokens(batch=2)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "position_ids": torch.cat([torch.arange(5), torch.arange(SEQ - 5)]).expand(2, SEQ)}
    net = llama().eval()
    with torch.no_grad():
        torch.testing.assert_close(net(**drop_all_ones_mask(batch)).logits, net(**batch).logits)


def test_switching_twice_changes_nothing_more():
    net = llama()
    use_causal_sdpa(net)
    use_causal_sdpa(net)
    assert net.config._attn_implementation == NAME
    assert list(net.base_model._forward_pre_hooks.values()).count(mark_unpadded) == 1


def test_the_collator_drops_only_an_all_ones_mask_made_on_the_host():
    ones = {"input_ids": torch.ones(2, 4), "attention_mask": torch.ones(2, 4, dtype=torch.long)}
    assert set(drop_all_ones_mask(ones)) == {"input_ids"}
    padded = {"input_ids": torch.ones(2, 4), "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])}
    assert torch.equal(drop_all_ones_mask(padded)["attention_mask"], padded["attention_mask"])
    elsewhere = {"input_ids": torch.ones(2, 4), "attention_mask": torch.ones(2, 4, device="meta")}
    assert "attention_mask" in drop_all_ones_mask(elsewhere)  # reading it there would cost a synchronisation
    packed = {"input_ids": torch.ones(1, 6), "attention_mask": torch.ones(1, 6, dtype=torch.long),
              "position_ids": torch.tensor([[0, 1, 2, 0, 1, 2]])}
    assert "attention_mask" in drop_all_ones_mask(packed)  # with no mask transformers would split attention at each restart
    collate = UnmaskedCollator(default_data_collator)
    rows = [{"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]}, {"input_ids": [4, 5, 6], "attention_mask": [1, 1, 1]}]
    assert set(collate(rows)) == {"input_ids"}
