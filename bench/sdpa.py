"""Which kernel runs GPT-neo's attention on this device (`python -m bench sdpa`): SDPA's own choice for each of the
example's attention calls, and the kernels that really ran in one of its layers, eager and compiled.

Why: the compiled GPT-neo step's largest kernel on an H200 was an explicit softmax that grows with the square of the
block (BENCHMARKS.md, "Issue 27"): attention computed the long way, where a fused kernel would not write the score
matrix at all. This finds where that happens, in about a minute of GPU time: in SDPA's dispatch, in the compiler, or
in the model's path to its layers (the cause there: transformers' search for packed sequences, which sent every
layer to eager attention until examples/gptneo_attention.py's `mark_unpadded`).

At each (batch x block) point (default 16x512, 64x512 and 32x1024 on a GPU; 2x512 on a CPU), with GPT-neo-125M's
attention shape (width 768, 12 heads of 64, window 256) and examples/gptneo_attention.py's kernels:

- ``choice``: ``torch._fused_sdp_choice`` for the three SDPA calls a forward makes (the global layers' causal
  attention over the block; the local layers' first chunk, causal over the window; their later chunks, a
  window x 2 window band mask), on bf16 tensors that need gradients and are laid out as the layer lays them out: the
  backend SDPA's dispatcher picks (FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION, MATH), and each fused
  backend asked alone: "runs", or why not in torch's own words;
- ``switches``: the process's SDPA backend switches and whether deterministic algorithms are on;
- ``layers``: one global and one local GPTNeoSelfAttention switched to the example's attention, each run forward
  and backward under bf16 autocast on fp32 weights (as the Trainer runs them), eager and under torch.compile
  (Inductor, measured after one warm-up call), profiled: the attention work that ran, sorted by name into flash,
  efficient, cudnn and math (an explicit softmax), in milliseconds of device time (of host operators on a CPU, where
  Inductor's own kernels carry no such name and the compiled column may stay empty).

- ``model``: a whole switched GPT-neo of that width (one global and one local layer), in training as the Trainer runs
  it (``use_cache`` off, a batch without attention mask, as the example's collator gives it): the attention calls in
  the graph Dynamo captures of its forward (SDPA calls against the layers' expected ones, and any softmax computed
  explicitly), the graphs, and the calls in an uncompiled forward and backward that wait for the device
  (gpuscale.measure.device_waits). This is where a layer leaves the fast path for transformers' eager attention,
  which a layer run alone cannot show: on the H200 every layer almost certainly did, compiled under the Trainer
  (BENCHMARKS.md: the kernel's name, and the same on a CPU without the example's fix).

"math" in a layer's compiled column where ``choice`` names a fused kernel means the compiler, not the dispatcher,
took the long way. The figures are one call each: they name kernels, they are not a speed benchmark.
"""

from __future__ import annotations

from typing import Any

from bench.stats import examples_on_path
from bench.step_profile import ATTENTION_KINDS, attention_kind, format_attention

HEADS, HEAD_DIM, WINDOW = 12, 64, 256  # GPT-neo-125M's attention (bench/gptneo_bench.py's shape, the example's window)
GPU_POINTS = ((16, 512), (64, 512), (32, 1024))
CPU_POINTS = ((2, 512),)


def split_heads(batch: int, length: int, device: Any, requires_grad: bool = True) -> Any:
    """(batch, heads, length, head size) bf16, a permuted view of a (batch, length, width) projection as
    GPTNeoSelfAttention._split_heads makes it."""
    import torch

    flat = torch.randn(batch, length, HEADS * HEAD_DIM, device=device, dtype=torch.bfloat16)
    return flat.view(batch, length, HEADS, HEAD_DIM).permute(0, 2, 1, 3).detach().requires_grad_(requires_grad)


def dispatch_choices(batch: int, block: int, device: Any) -> dict[str, dict[str, Any]]:
    """The backend SDPA's dispatcher picks for each of the example's three calls at (batch x block), and each fused
    backend's own answer (`why_not`)."""
    import torch
    from torch.nn.attention import SDPBackend

    examples_on_path()
    import gptneo_attention as ga

    def choice(q: Any, k: Any, v: Any, mask: Any = None, causal: bool = False) -> dict[str, Any]:
        return {"choice": SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, scale=1.0)).name,
                "backends": why_not(q, k, v, mask, causal)}

    q, k, v = (split_heads(batch, block, device) for _ in range(3))
    calls = {"global causal": choice(q, k, v, causal=True)}
    if block <= WINDOW:  # the local layers' rows fit their window: one causal call, the global one's
        return calls
    chunks = -(-block // WINDOW) - 1  # windowed_sdpa pads the last chunk: the chunks after the first
    cq = ga.chunks_of(split_heads(batch, chunks * WINDOW, device), WINDOW)
    ck, cv = (ga.chunks_of(split_heads(batch, 2 * chunks * WINDOW, device), 2 * WINDOW) for _ in range(2))
    calls["local first chunk (causal)"] = choice(q[:, :, :WINDOW], k[:, :, :WINDOW], v[:, :, :WINDOW], causal=True)
    calls["local band chunks (mask)"] = choice(cq, ck, cv, mask=ga.make_band(WINDOW, device))
    return calls


FUSED = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


def why_not(q: Any, k: Any, v: Any, mask: Any = None, causal: bool = False) -> dict[str, str]:
    """Each fused backend tried alone on one call (forward only, on the tensors as given, gradients included): "runs",
    or why not, in torch's words (every warning its checks give when a backend asked for cannot run, then the error)."""
    import warnings

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    found: dict[str, str] = {}
    for name in FUSED:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(getattr(SDPBackend, name)):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=1.0)
                error = None
            except RuntimeError as exc:
                error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        reasons = [str(w.message).strip() for w in caught]
        found[name] = "runs" if error is None else "; ".join([*reasons, error])[:1000]
    return found


VOCAB = 128  # the model's own vocabulary: the attention is what is looked at


def switched_model(block: int) -> Any:
    """A GPT-neo of GPT-neo-125M's width with one global and one local layer, on the example's SDPA attention."""
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    examples_on_path()
    import gptneo_attention as ga

    config = GPTNeoConfig(vocab_size=VOCAB, max_position_embeddings=max(2048, block), hidden_size=HEADS * HEAD_DIM,
                          num_layers=2, num_heads=HEADS, intermediate_size=4 * HEADS * HEAD_DIM, window_size=WINDOW,
                          attention_types=[[["global", "local"], 1]], bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPTNeoForCausalLM(config)
    ga.use_sdpa_attention(model)
    return model


def attention_layer(kind: str, block: int, device: Any) -> Any:
    """One GPT-neo attention layer of GPT-neo-125M's width, `kind` global or local, on the example's SDPA attention."""
    layer = switched_model(block).transformer.h[0 if kind == "global" else 1].attn.attention
    assert layer.attention_type == kind
    return layer.to(device).train()


def expected_sdpa_calls(block: int) -> int:
    """SDPA calls of `switched_model`'s forward at `block` tokens: the global layer's one, the local layer's one (the
    block within its window) or two (its first chunk, then all later chunks in one call)."""
    return 1 + (1 if block <= WINDOW else 2)


def model_path(batch: int, block: int, device: Any) -> dict[str, Any]:
    """The attention a whole switched model computes in training as the Trainer runs it: the SDPA calls and explicit
    softmaxes in the graphs Dynamo captures of its forward (no compiler behind it: the graphs are what Inductor
    would get), and the device waits of one uncompiled forward and backward."""
    import torch

    from gpuscale.measure.device_waits import find_device_waits

    model = switched_model(block).to(device).train()
    model.config.use_cache = False  # what the Trainer sets (TrainingArguments.use_cache)
    ids = torch.randint(0, VOCAB, (batch, block), device=device, generator=torch.Generator(device).manual_seed(0))
    with torch.autocast(device.type, dtype=torch.bfloat16):
        calls, graphs = graph_calls(model, input_ids=ids, labels=ids)
        with find_device_waits(model, device) as found:
            model(input_ids=ids, labels=ids).loss.backward()
    return {"sdpa_calls": calls.count("scaled_dot_product_attention"), "expected_sdpa_calls": expected_sdpa_calls(block),
            "explicit_softmax": sum("softmax" in c for c in calls), "graphs": graphs,
            "device_waits": [f"{w['where']} ({w['kind']})" for w in found.sites()]}


def graph_calls(module: Any, *args: Any, **kwargs: Any) -> tuple[list[str], int]:
    """(the functions called in the graphs Dynamo captures of one ``module(*args, **kwargs)``, in order; the number of
    graphs). Captured only, not compiled: the graphs are what Inductor would be given. Dynamo is reset before and
    after."""
    import torch

    calls: list[str] = []
    graphs = 0

    def capture(gm: Any, inputs: Any) -> Any:
        nonlocal graphs
        graphs += 1
        calls.extend(getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    try:
        torch.compile(module, backend=capture, dynamic=False)(*args, **kwargs)
    finally:
        torch._dynamo.reset()
    return calls, graphs


def profiled_kinds(step: Any, device: Any) -> dict[str, float]:
    """Run `step()` once under the profiler; the milliseconds of each attention kind that ran (device time on a GPU,
    host operators' own time on a CPU)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        step()
        if on_gpu:
            torch.cuda.synchronize()
    found = dict.fromkeys(ATTENTION_KINDS, 0.0)
    for event in prof.key_averages():
        kind = attention_kind(event.key)
        if kind is None or (on_gpu and event.device_type != DeviceType.CUDA):  # a kernel's time, not also its launcher's
            continue
        if on_gpu:
            us = getattr(event, "self_device_time_total", None)
            us = getattr(event, "self_cuda_time_total", 0.0) if us is None else us
        else:
            us = event.self_cpu_time_total
        found[kind] += (us or 0.0) / 1e3  # a profiler without device times
    return {k: round(v, 3) for k, v in found.items() if v > 0}


def layer_kernels(kind: str, batch: int, block: int, device: Any) -> dict[str, Any]:
    """The attention kernels one forward and backward of a `kind` layer ran, eager and compiled."""
    import torch

    examples_on_path()
    import gptneo_attention as ga

    layer = attention_layer(kind, block, device)
    torch._dynamo.reset()  # each point compiled afresh for its own shapes, as a training run compiles its one
    compiled = torch.compile(layer, dynamic=False)
    hidden = torch.randn(batch, block, HEADS * HEAD_DIM, device=device, requires_grad=True)
    mask = ga.CausalMask({})  # the fast path: causal from position 0, no padding

    def step(module: Any) -> Any:
        def run() -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                out, _ = module(hidden, attention_mask=mask)
            out.float().square().mean().backward()
        return run

    step(compiled)()  # compile and warm up before the profiled call
    return {"eager": profiled_kinds(step(layer), device), "compiled": profiled_kinds(step(compiled), device)}


def sdpa_switches() -> dict[str, Any]:
    """The process-wide settings SDPA's dispatcher obeys: each backend's switch, and deterministic algorithms (under
    which it passes over kernels with a nondeterministic backward). bench/gptneo_bench.py records the same from inside
    a training run, where a library could have changed them."""
    import torch

    cuda = torch.backends.cuda
    return {"flash": cuda.flash_sdp_enabled(), "efficient": cuda.mem_efficient_sdp_enabled(),
            "cudnn": cuda.cudnn_sdp_enabled(), "math": cuda.math_sdp_enabled(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}


def run(repeat: int = 1, points: tuple[tuple[int, int], ...] | None = None) -> dict[str, Any]:
    """The record: the device, and per point the dispatcher's choices and the kernels each layer ran."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    points = points or (GPU_POINTS if device.type == "cuda" else CPU_POINTS)
    record: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                              "torch": torch.__version__, "switches": sdpa_switches(), "points": []}
    for batch, block in points:
        entry: dict[str, Any] = {"per_device_batch": batch, "block_size": block}
        try:
            entry["choice"] = dispatch_choices(batch, block, device)
            entry["layers"] = {kind: layer_kernels(kind, batch, block, device) for kind in ("global", "local")}
        except Exception as exc:  # out of memory, an unsupported shape: the point says so, the others still run
            entry["error"] = failure(exc)
        try:
            entry["model"] = model_path(batch, block, device)
        except Exception as exc:  # the layers' findings above still stand
            entry["model"] = {"error": failure(exc)}
        record["points"].append(entry)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record


def failure(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def report(record: dict[str, Any]) -> str:
    """One block per point: the dispatcher's choice per call, then each layer's attention kernels eager and compiled."""
    lines = [f"SDPA on {record['device']} (torch {record['torch']}), GPT-neo-125M's attention (12 heads of 64, window {WINDOW}):",
             "  switches: " + ", ".join(f"{k} {'on' if v else 'off'}" for k, v in record["switches"].items())]
    for p in record["points"]:
        lines.append(f"  {p['per_device_batch']} x {p['block_size']}")
        if "error" in p:
            lines.append(f"    dispatcher and layers not measured: {p['error']}")
        if "choice" in p:
            lines.append("    dispatcher: " + "; ".join(f"{call} {c['choice']}" for call, c in p["choice"].items()))
            for call, c in p["choice"].items():
                refused = {name: why for name, why in c["backends"].items() if why != "runs"}
                if refused:
                    lines.append(f"      {call}, not run: " + "; ".join(f"{name}: {why}" for name, why in refused.items()))
        for kind, ran in p.get("layers", {}).items():
            cells = [f"{how} " + (format_attention(found, 2) or "no attention kernel named") for how, found in ran.items()]
            lines.append(f"    {kind} layer: " + "; ".join(cells))
        m, whole = p.get("model"), "    whole model as the Trainer trains it (use_cache off, no mask)"
        if m is None:  # a record from before the model line
            continue
        if "error" in m:
            lines.append(f"{whole}: not measured: {m['error']}")
        else:
            lines.append(f"{whole}, compiled: SDPA {m['sdpa_calls']} of {m['expected_sdpa_calls']} calls, explicit softmax "
                         f"{m['explicit_softmax']}, {m['graphs']} graph(s); device waits uncompiled: "
                         + ("; ".join(m["device_waits"]) or "none"))
    return "\n".join(lines)
