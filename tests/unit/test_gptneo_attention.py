"""examples/gptneo_attention.py: GPT-neo's attention through SDPA gives transformers' eager results (fp32 on a CPU,
to 1e-5): logits, loss and gradients, with padding, in the window of its local layers, in generate(); and forms no
score matrix beyond the window."""

from __future__ import annotations

import copy
import pickle
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # as when the example runs as a script

import gptneo_attention as ga  # noqa: E402

transformers = pytest.importorskip("transformers")
from transformers import GPTNeoConfig, GPTNeoForCausalLM  # noqa: E402
from transformers.models.gpt_neo.modeling_gpt_neo import GPTNeoSelfAttention  # noqa: E402

VOCAB, SEQ, WINDOW = 97, 32, 8  # the window shorter than the sequence: local layers differ from global ones
TOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread is as fast, and other processes on a busy machine cannot stall its team (2.9 s a
    test instead of 0.06 s with two threads on the 2-core VM under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def gpt_neo(layers: list[str] | None = None, seed: int = 0, **config) -> GPTNeoForCausalLM:
    """A small GPT-neo at random (global and local layers alternating unless `layers` says otherwise), in eval mode."""
    layers = layers or ["global", "local"] * 2
    torch.manual_seed(seed)
    model = GPTNeoForCausalLM(GPTNeoConfig(
        vocab_size=VOCAB, hidden_size=64, num_heads=4, num_layers=len(layers), intermediate_size=128, window_size=WINDOW,
        max_position_embeddings=64, attention_types=[[[kind], 1] for kind in layers], bos_token_id=0, eos_token_id=0,
        pad_token_id=0, **config))
    return model.eval()


def pair(layers: list[str] | None = None, local: str = "chunks", **config) -> tuple[GPTNeoForCausalLM, GPTNeoForCausalLM]:
    """(eager model, the same weights switched to SDPA)."""
    eager = gpt_neo(layers, **config)
    fast = copy.deepcopy(eager)
    assert ga.use_sdpa_attention(fast, local=local) == eager.config.num_layers
    return eager, fast


def batch(padding: str | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Three rows of SEQ tokens and their attention mask: none, padding at the ends (as the collator pads), on the left."""
    ids = torch.randint(1, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(1))
    if padding is None:
        return ids, None
    mask = torch.ones(3, SEQ, dtype=torch.long)
    if padding == "right":
        mask[1, 20:] = 0
        mask[2, 5:] = 0
    else:
        mask[1, :11] = 0
    return ids.masked_fill(mask == 0, 0), mask


def labels_of(ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return ids if mask is None else ids.masked_fill(mask == 0, -100)  # padding ignored, as the collator does


@pytest.mark.parametrize("padding", [None, "right", "left"])
def test_logits_loss_and_gradients_equal_eager(padding):
    eager, fast = pair()
    ids, mask = batch(padding)
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    outputs = [model(ids, attention_mask=mask, labels=labels_of(ids, mask)) for model in (eager, fast)]
    torch.testing.assert_close(outputs[1].logits[real], outputs[0].logits[real], atol=TOL, rtol=0)
    torch.testing.assert_close(outputs[1].loss, outputs[0].loss, atol=TOL, rtol=0)
    for out in outputs:
        out.loss.backward()
    for (name, a), b in zip(eager.named_parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=TOL, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def test_local_layers_see_their_window_and_global_ones_everything():
    ids, _ = batch(None)
    changed = ids.clone()
    changed[:, 0] = (ids[:, 0] % (VOCAB - 1)) + 1  # another first token
    for kind in ("local", "global"):
        eager, fast = pair([kind])
        for model in (eager, fast):
            delta = (model(changed).logits - model(ids).logits).abs().amax(dim=(0, 2))
            if kind == "local":  # query i sees keys i - WINDOW + 1 .. i: token 0 reaches positions 0 .. WINDOW - 1
                assert delta[WINDOW - 1] > 0 and delta[WINDOW:].max() == 0, (type(model.transformer.h[0].attn.attention), delta)
            else:
                assert delta[-1] > 0


def test_local_layers_form_no_score_matrix_beyond_the_window(monkeypatch):
    """Every SDPA call of a local layer multiplies at most WINDOW queries by 2 x WINDOW keys; eager's _attn is not used
    (uncompiled; compiled with the cache off, as the Trainer runs it: tests/unit/test_gptneo_compiled.py)."""
    _, fast = pair()
    calls: list[tuple[int, int]] = []
    sdpa = F.scaled_dot_product_attention

    def recorded(q, k, v, **kwargs):
        calls.append((q.shape[-2], k.shape[-2]))
        return sdpa(q, k, v, **kwargs)

    def refused(*args, **kwargs):
        raise AssertionError("eager attention ran")

    monkeypatch.setattr(ga.F, "scaled_dot_product_attention", recorded)
    monkeypatch.setattr(GPTNeoSelfAttention, "_attn", refused)
    fast(batch(None)[0])
    global_calls = [c for c in calls if c == (SEQ, SEQ)]
    assert len(global_calls) == 2, calls  # one per global layer
    assert sorted(set(calls) - {(SEQ, SEQ)}) == [(WINDOW, WINDOW), (WINDOW, 2 * WINDOW)]


def test_sequences_packed_by_their_position_ids_stay_apart():
    """Rows of two sequences each, told apart only by position ids restarting at 0 (no mask, no cache, as
    DataCollatorWithFlattening gives them): the switched model keeps them apart exactly as eager does."""
    eager, fast = pair(use_cache=False)
    ids, _ = batch(None)
    positions = torch.cat([torch.arange(SEQ // 2), torch.arange(SEQ - SEQ // 2)]).expand(ids.shape[0], -1)
    expected, got = (model(ids, position_ids=positions).logits for model in (eager, fast))
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)
    alone = fast(ids[:, SEQ // 2:]).logits  # the second sequence on its own: nothing of the first reached it
    torch.testing.assert_close(got[:, SEQ // 2:], alone, atol=TOL, rtol=0)


@pytest.mark.parametrize("use_cache", [False, True])  # False: as the Trainer sets it (TrainingArguments.use_cache)
def test_a_training_forward_never_waits_for_the_device(use_cache):
    """No value of a device tensor is read on the host in the forward and backward of a batch without mask (with
    use_cache off, transformers' search for packed sequences would read one: gptneo_attention.mark_unpadded)."""
    from gpuscale.measure.device_waits import find_device_waits

    _, fast = pair(use_cache=use_cache)
    ids, _ = batch(None)
    with find_device_waits(fast.train()) as found:
        fast(ids, labels=ids).loss.backward()
    assert found.sites() == []


def test_the_model_hook_marks_only_forwards_without_mask_positions_or_cache():
    """mark_unpadded adds the rows' all-ones mask (one value, expanded) where transformers would search for packing,
    and leaves every other call as it came."""
    ids, embeds = torch.ones(3, 5, dtype=torch.long), torch.zeros(3, 5, 8)
    for args, kwargs in [((ids,), {}), ((), {"input_ids": ids, "use_cache": False}), ((), {"inputs_embeds": embeds})]:
        _, marked = ga.mark_unpadded(None, args, kwargs)
        mask = marked["attention_mask"]
        assert mask.shape == (3, 5) and mask.dtype == torch.bool and mask.all() and mask.stride() == (0, 0)
        assert {k: v for k, v in marked.items() if k != "attention_mask"} == kwargs
    given = {"attention_mask": torch.ones(3, 5), "position_ids": torch.arange(5)[None], "cache": object(),
             "past_key_values": object()}
    for name, value in given.items():
        assert ga.mark_unpadded(None, (ids,), {name: value}) is None, name
    assert ga.mark_unpadded(None, (ids, None), {}) is None  # more than input_ids by position: left as it is
    assert ga.mark_unpadded(None, (), {}) is None  # nothing to take the rows' shape from


@pytest.mark.parametrize("length, window", [(21, 8), (16, 8), (5, 8), (8, 8)])
def test_windowed_sdpa_is_a_causal_band(length, window):
    q, k, v = torch.randn(3, 2, 3, length, 4, generator=torch.Generator().manual_seed(2)).unbind(0)
    i = torch.arange(length)
    band = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=band, scale=1.0)
    torch.testing.assert_close(ga.windowed_sdpa(q, k, v, window), expected, atol=TOL, rtol=0)


@pytest.mark.filterwarnings("ignore")  # FlexAttention uncompiled: its reference code, with a warning
def test_flex_local_layers_equal_eager():
    eager, fast = pair(local="flex")
    ids, mask = batch("right")
    with torch.no_grad():  # FlexAttention has no backward on a CPU (training there runs the chunks)
        expected, got = (model(ids, attention_mask=mask).logits for model in (eager, fast))
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=TOL, rtol=0)
    assert ga.attention_in_use(fast) == "sdpa+flex" and ga.attention_in_use(eager) == "eager"


@pytest.mark.parametrize("padding", [None, "left"])
def test_generate_with_the_cache_gives_eager_tokens(padding):
    eager, fast = pair()
    ids, mask = batch(padding)
    prompt = (ids[:, :14], None if mask is None else mask[:, :14])
    tokens = [model.generate(prompt[0], attention_mask=prompt[1], max_new_tokens=12, do_sample=False, use_cache=True,
                             pad_token_id=0) for model in (eager, fast)]
    assert torch.equal(tokens[0], tokens[1])


def test_output_attentions_come_from_eager():
    eager, fast = pair()
    ids, _ = batch(None)
    expected, got = (model(ids, output_attentions=True) for model in (eager, fast))
    assert len(got.attentions) == 4
    for a, b in zip(expected.attentions, got.attentions, strict=True):
        torch.testing.assert_close(b, a, atol=TOL, rtol=0)


def test_dropout_applies_in_training_only():
    eager, fast = pair(attention_dropout=0.5)
    ids, _ = batch(None)
    fast.train()
    assert not torch.equal(fast(ids).logits, fast(ids).logits)  # attention dropout draws new masks
    fast.eval()
    torch.testing.assert_close(fast(ids).logits, eager(ids).logits, atol=TOL, rtol=0)


def test_autocast_bf16_stays_close_to_eager():
    eager, fast = pair()
    ids, mask = batch("right")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = (model(ids, attention_mask=mask, labels=labels_of(ids, mask)) for model in (eager, fast))
    assert got.logits.dtype == torch.bfloat16
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-2, atol=0)


def test_only_eager_gpt_neo_switches_and_saved_configs_stay_eager(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=32))
    implementation = gpt2.config._attn_implementation
    assert ga.use_sdpa_attention(gpt2) == 0 and gpt2.config._attn_implementation == implementation
    _, fast = pair()
    assert ga.use_sdpa_attention(fast) == 4 and fast.config._attn_implementation == ga.NAME  # again: no change
    assert list(fast.transformer._forward_pre_hooks.values()) == [ga.mark_unpadded]  # its hook once
    ids, _ = batch(None)
    torch.testing.assert_close(pickle.loads(pickle.dumps(fast))(ids).logits, fast(ids).logits, atol=0, rtol=0)
    fast.save_pretrained(tmp_path)
    assert ga.NAME not in (tmp_path / "config.json").read_text()
    assert GPTNeoForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "eager"
    with pytest.raises(ValueError, match="local kernel"):
        ga.use_sdpa_attention(fast, local="dense")


def test_padding_only_at_ends():
    assert ga.padding_only_at_ends(None, 4)
    assert ga.padding_only_at_ends(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]), 4)
    assert not ga.padding_only_at_ends(torch.tensor([[0, 1, 1, 1]]), 4)  # on the left
    assert not ga.padding_only_at_ends(torch.tensor([[1, 0, 1, 1]]), 4)  # inside
    assert not ga.padding_only_at_ends(torch.tensor([[1, 1, 1]]), 4)  # another length
    assert ga.padding_only_at_ends(torch.ones((), dtype=torch.bool).expand(2, 4), 4)  # one value a row: from its strides
