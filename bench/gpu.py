"""On a GPU: each example at gpuscale's defaults against the course's way, and GPT-neo's model FLOPs utilisation.

For each example (dogs vs cats, ViT, GPT-neo on IMDB) two runs of one process on GPU 0, the same
steps and seed:

- ``course``: ``--precision fp32 --channels-last off --fused off --loader-workers 0 --pin-memory off``,
  the way the course's scripts run (fp32, a default loader in the training process, per-parameter
  optimizer kernels);
- ``gpuscale``: the defaults (bf16 autocast, channels-last convolutions, fused optimizer, loader
  workers on the rank's cores, pinned memory), and with ``--compile`` also a ``gpuscale+compile`` run.

Throughput is the training steps' own (global batch / step time after the first 10 steps, from the run's
summary.json: loader waits included; warm-up, evaluation and start-up not), so the two runs, compiled or not,
compare like for like; the accuracy
(or perplexity) after the same steps is recorded beside it. Target: gpuscale >= 2x the course's way.

MFU. First the bf16 matmul peak of this GPU is measured the way the best benchmarks do (`matmul_peak`): square
products of 4096, 6144, 8192, 12288 and 16384, each size after 1.5 s of the same products (the clocks warm), timed
between CUDA events over 5 batches of about 0.3 s, the best batch counted; the best size is the peak (about 15 s
in all). Then GPT-neo's 125M shape (bench/gptneo_bench.py: the example at that shape) trains at the defaults; its
model FLOPs per token are ``6 N + 12 L d S``: 6 per parameter (forward and backward) plus attention's scores and
weighted sum (S = tokens attended: the block for global layers, the window for local ones; PaLM's convention,
causal masking not discounted; N without the position embeddings, a lookup). The reviews are packed into full
512-token blocks (by the same wrapper), so every token counted is a real one, not padding. MFU = tokens/s x FLOPs
per token / peak, against the peak measured here (``mfu``, the target's) and against the data sheet's dense bf16
figure for the GPU named (``mfu_datasheet``; `DATASHEET_BF16`, None for a GPU not in it). Target: >= 40%.

``--sweep quick|full`` adds GPT-neo's sweep: the 125M shape compiled at several (per-device batch x block) points
(`QUICK_SWEEP`: 16x512, 64x512, 32x1024; `SWEEP` adds 32x512 and 16x1024), each run 40 steps with steps 26-28 profiled
(bench/step_profile.py: GPU busy share, the longest gaps and what the host ran in them, device syncs per step, the
top kernels and host operators, and one line on what bounds the step). A point's throughput is the global batch
over its step time between two device synchronisations (steps 11-24 and 29-40: ``synced_step_s``; the host's median
step beside it, ``host_step_ms``, is shorter where the host runs ahead of the GPU); its MFU as above; the best point and the targets (16x512
>= 35%, best >= 45% of the measured peak) go into the record. Then the best point runs once more on transformers' eager
attention, not compiled, the course's way (``quality``): the same seed, steps and tokens, and the target that the best
point's perplexity is no worse than that (within `PERPLEXITY_ALLOWANCE`): the speed must not cost the model. The
sweep compiles in `SWEEP_COMPILE_MODE`, reduce-overhead (CUDA graphs: BENCHMARKS.md, "Issue 27"); ``--compile-mode``
runs it in another torch.compile mode (default: Inductor's kernels launched one by one), ``--attention flex`` with
another of the example's attentions; ``--points 16x512,64x512`` sweeps the points named instead. A point that fails
keeps its error and its log's last lines.

`python -m bench gpu` refuses to run without a GPU (figures from a CPU would say nothing about one);
``--allow-cpu`` runs the same pipeline with small settings, which is how its test checks the plumbing.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.stats import ROOT, launch
from bench.step_profile import format_attention

COURSE = ["--precision", "fp32", "--channels-last", "off", "--fused", "off", "--loader-workers", "0", "--pin-memory", "off"]
COURSE_EXTRA = {"gptneo": ["--attention", "eager"]}
"""The course's way where an example has more switches: GPT-neo with transformers' eager attention (its default is SDPA)."""
# (script from the repository's root, arguments at GPU scale, arguments for a CPU check of the plumbing, the summary key
# of its quality); GPT-neo runs through bench/gptneo_bench.py: the example at GPT-neo-125M's shape, on packed blocks
CASES: dict[str, tuple[str, list[str], list[str], str]] = {
    "dogs_vs_cats": ("examples/dogs_vs_cats.py",
                     ["--image-size", "150", "--batch-size", "64", "--epochs", "3", "--finetune-epochs", "1", "--scaling", "weak"],
                     ["--epochs", "1", "--finetune-epochs", "0"], "test_accuracy"),
    "vit": ("examples/vit.py", ["--batch-size", "128", "--epochs", "10"], ["--epochs", "1"], "accuracy"),
    "gptneo": ("bench/gptneo_bench.py",
               ["--block-size", "512", "--global-batch", "16", "--max-steps", "150", "--eval-steps", "150",
                "--save-steps", "1000", "--lr", "6e-4", "--warmup-steps", "15", "--num-samples", "1", "--test-chunks", "200"],
               ["--model-size", "tiny", "--max-steps", "4", "--eval-steps", "4", "--save-steps", "100", "--num-samples", "1", "--test-chunks", "20",
                "--val-chunks", "40"], "perplexity"),
}


# The matmul peak's sizes: square products large enough to keep every SM busy (4096) up to the largest the examples'
# GPU can spare memory for (16384: three 512 MiB bf16 matrices); on a CPU (--allow-cpu, a check) small ones.
GPU_SIZES = (4096, 6144, 8192, 12288, 16384)
CPU_SIZES = (128, 256)

# Data-sheet peaks of dense bf16 matrix arithmetic (no 2:4 sparsity) per device torch sees, keyed by a pattern of the
# name torch.cuda.get_device_name gives; the first pattern that matches wins, so the specific ones come first. A name
# that matches none (H100 NVL, GH200, B200, ...: not checked against a data sheet here) or a MIG slice has none.
# Checked 2026-11-25 against the vendors' tables as published copies reproduce them (the H100 table with its footnote
# "shown with sparsity", NVIDIA's Hopper and A100 figures as glennklockwood.com's processor notes cite them, the L40S
# data sheet's table, AMD's MI200 launch table).
DATASHEET_BF16: tuple[tuple[str, float, str], ...] = (
    # NVIDIA H100 Tensor Core GPU data sheet: H100 PCIe BF16 Tensor Core 1,513 TFLOPS "with sparsity"; dense is half
    (r"\bH100 PCIe\b", 756e12, "NVIDIA H100 data sheet, H100 PCIe: BF16 Tensor Core 1,513 TFLOPS with sparsity, halved"),
    # the same data sheet: H100 SXM 1,979 TFLOPS with sparsity; NVIDIA's Hopper white paper gives dense 989.4 (132 SMs x
    # 4,096 bf16 FLOPs per clock x 1.83 GHz). SXM boards name themselves "H100 80GB HBM3"
    (r"\bH100 (80GB HBM3|SXM)", 989.4e12, "NVIDIA H100 data sheet, H100 SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity, halved"),
    # NVIDIA H200 data sheet: H200 SXM BF16 Tensor Core 1,979 TFLOPS with sparsity, the H100 SXM's figure (same GH100)
    (r"\bH200\b(?! NVL)", 989.4e12, "NVIDIA H200 data sheet, H200 SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity, halved"),
    # NVIDIA A100 data sheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity), SXM4 and PCIe, 40 and 80 GB alike
    (r"\bA100\b", 312e12, "NVIDIA A100 data sheet: BF16 Tensor Core 312 TFLOPS"),
    # NVIDIA L40S data sheet: BF16 Tensor Core 362.05 TFLOPS (733 with sparsity)
    (r"\bL40S\b", 362.05e12, "NVIDIA L40S data sheet: BF16 Tensor Core 362.05 TFLOPS"),
    # AMD Instinct MI250X data sheet: peak bf16 383.0 TFLOPS for the package of two GCDs, and torch sees each GCD as a
    # GPU of its own: half per device (ROCm names some MI250 boards "MI250X/MI250": those read as an MI250X, 5% high)
    (r"\bMI250X\b", 191.5e12, "AMD Instinct MI250X data sheet: peak bf16 383.0 TFLOPS per package of 2 GCDs, halved per GCD"),
)


def datasheet_peak(name: str | None) -> dict[str, Any] | None:
    """The data sheet's dense bf16 peak of one device named `name` (torch's name), with its source; None where
    bench/gpu.py's DATASHEET_BF16 has no figure for it (an unknown GPU, a MIG slice, or no GPU at all)."""
    if not name or " MIG " in f"{name} ":
        return None
    for pattern, flops, source in DATASHEET_BF16:
        if re.search(pattern, name):
            return {"flops": flops, "source": source}
    return None


def gpu_identity() -> dict[str, Any] | None:
    """GPU 0 as torch sees it: name, compute capability, SMs and memory; None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": torch.cuda.get_device_name(0), "capability": "{}.{}".format(*torch.cuda.get_device_capability(0)),
            "multiprocessors": props.multi_processor_count, "memory_bytes": props.total_memory}


def _warm_up(matmul: Callable[[], Any], sync: Callable[[], None], seconds: float) -> float:
    """Run `matmul` for about `seconds` (the clocks ramp up, the library picks its kernel); the seconds per call
    at the end, from a batch long enough (a tenth of `seconds`) to time with the wall clock."""
    calls, started = 1, time.perf_counter()
    while True:
        began = time.perf_counter()
        for _ in range(calls):
            matmul()
        sync()
        took = time.perf_counter() - began
        if time.perf_counter() - started >= seconds:
            return took / calls
        if took < seconds / 10:
            calls *= 2


def _timed(batch: Callable[[], None], on_gpu: bool) -> float:
    """Seconds `batch` took: between CUDA events recorded around it on a GPU (the GPU's time), else the wall clock."""
    import torch

    if not on_gpu:
        began = time.perf_counter()
        batch()
        return time.perf_counter() - began
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    batch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def measure_size(n: int, dtype: Any, device: Any, warmup_s: float, repeats: int, repeat_s: float) -> dict[str, Any]:
    """FLOP/s of n x n @ n x n products: after `warmup_s` of them, `repeats` batches of about `repeat_s` each, the
    best batch counted (the least disturbed: a clock dip or another process only ever slows one down)."""
    import torch

    on_gpu = device.type == "cuda"
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def matmul() -> None:
        torch.mm(a, b, out=out)

    per_call = _warm_up(matmul, torch.cuda.synchronize if on_gpu else (lambda: None), warmup_s)
    calls = max(1, round(repeat_s / per_call))

    def batch() -> None:
        for _ in range(calls):
            matmul()

    seconds = [_timed(batch, on_gpu) for _ in range(repeats)]
    flops = [2.0 * n**3 * calls / s for s in seconds]
    return {"n": n, "flops": max(flops), "median_flops": statistics.median(flops), "calls_per_repeat": calls,
            "repeat_s": seconds}


def matmul_peak(dtype_name: str = "bfloat16", sizes: tuple[int, ...] | None = None, warmup_s: float | None = None,
                repeats: int = 5, repeat_s: float | None = None) -> dict[str, Any]:
    """The bf16 matmul peak of GPU 0 as the best benchmarks measure it: square products of several sizes
    (`GPU_SIZES`), each after `warmup_s` of the same products (clocks warm), the best of `repeats` timed batches of
    about `repeat_s` (CUDA events); the best size's FLOP/s is the peak. With it: every size's figures, the GPU's
    name and compute capability, and the data sheet's dense bf16 peak (None for a GPU not in `DATASHEET_BF16`).

    Without a GPU (--allow-cpu, a check of the plumbing) float32 on the CPU, `CPU_SIZES`, short timings.
    """
    import torch

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = getattr(torch, dtype_name) if on_gpu else torch.float32
    sizes = sizes or (GPU_SIZES if on_gpu else CPU_SIZES)
    warmup_s = warmup_s if warmup_s is not None else (1.5 if on_gpu else 0.1)
    repeat_s = repeat_s if repeat_s is not None else (0.3 if on_gpu else 0.05)
    per_size = [measure_size(n, dtype, device, warmup_s, repeats, repeat_s) for n in sizes]
    if on_gpu:
        torch.cuda.empty_cache()  # the examples run next, in their own processes, on the same GPU
    best = max(per_size, key=lambda s: s["flops"])
    gpu = gpu_identity()
    sheet = datasheet_peak(gpu["name"]) if gpu else None
    return {"flops": best["flops"], "n": best["n"], "dtype": str(dtype).removeprefix("torch."), "device": device.type,
            "gpu": gpu, "sizes": per_size, "datasheet": sheet,
            "of_datasheet": best["flops"] / sheet["flops"] if sheet else None,
            "method": {"warmup_s": warmup_s, "repeats": repeats, "repeat_s": repeat_s,
                       "timer": "cuda events" if on_gpu else "wall clock"}}


def flops_per_token(summary: dict[str, Any]) -> float | None:
    """Model FLOPs per trained token of a GPT-neo run from its summary: 6 N + 12 L d S (see the module docstring).

    N leaves out the position embeddings (a lookup, no arithmetic); the tied token embedding stays in, as it is also
    the output layer's matmul. None when the summary has no GPT-neo shape (another architecture).
    """
    shape, block = summary.get("model_shape"), summary["block_size"]
    if not shape:
        return None
    attended = [block if kind == "global" else min(block, shape["window_size"]) for kind in shape["attention_layers"]]
    matmul_parameters = summary["parameters"] - shape.get("position_embedding_parameters", 0)
    return 6.0 * matmul_parameters + 12.0 * shape["hidden_size"] * sum(attended)


def throughput(summary: dict[str, Any]) -> float:
    """Training samples per second of a run: global batch / time per optimizer step (loader waits included),
    after the warm-up steps (compilation, cuDNN's search) where the run had more, else over all steps."""
    return summary["global_batch"] / (summary.get("steady_step_time_s") or summary["step_time_s"])


def model_flops_utilisation(summary: dict[str, Any], samples_per_s: float, peak: dict[str, Any]) -> dict[str, Any]:
    """GPT-neo's MFU from a packed run's summary and throughput: model FLOP/s over the peak measured here (``mfu``)
    and over the data sheet's dense bf16 peak (``mfu_datasheet``; None for a GPU not in `DATASHEET_BF16`)."""
    per_token = flops_per_token(summary)
    if per_token is None or not summary.get("packed"):
        raise RuntimeError("the GPT-neo run wrote no model shape or was not packed (bench/gptneo_bench.py): its tokens per "
                           "sample are unknown, so no MFU")
    tokens_per_s = samples_per_s * summary["block_size"]  # packed: every sample is a full block
    model_flops = tokens_per_s * per_token
    sheet = peak.get("datasheet")
    return {"flops_per_token": per_token, "tokens_per_s": tokens_per_s, "model_flops": model_flops,
            "peak_flops": peak["flops"], "mfu": model_flops / peak["flops"],
            "datasheet_peak_flops": sheet["flops"] if sheet else None,
            "mfu_datasheet": model_flops / sheet["flops"] if sheet else None,
            "gpu": (peak.get("gpu") or {}).get("name"), "parameters": summary["parameters"]}


def run_example(case: str, variant: list[str], out: Path, allow_cpu: bool) -> dict[str, Any]:
    script, gpu_args, cpu_args, quality = CASES[case]
    argv = [sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", "1", str(ROOT / script),
            *(cpu_args if allow_cpu else gpu_args), *variant, "--out", str(out), "--no-resume"]
    launch(argv, timeout=3000)
    summary = json.loads((out / "summary.json").read_text())
    return {"samples_per_s": throughput(summary), "step_time_s": summary["step_time_s"],
            "steady_step_time_s": summary.get("steady_step_time_s"), "steps": summary["steps"],
            "quality": {quality: summary.get(quality)}, "time_split_s": summary.get("time_split_s"), "summary": summary}


# GPT-neo's sweep: (per-device batch, tokens per block) at GPT-neo-125M's shape, compiled, each point profiled
SWEEP = ((16, 512), (32, 512), (64, 512), (16, 1024), (32, 1024))
QUICK_SWEEP = ((16, 512), (64, 512), (32, 1024))
CPU_SWEEP = ((4, 64),)  # a check of the plumbing: one point (each tiny run costs the CPU suite some 40 s)
SWEEP_COMPILE_MODE = "reduce-overhead"  # measured fastest at every point on an H200 (BENCHMARKS.md, "Issue 27")
SWEEP_STEPS, PROFILE_AT = 40, (25, 3)  # steps per point; profiled after step 25, three of them
SWEEP_GPU_ARGS = ["--max-steps", str(SWEEP_STEPS), "--eval-steps", "1000", "--save-steps", "1000", "--lr", "6e-4",
                  "--warmup-steps", "10", "--num-samples", "0", "--test-chunks", "20", "--val-chunks", "20"]
SWEEP_CPU_ARGS = ["--model-size", "tiny", "--max-steps", "8", "--eval-steps", "100", "--save-steps", "100",
                  "--num-samples", "0", "--test-chunks", "10", "--val-chunks", "20"]
# The best point's quality reference: the same point, seed, steps and tokens on transformers' own (eager) attention,
# not compiled: the way the course trains. The fast path (SDPA, compiled, CUDA graphs) must reach a perplexity no worse,
# within PERPLEXITY_ALLOWANCE: the two attentions and the compiler round differently (bf16 on a GPU), so after the
# sweep's 40 steps from random weights their perplexities differ by a little either way; 2% is a stated bound, not a
# measured noise (on the 2-core CPU, in fp32, the tiny model's logits differ by 2e-7 and the two perplexities after 8
# steps agree to every digit: a CPU checks that the reference runs, not the bound)
REFERENCE_ATTENTION, PERPLEXITY_ALLOWANCE = "eager", 0.02


def sweep_point(batch: int, block: int, peak: dict[str, Any], out: Path, allow_cpu: bool,
                compile_mode: str | None = None, attention: str | None = None, compiled: bool = True) -> dict[str, Any]:
    """One point of GPT-neo's sweep: throughput from the step time between device synchronisations, MFU, perplexity
    after the tokens it trained, the step profile. `compiled` False: not compiled (the quality reference's way)."""
    start, count = (4, 2) if allow_cpu else PROFILE_AT
    mode = (compile_mode or SWEEP_COMPILE_MODE) if compiled and not allow_cpu else None
    argv = [sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", "1", str(ROOT / "bench" / "gptneo_bench.py"),
            "--block-size", str(block), "--global-batch", str(batch), *(SWEEP_CPU_ARGS if allow_cpu else SWEEP_GPU_ARGS),
            *(["--compile", "--compile-mode", mode] if mode else []),
            *(["--attention", attention] if attention else []),
            "--profile-steps", f"{start}:{count}", "--out", str(out), "--no-resume"]
    point: dict[str, Any] = {"per_device_batch": batch, "block_size": block, "compile_mode": mode,
                             "attention": attention or "default"}
    try:
        launch(argv, timeout=1200)
    except Exception as exc:  # out of memory, say: the sweep goes on, the point says why, and its log's end shows where
        lines = str(exc).strip().splitlines()
        point["error"] = lines[-1][:300] if lines else type(exc).__name__
        point["error_log"] = lines[-40:]
        return point
    summary = json.loads((out / "summary.json").read_text())
    profile = json.loads((out / "step_profile.json").read_text())
    # the step between device synchronisations: a host that runs ahead of the GPU (CUDA graphs) does not count as speed
    sources = (("synced", profile.get("synced_step_s")), ("host median", profile.get("median_step_s")),
               ("summary steady", summary.get("steady_step_time_s")), ("summary", summary["step_time_s"]))
    step_source, step_s = next((name, value) for name, value in sources if value)
    samples_per_s = summary["global_batch"] / step_s
    mfu = model_flops_utilisation(summary, samples_per_s, peak)
    host_s = profile.get("median_step_s")
    point.update(samples_per_s=samples_per_s, step_ms=1e3 * step_s, step_source=step_source,
                 host_step_ms=1e3 * host_s if host_s else None,
                 mfu=mfu["mfu"], mfu_datasheet=mfu["mfu_datasheet"],
                 tokens_per_s=mfu["tokens_per_s"], perplexity=summary.get("perplexity"),
                 tokens_trained=summary["samples"] * summary["block_size"],  # packed: every sample a full block
                 attention_ran=summary.get("attention"),  # the run's own word, e.g. sdpa for "default"
                 peak_memory_gib=summary["peak_memory_bytes"] / 2**30, sdpa_switches=summary.get("sdpa_switches"),
                 profile=profile)
    return point


def quality_against_reference(best: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """The best point's perplexity against the reference's, run at the same point on `REFERENCE_ATTENTION`: their
    ratio, whether both trained the same tokens, and whether the best point is no worse (within
    `PERPLEXITY_ALLOWANCE`). Where the reference failed: its error, and no verdict."""
    entry: dict[str, Any] = {"point": f"{reference['per_device_batch']}x{reference['block_size']}",
                             "attention": reference.get("attention_ran") or reference["attention"],
                             "compile_mode": reference["compile_mode"], "best_attention": best.get("attention_ran"),
                             "allowance": PERPLEXITY_ALLOWANCE, "perplexity": best.get("perplexity")}
    if "error" in reference:
        return {**entry, "error": reference["error"], "error_log": reference.get("error_log"), "no_worse": None}
    same_tokens = best["tokens_trained"] == reference["tokens_trained"]
    ratio = best["perplexity"] / reference["perplexity"]
    return {**entry, "reference_perplexity": reference["perplexity"], "ratio": ratio, "tokens_trained": best["tokens_trained"],
            "same_tokens": same_tokens, "reference_step_ms": reference["step_ms"],
            "no_worse": same_tokens and entry["attention"] == REFERENCE_ATTENTION and ratio <= 1.0 + PERPLEXITY_ALLOWANCE}


def describe_quality(quality: dict[str, Any]) -> str:
    """One line on the best point's perplexity against the reference's."""
    if "error" in quality:
        return f"{quality['attention']} attention at {quality['point']} not measured: {quality['error']}"
    tokens = "" if quality["same_tokens"] else " (NOT the same tokens)"
    return (f"perplexity {quality['perplexity']:.1f} against {quality['attention']} attention's {quality['reference_perplexity']:.1f} "
            f"({100 * (quality['ratio'] - 1):+.1f}%, allowed +{100 * quality['allowance']:g}%){tokens}")


def _best(points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measured point of highest MFU."""
    measured = [p for p in points if "mfu" in p]
    return max(measured, key=lambda p: p["mfu"]) if measured else None


def _swept(points: list[dict[str, Any]], quality: dict[str, Any] | None = None) -> dict[str, Any]:
    best = _best(points)
    return {"points": points, "best": {k: best[k] for k in ("per_device_batch", "block_size", "mfu", "step_ms")} if best else None,
            "quality": quality}


def sweep(points: tuple[tuple[int, int], ...], peak: dict[str, Any], allow_cpu: bool,
          compile_mode: str | None = None, attention: str | None = None,
          progress: Callable[[dict[str, Any]], None] = lambda swept: None) -> dict[str, Any]:
    """GPT-neo at each (batch, block) point, the best by MFU, and its perplexity against the same point trained on
    transformers' eager attention, uncompiled (``quality``). `progress` gets the sweep so far after each point."""
    with tempfile.TemporaryDirectory() as tmp:
        done = []
        for b, s in points:
            done.append(sweep_point(b, s, peak, Path(tmp) / f"gptneo-{b}x{s}", allow_cpu, compile_mode, attention))
            p = done[-1]
            print(f"sweep: GPT-neo {b} x {s}: " + (f"not measured: {p['error']}" if "error" in p else
                  f"{p['step_ms']:.1f} ms/step, MFU {100 * p['mfu']:.1f}%; {p['profile']['bound']}"), flush=True)
            progress(_swept(done))
        best, quality = _best(done), None
        if best is not None:
            b, s = best["per_device_batch"], best["block_size"]
            reference = sweep_point(b, s, peak, Path(tmp) / f"gptneo-{b}x{s}-{REFERENCE_ATTENTION}", allow_cpu,
                                    attention=REFERENCE_ATTENTION, compiled=False)
            quality = quality_against_reference(best, reference)
            print(f"sweep: GPT-neo {b} x {s}: {describe_quality(quality)}", flush=True)
    return _swept(done, quality)


def run(repeat: int = 1, cases: tuple[str, ...] = tuple(CASES), compile: bool = False, allow_cpu: bool = False,
        sweep_points: tuple[tuple[int, int], ...] | None = None, compile_mode: str | None = None,
        attention: str | None = None, progress: Callable[[dict[str, Any]], None] = lambda record: None) -> dict[str, Any]:
    """The benchmark's record: the peak, then each of `cases` run `repeat` times each way (the course's, gpuscale's
    defaults, and compiled with `compile`), medians, speed-ups, GPT-neo's MFU and whether the targets are met.

    `progress` gets the record so far (``"complete": False``, no targets) after the peak, each case and each sweep
    point: `python -m bench gpu` writes it, so a run killed at its budget still leaves what it measured."""
    import torch

    if not torch.cuda.is_available() and not allow_cpu:
        raise SystemExit("bench gpu: no GPU is visible (torch.cuda.is_available() is False); run it on a GPU machine, "
                         "or pass --allow-cpu to check the pipeline with small settings")
    variants = {"course": COURSE, "gpuscale": []}
    if compile:
        variants["gpuscale+compile"] = ["--compile"]
    results: dict[str, Any] = {"peak": matmul_peak(), "cases": {}, "allow_cpu": allow_cpu, "complete": False}
    progress(results)
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
            for round_ in range(repeat):
                for name, flags in variants.items():
                    flags = [*flags, *COURSE_EXTRA.get(case, [])] if name == "course" else flags
                    runs[name].append(run_example(case, flags, Path(tmp) / f"{case}-{name}-{round_}", allow_cpu))
            entry: dict[str, Any] = {"runs": {name: [{k: v for k, v in r.items() if k != "summary"} for r in rs] for name, rs in runs.items()}}
            median = {name: statistics.median(r["samples_per_s"] for r in rs) for name, rs in runs.items()}
            entry["samples_per_s"] = median
            entry["speedup_vs_course"] = {name: median[name] / median["course"] for name in variants if name != "course"}
            if case == "gptneo":
                best = max(runs["gpuscale"] + runs.get("gpuscale+compile", []), key=lambda r: r["samples_per_s"])
                entry["mfu"] = model_flops_utilisation(best["summary"], best["samples_per_s"], results["peak"])
            results["cases"][case] = entry
            progress(results)
    targets: dict[str, bool] = {}
    if results["cases"]:
        targets["gpuscale >= 2x course"] = all(e["speedup_vs_course"]["gpuscale"] >= 2.0 for e in results["cases"].values())
    if "gptneo" in results["cases"]:
        targets["gptneo MFU >= 40%"] = results["cases"]["gptneo"].get("mfu", {}).get("mfu", 0.0) >= 0.40
    if sweep_points:
        swept = results["gptneo_sweep"] = sweep(sweep_points, results["peak"], allow_cpu, compile_mode, attention,
                                                progress=lambda so_far: progress({**results, "gptneo_sweep": so_far}))
        first = next((p for p in swept["points"] if (p["per_device_batch"], p["block_size"]) == (16, 512) and "mfu" in p), None)
        if first is not None:
            targets["gptneo 16x512 MFU >= 35%"] = first["mfu"] >= 0.35
        targets["gptneo best MFU >= 45%"] = bool(swept["best"] and swept["best"]["mfu"] >= 0.45)
        quality = swept["quality"]
        targets[f"gptneo best point's perplexity no worse than {REFERENCE_ATTENTION} attention's"] = bool(quality and quality["no_worse"])
    results.update(targets=targets, complete=True)
    return results


def describe_peak(peak: dict[str, Any]) -> list[str]:
    """The report's lines on the peak: the GPU named, the measured best and every size, the data sheet's figure."""
    gpu, sheet = peak.get("gpu"), peak.get("datasheet")
    where = f"{gpu['name']} (compute capability {gpu['capability']})" if gpu else f"{peak['device']} (no GPU: a check, not a figure)"
    method = peak["method"]
    lines = [f"GPU: {where}",
             (f"matmul peak: {peak['flops'] / 1e12:.1f} TFLOP/s ({peak['dtype']}, n={peak['n']}; best of {method['repeats']} "
              f"repeats per size after {method['warmup_s']:g} s of warm-up)"),
             "  per size: " + ", ".join(f"{s['n']}: {s['flops'] / 1e12:.1f}" for s in peak["sizes"]) + " TFLOP/s"]
    if sheet:
        lines.append(f"data sheet: {sheet['flops'] / 1e12:.1f} TFLOP/s dense bf16 ({sheet['source']}); measured "
                     f"{100 * peak['of_datasheet']:.1f}% of it")
    else:
        lines.append("data sheet: none (" + (f"unknown GPU {gpu['name']!r}: not in bench/gpu.py's DATASHEET_BF16)" if gpu else "no GPU)"))
    return lines


def describe_sweep(swept: dict[str, Any]) -> list[str]:
    """The report's lines on GPT-neo's sweep: each point's MFU and what bounds its step."""
    first = swept["points"][0] if swept["points"] else {}
    mode, attention = first.get("compile_mode"), first.get("attention", "default")
    how = f"compiled (mode {mode}, attention {attention})" if mode else f"not compiled (a CPU check; attention {attention})"
    lines = [f"GPT-neo 125M shape, {how}, per (batch x block):"]
    for p in swept["points"]:
        label = f"  {p['per_device_batch']:>3} x {p['block_size']:<5}"
        if "error" in p:
            lines.append(f"{label} not measured: {p['error']}")
            continue
        host = f" (host {p['host_step_ms']:.1f})" if p.get("host_step_ms") else ""
        lines.append(f"{label} {p['step_ms']:7.1f} ms/step{host}  {p['samples_per_s']:8.1f} samples/s  MFU {100 * p['mfu']:.1f}%  "
                     f"perplexity {p['perplexity']:.1f}  peak {p['peak_memory_gib']:.1f} GiB")
        lines.append(f"      {p['profile']['bound']}")
        if (kernels := p["profile"].get("attention_ms_per_step")) is not None:
            lines.append("      attention kernels per step: " + (format_attention(kernels, 2) or "none on a device"))
    if swept["best"]:
        b = swept["best"]
        lines.append(f"  best: {b['per_device_batch']} x {b['block_size']}, MFU {100 * b['mfu']:.1f}%")
    if swept.get("quality"):
        lines.append(f"  best point's {describe_quality(swept['quality'])}")
    return lines


def report(record: dict[str, Any]) -> str:
    """The printed report of a `run` record: the peak, each example's throughput and quality, GPT-neo's MFU."""
    lines = describe_peak(record["peak"])
    for case, entry in record["cases"].items():
        for name, value in entry["samples_per_s"].items():
            quality = entry["runs"][name][0]["quality"]
            speedup = entry["speedup_vs_course"].get(name)
            lines.append(f"{case:<13} {name:<17} {value:10.1f} samples/s" + (f"  {speedup:.2f}x the course's" if speedup else "")
                         + f"  {quality}")
        if "mfu" in entry:
            m = entry["mfu"]
            sheet = (f"{100 * m['mfu_datasheet']:.1f}% of the data sheet's {m['datasheet_peak_flops'] / 1e12:.1f}"
                     if m.get("mfu_datasheet") is not None else "data sheet's: unknown GPU")
            lines.append(f"{case:<13} MFU {100 * m['mfu']:.1f}% of the measured peak ({m['peak_flops'] / 1e12:.1f} TFLOP/s), {sheet} "
                         f"({m['tokens_per_s']:.0f} tokens/s x {m['flops_per_token'] / 1e9:.2f} GFLOP/token, "
                         f"{m['parameters'] / 1e6:.1f} M parameters)")
    if record.get("gptneo_sweep"):
        lines += describe_sweep(record["gptneo_sweep"])
    return "\n".join(lines)
