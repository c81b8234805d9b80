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

MFU. The bf16 matmul peak of this GPU is measured (the best of square matmuls of 4096-16384), then
GPT-neo's 125M shape (bench/gptneo_bench.py: the example at that shape) trains at the defaults; its model FLOPs per token are
``6 N + 12 L d S``: 6 per parameter (forward and backward) plus attention's scores and weighted sum
(S = tokens attended: the block for global layers, the window for local ones; PaLM's convention,
causal masking not discounted; N without the position embeddings, a lookup). The reviews are packed into
full 512-token blocks (by the same wrapper), so every token counted is a real one, not padding. MFU = tokens/s x FLOPs
per token / peak, against the peak measured here (not the data sheet's). Target: >= 40%.

`python -m bench gpu` refuses to run without a GPU (figures from a CPU would say nothing about one);
``--allow-cpu`` runs the same pipeline with small settings, which is how its test checks the plumbing.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import ROOT, launch

COURSE = ["--precision", "fp32", "--channels-last", "off", "--fused", "off", "--loader-workers", "0", "--pin-memory", "off"]
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


def matmul_peak(dtype_name: str = "bfloat16", sizes: tuple[int, ...] = (4096, 8192, 16384), seconds: float = 2.0) -> dict[str, Any]:
    """The best sustained FLOP/s of square matmuls on GPU 0 (on the CPU with --allow-cpu, smaller sizes)."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, dtype_name) if device.type == "cuda" else torch.float32
    if device.type == "cpu":
        sizes = (256, 512)
    best: dict[str, Any] = {"flops": 0.0}
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()  # the warm-up done before the clock starts
        iters, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            for _ in range(10):
                a @ b
            iters += 10
            sync()
        flops = 2 * n**3 * iters / (time.perf_counter() - started)
        if flops > best["flops"]:
            best = {"flops": flops, "n": n, "dtype": str(dtype).removeprefix("torch."), "device": device.type}
        del a, b
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the examples run next, in their own processes, on the same GPU
    return best


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


def run_example(case: str, variant: list[str], out: Path, allow_cpu: bool) -> dict[str, Any]:
    script, gpu_args, cpu_args, quality = CASES[case]
    argv = [sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", "1", str(ROOT / script),
            *(cpu_args if allow_cpu else gpu_args), *variant, "--out", str(out), "--no-resume"]
    launch(argv, timeout=3000)
    summary = json.loads((out / "summary.json").read_text())
    return {"samples_per_s": throughput(summary), "step_time_s": summary["step_time_s"],
            "steady_step_time_s": summary.get("steady_step_time_s"), "steps": summary["steps"],
            "quality": {quality: summary.get(quality)}, "time_split_s": summary.get("time_split_s"), "summary": summary}


def run(repeat: int = 1, cases: tuple[str, ...] = tuple(CASES), compile: bool = False, allow_cpu: bool = False) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available() and not allow_cpu:
        raise SystemExit("bench gpu: no GPU is visible (torch.cuda.is_available() is False); run it on a GPU machine, "
                         "or pass --allow-cpu to check the pipeline with small settings")
    variants = {"course": COURSE, "gpuscale": []}
    if compile:
        variants["gpuscale+compile"] = ["--compile"]
    results: dict[str, Any] = {"peak": matmul_peak(), "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
            for round_ in range(repeat):
                for name, flags in variants.items():
                    runs[name].append(run_example(case, flags, Path(tmp) / f"{case}-{name}-{round_}", allow_cpu))
            entry: dict[str, Any] = {"runs": {name: [{k: v for k, v in r.items() if k != "summary"} for r in rs] for name, rs in runs.items()}}
            median = {name: statistics.median(r["samples_per_s"] for r in rs) for name, rs in runs.items()}
            entry["samples_per_s"] = median
            entry["speedup_vs_course"] = {name: median[name] / median["course"] for name in variants if name != "course"}
            if case == "gptneo":
                best = max(runs["gpuscale"] + runs.get("gpuscale+compile", []), key=lambda r: r["samples_per_s"])
                per_token = flops_per_token(best["summary"])
                if per_token is None or not best["summary"].get("packed"):
                    raise RuntimeError("the GPT-neo run wrote no model shape or was not packed (bench/gptneo_bench.py): its tokens per "
                                       "sample are unknown, so no MFU")
                tokens_per_s = best["samples_per_s"] * best["summary"]["block_size"]  # packed: every sample is a full block
                entry["mfu"] = {"flops_per_token": per_token, "tokens_per_s": tokens_per_s,
                                "model_flops": tokens_per_s * per_token, "peak_flops": results["peak"]["flops"],
                                "mfu": tokens_per_s * per_token / results["peak"]["flops"],
                                "parameters": best["summary"]["parameters"]}
            results["cases"][case] = entry
    results["allow_cpu"] = allow_cpu
    results["targets"] = {
        "gpuscale >= 2x course": all(e["speedup_vs_course"]["gpuscale"] >= 2.0 for e in results["cases"].values()),
        "gptneo MFU >= 40%": results["cases"].get("gptneo", {}).get("mfu", {}).get("mfu", 0.0) >= 0.40,
    }
    return results


def report(record: dict[str, Any]) -> str:
    peak = record["peak"]
    lines = [f"matmul peak: {peak['flops'] / 1e12:.1f} TFLOP/s ({peak['dtype']}, n={peak['n']}, {peak['device']})"]
    for case, entry in record["cases"].items():
        for name, value in entry["samples_per_s"].items():
            quality = entry["runs"][name][0]["quality"]
            speedup = entry["speedup_vs_course"].get(name)
            lines.append(f"{case:<13} {name:<17} {value:10.1f} samples/s" + (f"  {speedup:.2f}x the course's" if speedup else "")
                         + f"  {quality}")
        if "mfu" in entry:
            m = entry["mfu"]
            lines.append(f"{case:<13} MFU {100 * m['mfu']:.1f}% ({m['tokens_per_s']:.0f} tokens/s x {m['flops_per_token'] / 1e9:.2f} "
                         f"GFLOP/token, {m['parameters'] / 1e6:.1f} M parameters)")
    return "\n".join(lines)
