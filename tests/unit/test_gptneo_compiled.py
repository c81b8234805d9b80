"""The compiled GPT-neo training step (examples/gptneo_attention.py's SDPA attention, batches as the example's collator
gives them) is one graph with no break, and does not compile again once warm: a break or a recompilation costs every
step host time on a GPU (BENCHMARKS.md, "Issue 27"). Dynamo's own accounting, on a CPU (backend aot_eager: no C
compiler needed; the graphs Dynamo captures are the same for inductor)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench

from bench.sdpa import graph_calls  # noqa: E402

import gptneo_attention as ga  # noqa: E402

transformers = pytest.importorskip("transformers")
from transformers import DataCollatorForLanguageModeling, GPTNeoConfig, GPTNeoForCausalLM  # noqa: E402

VOCAB, SEQ, WINDOW, BATCH = 97, 32, 8, 4  # the window shorter than the rows: the local layers take the chunked path


class Tokenizer:
    """What DataCollatorForLanguageModeling asks of a tokenizer for rows that need no padding."""

    pad_token_id = eos_token_id = 0
    padding_side = "right"

    def pad(self, features, return_tensors="pt", **kwargs):
        return {"input_ids": torch.tensor([f["input_ids"] for f in features])}


def model(use_cache: bool = False) -> GPTNeoForCausalLM:
    """The switched model in training; ``use_cache`` off as the Trainer sets it (TrainingArguments.use_cache)."""
    torch.manual_seed(0)
    net = GPTNeoForCausalLM(GPTNeoConfig(vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_size=16, num_layers=2,
                                         num_heads=2, intermediate_size=32, window_size=WINDOW,
                                         attention_types=[[["global", "local"], 1]], use_cache=use_cache))
    ga.use_sdpa_attention(net)
    return net.train()


def batches(n: int) -> list[dict[str, torch.Tensor]]:
    """Packed rows through the example's collator: input_ids and labels, the all-ones attention mask left out."""
    collate = ga.EndPaddingCollator(DataCollatorForLanguageModeling(Tokenizer(), mlm=False))
    g = torch.Generator().manual_seed(1)
    return [collate([{"input_ids": torch.randint(1, VOCAB, (SEQ,), generator=g).tolist()} for _ in range(BATCH)])
            for _ in range(n)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_collator_leaves_out_a_mask_that_adds_nothing():
    batch = batches(1)[0]
    assert set(batch) == {"input_ids", "labels"}
    padded = ga.drop_end_padding_mask({"input_ids": torch.ones(2, 4), "attention_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])})
    assert "attention_mask" not in padded  # padding only at the ends: a causal query never sees it
    inside = ga.drop_end_padding_mask({"input_ids": torch.ones(1, 4), "attention_mask": torch.tensor([[1, 0, 1, 1]])})
    assert "attention_mask" in inside  # padding inside a row: the mask is kept


@pytest.mark.parametrize("use_cache", [False, True])
def test_the_compiled_forward_attends_through_sdpa_in_every_layer(use_cache):
    """The graph Dynamo captures calls SDPA for the global layer and the local layer's two chunk calls, and computes no
    softmax of its own: eager attention compiled (what every layer ran on an H200 under the Trainer, use_cache off,
    before gptneo_attention.mark_unpadded; BENCHMARKS.md, Issue 27)."""
    net, batch = model(use_cache), batches(1)[0]
    calls, _ = graph_calls(net, **batch)
    assert calls.count("scaled_dot_product_attention") == 3, calls
    assert not [c for c in calls if "softmax" in c], calls


def test_the_training_forward_has_no_graph_break():
    import torch._dynamo

    net, batch = model(), batches(1)[0]
    explained = torch._dynamo.explain(net)(**batch, num_items_in_batch=torch.tensor(BATCH * (SEQ - 1)))
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1


def test_the_compiled_step_does_not_recompile_once_warm():
    """Two warm-up steps, then four more with other data and another token count (the Trainer passes
    num_items_in_batch as a tensor), with Dynamo told to fail on any recompilation."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    net = model()
    compiled = torch.compile(net, backend="aot_eager")
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def step(batch: dict[str, torch.Tensor], tokens: int) -> float:
        loss = compiled(**batch, num_items_in_batch=torch.tensor(tokens)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    data = batches(6)
    for batch in data[:2]:
        step(batch, BATCH * (SEQ - 1))
    graphs = counters["stats"]["unique_graphs"]
    losses = []
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i, batch in enumerate(data[2:]):
            losses.append(step(batch, BATCH * (SEQ - 1) - i))
    assert counters["stats"]["unique_graphs"] == graphs
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert all(torch.isfinite(torch.tensor(losses)))
