"""The benchmark runner's arithmetic and its refusal of bad input (the benchmarks themselves run in bench/, not here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.stats import summary  # noqa: E402


def test_summary_gives_median_range_and_relative_spread():
    s = summary([10.0, 12.0, 11.0, 30.0])
    assert s == {"median": 11.5, "min": 10.0, "max": 30.0, "spread": pytest.approx(20.0 / 11.5), "n": 4}
    assert summary([5.0])["spread"] == 0.0


@pytest.mark.parametrize("argv, message", [(["nosuch"], "unknown benchmark(s) nosuch"), (["--repeat", "0"], "--repeat 0 must be at least 1"),
                                           (["--nproc", "1,x"], "is not a comma-separated list of positive numbers"),
                                           (["--batch-sizes", "0"], "is not a comma-separated list of positive numbers"),
                                           (["overhead", "--compile"], "--compile is an option of the gpu benchmark"),
                                           (["gpu", "--cases", "resnet"], "unknown example(s) resnet"),
                                           (["gpu", "--points", "16x"], "is not a comma-separated list of BATCHxBLOCK points"),
                                           (["gpu", "--compile-mode", "reduce-overhead"], "--compile-mode applies to GPT-neo's sweep"),
                                           (["overhead", "--points", "16x512"], "--points is an option of the gpu, sdpa or hf_sdpa benchmark")])
def test_bad_arguments_are_one_line_errors(argv, message):
    result = subprocess.run([sys.executable, "-m", "bench", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_points_replace_the_named_sweeps_and_take_the_compile_mode(tmp_path, monkeypatch):
    """`python -m bench gpu --points 16x512,32x1024 --compile-mode reduce-overhead --cases ''`: the next GPU session's
    one command for CUDA graphs at the points it names, and no examples."""
    import bench.__main__ as runner
    import bench.gpu as gpu

    seen = {}
    monkeypatch.setattr(gpu, "run", lambda **options: seen.update(options) or {"record": True})
    monkeypatch.setattr(gpu, "report", lambda record: "")
    argv = ["gpu", "--points", "16x512,32x1024", "--compile-mode", "reduce-overhead", "--cases", "", "--out", str(tmp_path)]
    assert runner.main(argv) == 0
    assert seen["sweep_points"] == ((16, 512), (32, 1024)) and seen["compile_mode"] == "reduce-overhead" and seen["cases"] == ()


def test_model_flops_per_token_count_parameters_and_attention_span():
    """6 N + 12 L d S with S the tokens each layer attends to: the block for global layers, the window for local ones."""
    from bench.gpu import flops_per_token, throughput

    summary = {"parameters": 92_000_000, "block_size": 512,
               "model_shape": {"num_layers": 12, "hidden_size": 768, "window_size": 256, "attention_layers": ["global", "local"] * 6,
                               "position_embedding_parameters": 2048 * 768}}
    matmuls = 92_000_000 - 2048 * 768  # position embeddings are a lookup
    assert flops_per_token(summary) == 6 * matmuls + 12 * 768 * (6 * 512 + 6 * 256)
    summary["block_size"] = 128  # shorter than the window: every layer attends to the whole block
    assert flops_per_token(summary) == 6 * matmuls + 12 * 768 * 12 * 128
    assert flops_per_token({"parameters": 1, "block_size": 8, "model_shape": None}) is None, "not a GPT-neo: no MFU"
    assert throughput({"global_batch": 64, "step_time_s": 0.5}) == 128.0


def test_gpu_benchmark_refuses_a_machine_without_a_gpu_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = subprocess.run([sys.executable, "-m", "bench", "gpu"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "no GPU is visible" in result.stderr and "--allow-cpu" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_start_times_every_light_verb_on_real_input():
    """One round of `python -m bench cli_start`: every verb ran to its end (a failing one raises), and the
    figure beyond the interpreter is the verb's time less that round's bare interpreter start."""
    from bench import cli_start

    record = cli_start.run(repeat=1)
    assert set(record["verbs"]) == {"--help", "lint", "slurm script", "profiles", "report --no-files", "predict"}
    bare = record["interpreter_s"]["median"]
    for verb in record["verbs"].values():
        assert verb["minus_interpreter_s"]["median"] == pytest.approx(verb["wall_s"]["median"] - bare)
    assert "gpuscale predict" in cli_start.report(record)
