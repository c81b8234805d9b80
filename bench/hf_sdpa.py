"""transformers' own SDPA, compiled, with and without gpuscale's switch (`python -m bench hf_sdpa`).

Compiled, a transformers decoder on SDPA gets an explicit causal mask in every layer, so SDPA cannot run
FlashAttention's kernel (docs/traps.md); `gpuscale.integrations.hf_sdpa.use_causal_sdpa` lets it run
``is_causal=True`` without a mask. This measures what that is worth: a Llama with GPT-neo-125M's attention shape
(width 768, 12 heads of 64, MLP 3072, GPT-neo's vocabulary of 50257; 4 of its 12 layers, to keep the compiles short)
trained as the Trainer trains it (``use_cache`` off, batches without a mask, bf16 autocast on fp32 weights, AdamW),
compiled by Inductor, at each (per-device batch x block) point (default 16x512 on a GPU; on a CPU 1x128, 2 layers, a
vocabulary of 1024 and ``aot_eager``: a check of the pipeline, not a figure):

- ``graph``: each SDPA call in the graphs Dynamo captures of a forward: with a mask or not, causal or not;
- ``kernels``: the attention kernels one training step ran, by kind (flash, efficient, cudnn, math), in milliseconds
  of device time (host operators' time on a CPU);
- ``step_ms``: optimizer steps timed between device synchronisations, ``STEPS`` per round after ``WARMUP``; the
  rounds alternate the two models, so the machine's drift falls on both.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, NamedTuple

from bench.sdpa import failure, profiled_kinds
from bench.step_profile import format_attention


class Shape(NamedTuple):
    """What differs between a GPU's run and a CPU's check."""

    layers: int
    vocab: int
    backend: str


GPU_SHAPE = Shape(layers=4, vocab=50257, backend="inductor")  # GPT-neo's vocabulary
CPU_SHAPE = Shape(layers=2, vocab=1024, backend="aot_eager")  # no C compiler needed
GPU_POINTS = ((16, 512),)
CPU_POINTS = ((1, 128),)
WARMUP, STEPS = 3, 10
VARIANTS = ("transformers", "use_causal_sdpa")  # transformers' own SDPA; after gpuscale's switch


def llama(block: int, layers: int, vocab: int, device: Any) -> Any:
    """The benchmark's Llama, same weights each call (seed 0), in training with the cache off."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=768, intermediate_size=3072, num_hidden_layers=layers,
                         num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=max(2048, block),
                         use_cache=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config).to(device).train()


class SdpaCalls:
    """A Dynamo backend that notes each SDPA call of the graphs it gets, as (has a mask, is causal), and runs them
    uncompiled (the graphs are what Inductor would be given)."""

    def __init__(self) -> None:
        self.calls: list[tuple[bool, bool]] = []

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        for node in gm.graph.nodes:
            if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target):
                mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
                self.calls.append((mask is not None, bool(node.kwargs.get("is_causal", False))))
        return gm.forward


def sdpa_calls_in_graphs(module: Any, **inputs: Any) -> list[tuple[bool, bool]]:
    """(has a mask, is causal) of each SDPA call in the graphs Dynamo captures of one ``module(**inputs)`` (`SdpaCalls`).
    Dynamo is reset before and after."""
    import torch

    seen = SdpaCalls()
    torch._dynamo.reset()
    try:
        torch.compile(module, backend=seen, dynamic=False)(**inputs)
    finally:
        torch._dynamo.reset()
    return seen.calls


class Trained:
    """One variant's compiled model, optimizer and batch, and its training step."""

    def __init__(self, variant: str, batch: int, block: int, shape: Shape, device: Any) -> None:
        import torch

        from gpuscale.integrations.hf_sdpa import use_causal_sdpa

        self.device = device
        self.model = llama(block, shape.layers, shape.vocab, device)
        if variant == "use_causal_sdpa":
            use_causal_sdpa(self.model)
        self.ids = torch.randint(0, shape.vocab, (batch, block), device=device, generator=torch.Generator(device).manual_seed(0))
        self.graph = sdpa_calls_in_graphs(self.model, input_ids=self.ids)
        self.compiled = torch.compile(self.model, backend=shape.backend, dynamic=False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def step(self) -> None:
        import torch

        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = self.compiled(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed(self, steps: int) -> float:
        """Milliseconds per step over `steps` steps, between device synchronisations."""
        import torch

        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync()
        return (time.perf_counter() - start) / steps * 1e3


def measure_point(batch: int, block: int, rounds: int, shape: Shape, device: Any) -> dict[str, Any]:
    """Both variants at one point: their graphs' SDPA calls, their attention kernels, their step times by round."""
    import torch

    trained = {variant: Trained(variant, batch, block, shape, device) for variant in VARIANTS}
    for t in trained.values():  # compile each one's own graph (Dynamo caches per model object), then warm up
        for _ in range(WARMUP):
            t.step()
    times: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for i in range(rounds):
        for variant in VARIANTS if i % 2 == 0 else VARIANTS[::-1]:
            times[variant].append(round(trained[variant].timed(STEPS), 3))
    entry: dict[str, Any] = {"per_device_batch": batch, "block_size": block}
    for variant, t in trained.items():
        entry[variant] = {"graph": {"sdpa_calls": len(t.graph), "with_mask": sum(m for m, _ in t.graph),
                                    "causal_without_mask": sum(c and not m for m, c in t.graph)},
                          "kernels": profiled_kinds(t.step, device), "step_ms": times[variant],
                          "median_step_ms": round(statistics.median(times[variant]), 3)}
    plain, switched = entry["transformers"]["median_step_ms"], entry["use_causal_sdpa"]["median_step_ms"]
    entry["speedup"] = round(plain / switched, 3) if switched else None
    del trained
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def run(repeat: int = 5, points: tuple[tuple[int, int], ...] | None = None) -> dict[str, Any]:
    """The record: the device, the model, and per point both variants' figures (or why the point failed)."""
    import torch
    import transformers

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    shape = GPU_SHAPE if on_gpu else CPU_SHAPE
    record: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if on_gpu else "cpu", "torch": torch.__version__,
                              "transformers": transformers.__version__, **shape._asdict(),
                              "rounds": repeat, "steps_per_round": STEPS, "points": []}
    for batch, block in points or (GPU_POINTS if on_gpu else CPU_POINTS):
        try:
            record["points"].append(measure_point(batch, block, repeat, shape, device))
        except Exception as exc:  # out of memory, a failed compile: this point says so, the others still run
            record["points"].append({"per_device_batch": batch, "block_size": block, "error": failure(exc)})
        if on_gpu:
            torch.cuda.empty_cache()
    return record


def report(record: dict[str, Any]) -> str:
    """Per point: each variant's SDPA calls, attention kernels and median step, then the switch's speed-up."""
    lines = [f"transformers {record['transformers']}'s SDPA, compiled ({record['backend']}), on {record['device']}: a Llama of "
             f"GPT-neo-125M's width, {record['layers']} layers, vocabulary {record['vocab']}, bf16 autocast, AdamW; {record['rounds']} rounds of "
             f"{record['steps_per_round']} steps"]
    for p in record["points"]:
        lines.append(f"  {p['per_device_batch']} x {p['block_size']}")
        if "error" in p:
            lines.append(f"    not measured: {p['error']}")
            continue
        for variant in VARIANTS:
            v, g = p[variant], p[variant]["graph"]
            spread = f"{min(v['step_ms']):.1f}-{max(v['step_ms']):.1f}"
            lines.append(f"    {variant:<16} SDPA calls {g['sdpa_calls']}: {g['with_mask']} with a mask, "
                         f"{g['causal_without_mask']} causal without; attention ran "
                         f"{format_attention(v['kernels'], 2) or 'no attention kernel named'}; "
                         f"step {v['median_step_ms']:.1f} ms (rounds {spread})")
        lines.append(f"    step time, transformers' / switched: {p['speedup']}x (medians)")
    return "\n".join(lines)
