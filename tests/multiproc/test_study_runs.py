"""`gpuscale study`, `report` and `predict` with real runs of 1 and 2 processes over gloo on this machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from procs import ROOT, SCRIPTS, assert_ok, clean_env, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc

MLP = str(SCRIPTS / "mlp_scaling.py")
# 150 steps of 128 samples: a 4 MB gradient all-reduce against 10-20 ms of compute per step
MLP_ARGS = (MLP, "--steps", "150", "--hidden", "640", "--batch-size", "128")
TOLERANCE = 0.15


def _table(stdout: str) -> str:
    """The table (header to the blank line before the report path) from a command's output."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"run +scaling ", line))  # not a wrapped "run beyond ..."
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("report:")), len(lines))
    return "\n".join(lines[start:end]).strip()


@pytest.fixture(scope="module")
def mlp_study(tmp_path_factory):
    """One weak+strong study of the MLP workload on 1 and 2 processes, each cell 3 times (about two minutes).

    This VM's speed drifts by 10-30% within minutes (other tenants); the median of three runs in
    rounds is what a measurement on it can honestly be.
    """
    out = tmp_path_factory.mktemp("study") / "mlp"
    # --overlap 0, the model's default on CPUs, given: the study would otherwise calibrate the overlap on these very
    # runs (gpuscale.study.calibrate), and the test of the model against measurement would check itself
    result = run(gpuscale_cmd("study", "--nproc", "1,2", "--scaling", "weak,strong", "--repeat", "3", "--overlap", "0",
                              "--out", str(out), "--", *MLP_ARGS), timeout=600)
    assert_ok(result)
    return out, result


def test_every_cell_really_ran_with_its_processes_and_cores(mlp_study):
    out, result = mlp_study
    # on one process weak and strong train the same batches: strong-1x1 (and each repeat) takes weak-1x1's run
    for r in ("", ".r2", ".r3"):
        assert (out / f"strong-1x1{r}" / "same-as").read_text().strip() == f"weak-1x1{r}"
        assert not (out / f"strong-1x1{r}" / "summary.json").exists()
    assert result.stdout.count("the same experiment as weak-1x1") == 3
    for name, world, scaling, global_batch in [("weak-1x1", 1, "weak", 128), ("weak-1x2", 2, "weak", 256),
                                               ("strong-1x2", 2, "strong", 128)]:
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["world_size"] == world and summary["scaling"] == scaling
        assert summary["global_batch"] == global_batch
        assert [p["rank"] for p in summary["placements"]] == list(range(world))
        # CPU: one process per core in every cell, so 1 vs 2 processes is 1 vs 2 "devices"
        assert all(len(p["cores"]) == 1 for p in summary["placements"])
        assert len({tuple(p["cores"]) for p in summary["placements"]}) == world
        assert summary["steps"] == 150 and summary["gradient_bytes"] > 1_000_000
        assert (out / name / "output.log").read_text().startswith("$ ")
    assert "[12/12] strong-1x2" in result.stdout and "report:" in result.stdout
    assert all((out / f"{name}.r{r}" / "summary.json").is_file() for name in ("weak-1x2", "strong-1x2") for r in (2, 3))
    for name in ("report.md", "report.html", "results.json", "link.json"):
        assert (out / name).is_file(), name


def test_speedup_and_efficiency_come_from_the_measurements(mlp_study):
    out, _ = mlp_study
    results = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in results["rows"]}
    summaries = {n: json.loads((out / (rows[n]["same_as"] or rows[n]["run"]) / "summary.json").read_text()) for n in rows}
    for row in rows.values():  # the row is the median of its three runs
        assert row["repeats"] == 3 and row["samples_per_s"] == sorted(row["samples_per_s_runs"])[1]
    assert rows["weak-1x2"]["speedup"] == pytest.approx(summaries["weak-1x2"]["samples_per_s"] / summaries["weak-1x1"]["samples_per_s"])
    # strong scaling: the same basis as weak (throughput), the one the prediction models; time to result beside it
    assert rows["strong-1x2"]["speedup"] == pytest.approx(summaries["strong-1x2"]["samples_per_s"] / summaries["strong-1x1"]["samples_per_s"])
    assert rows["strong-1x2"]["time_speedup"] == pytest.approx(
        summaries["strong-1x1"]["time_to_result_s"] / summaries["strong-1x2"]["time_to_result_s"])
    for row in rows.values():
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["world_size"])
        assert sum(row["loss_breakdown"].values()) == pytest.approx(1 - row["efficiency"])


def _half_spread(row: dict) -> float:
    """Half the range of a row's repeated throughputs, as a share of their median."""
    runs = row["samples_per_s_runs"]
    return (max(runs) - min(runs)) / 2 / row["samples_per_s"]


def test_prediction_agrees_with_measurement_within_15_percent(mlp_study):
    """The ring all-reduce model, fed with the 1-process runs and the measured gloo link, against the 2-process runs."""
    out, _ = mlp_study
    results = json.loads((out / "results.json").read_text())
    assert results["prediction"]["link"]["source"].startswith("measured (gloo")
    report = []
    for row in results["rows"]:
        error = row["predicted_samples_per_s"] / row["samples_per_s"] - 1
        report.append(f"{row['name']}: measured {row['samples_per_s']:.0f}, predicted {row['predicted_samples_per_s']:.0f} ({100 * error:+.0f}%)")
    print("\n".join(report))
    rows = {r["name"]: r for r in results["rows"]}
    for row in results["rows"]:
        # 15% of model error, plus the noise this machine showed in this study: half the spread of the row's own
        # three runs and of the 1-process runs the prediction starts from (2-core VMs drift by 10% within minutes)
        baseline = rows[f"{row['scaling']}-1x1"]
        noise = _half_spread(row) + (_half_spread(baseline) if baseline is not row else 0.0)
        error = abs(row["predicted_samples_per_s"] / row["samples_per_s"] - 1)
        assert error <= TOLERANCE + noise, f"{row['name']}: allowed {TOLERANCE:.2f} + noise {noise:.2f}\n" + "\n".join(report)
    # the all-reduce is a real share of the 2-process step here, so the agreement is not just "no communication"
    two = next(c for c in results["prediction"]["cells"] if c["name"] == "weak-1x2")
    assert two["comm_s"] > 0.1 * two["compute_s"]


def test_report_reproduces_the_table_from_the_saved_json(mlp_study):
    out, result = mlp_study
    again = run(gpuscale_cmd("report", str(out)))
    assert_ok(again)
    assert _table(again.stdout) == _table(result.stdout)
    assert "weak-1x2" in _table(again.stdout)


def test_a_rerun_skips_finished_cells_and_more_cells_extend_the_study(mlp_study, tmp_path):
    out, _ = mlp_study
    before = {n: (out / n / "summary.json").stat().st_mtime for n in ("weak-1x1", "weak-1x2")}
    again = run(gpuscale_cmd("study", "--nproc", "1,2", "--scaling", "weak", "--no-predict", "--out", str(out), "--",
                             *MLP_ARGS), timeout=120)
    assert_ok(again)
    assert again.stdout.count("finished before, skipped") == 2
    assert {n: (out / n / "summary.json").stat().st_mtime for n in before} == before
    other = run(gpuscale_cmd("study", "--nproc", "1", "--out", str(out), "--", MLP, "--steps", "3"), timeout=120)
    assert other.returncode == 2 and "holds a study of" in other.stderr and "another --out" in other.stderr


def test_a_failing_cell_is_reported_and_the_rest_are_kept(tmp_path):
    script = tmp_path / "fails_on_two.py"
    script.write_text(
        "import os, sys\n"
        "import gpuscale  # it runs a gpuscale script, so the study gives it --scaling and --out\n"
        f"sys.argv[0] = {MLP!r}\n"
        "if os.environ.get('WORLD_SIZE') == '2' and not os.path.exists(os.environ['FIXED']):\n"
        "    sys.exit('broken on two ranks')\n"
        f"exec(open({MLP!r}).read())\n"
    )
    out = tmp_path / "study"
    fixed = tmp_path / "fixed"
    args = gpuscale_cmd("study", "--nproc", "1,2", "--scaling", "weak", "--no-predict", "--out", str(out), "--", str(script), "--steps", "3")
    first = run(args, timeout=300, FIXED=str(fixed))
    assert first.returncode == 1
    assert "weak-1x2" in first.stdout and "FAILED" in first.stdout and "broken on two ranks" in first.stdout
    assert "1 of 2 runs failed: weak-1x2" in first.stdout
    assert (out / "weak-1x1" / "summary.json").is_file() and not (out / "weak-1x2" / "summary.json").exists()
    fixed.touch()
    second = run(args, timeout=300, FIXED=str(fixed))
    assert_ok(second)
    assert "weak-1x1 (weak scaling, 1 node x 1 process): finished before, skipped" in second.stdout
    assert (out / "weak-1x2" / "summary.json").is_file()


def test_a_script_that_writes_no_summary_gets_told_what_is_missing(tmp_path):
    script = tmp_path / "no_summary.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--scaling')\np.add_argument('--out')\np.parse_args()\n")
    result = run(gpuscale_cmd("study", "--nproc", "1", "--scaling", "weak", "--out", str(tmp_path / "s"), "--", str(script)), timeout=120)
    assert result.returncode == 1
    assert "no rank left a probe record" in result.stdout and "the script never imported torch" in result.stdout
    assert "must accept --scaling and --out" in result.stdout and "write_summary" in result.stdout


def test_a_gpuscale_script_that_takes_no_step_and_writes_no_summary_is_told_both_ways(tmp_path):
    script = tmp_path / "imports_only.py"
    script.write_text("import argparse\nimport gpuscale\nimport torch\np = argparse.ArgumentParser()\np.add_argument('--scaling')\n"
                      "p.add_argument('--out')\np.parse_args()\n")
    result = run(gpuscale_cmd("study", "--nproc", "1", "--scaling", "weak", "--out", str(tmp_path / "s"), "--", str(script)), timeout=120)
    assert result.returncode == 1
    assert "no optimizer step was taken" in result.stdout and "write_summary" in result.stdout


def test_the_readmes_ten_line_script_is_told_to_take_out_after_its_first_cell(tmp_path):
    """The README's script writes its summary into runs/mine, whatever --out says: the study runs one cell, says
    what the script must do, and runs no other cell (each would fail the same way)."""
    code = re.search(r"Save this as `train.py`:\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    script = tmp_path / "train.py"
    mine = tmp_path / "mine"  # where it writes its summary: not into the checkout the test runs in
    script.write_text(code.replace("4096", "256").replace("range(3)", "range(1)").replace('"runs/mine"', repr(str(mine))))
    out = tmp_path / "study"
    result = run(gpuscale_cmd("study", "--nproc", "1,2", "--scaling", "weak,strong", "--no-predict", "--out", str(out), "--",
                              str(script)), timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert ("weak-1x1 (weak scaling, 1 node x 1 process): FAILED" in result.stdout
            and "the script measures itself with gpuscale.Meter but wrote no" in result.stdout
            and "its write_summary must take the cell's folder from --out" in result.stdout), result.stdout
    assert "the study runs no more cells that would fail the same way" in result.stdout
    assert "[2/4] weak-1x2 (weak scaling, 1 node x 2 processes): not run: it would fail as weak-1x1 did" in result.stdout
    assert "1 of 4 runs failed: weak-1x1; 3 not run: weak-1x2, strong-1x1, strong-1x2" in result.stdout
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["weak-1x1"]  # no other cell ran
    assert (mine / "summary.json").is_file()  # the run itself went well: its summary is where the script put it


def test_bad_study_input_is_one_line(tmp_path):
    for args, message in [
        (["--nproc", "1,two", "--out", str(tmp_path), "--", MLP], "--nproc '1,two' is not a comma-separated list"),
        (["--nodes", "1,2", "--out", str(tmp_path), "--", MLP], "--nodes 1,2 needs --launcher slurm"),
        (["--out", str(tmp_path), "--", "missing.py"], "script 'missing.py' does not exist"),
        (["--out", str(tmp_path), "--", MLP, "--out", "x"], "leave --out and --scaling out"),
        (["--launcher", "slurm", "--out", str(tmp_path), "--", MLP], "--launcher slurm needs --profile"),
        (["--nproc", f"1,{len(os.sched_getaffinity(0)) + 1}", "--out", str(tmp_path), "--", MLP], "needs a core of its own"),
    ]:
        result = run(gpuscale_cmd("study", *args), timeout=60)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_predict_from_a_single_process_run(mlp_study):
    """A CPU run's step says nothing about LUMI's GPUs: refused in one line, projected with one GPU's step time given."""
    out, _ = mlp_study
    args = ("predict", str(out / "weak-1x1"), "--profile", "lumi-g", "--nproc", "1,2,4,8", "--nodes", "1,2")
    refused = run(gpuscale_cmd(*args))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "weak-1x1 ran on a CPU, but profile lumi-g has AMD GPUs" in refused.stderr and "--step-time SECONDS" in refused.stderr
    result = run(gpuscale_cmd(*args, "--step-time", "0.02"))
    assert_ok(result)
    measured = json.loads((out / "weak-1x1" / "summary.json").read_text())["step_time_s"]
    assert result.stdout.startswith(f"baseline: {out / 'weak-1x1'}, 1 CPU process (its gradients and batch); 20 ms per step")
    assert f"(given with --step-time; the run measured {1e3 * measured:.3g} ms)" in result.stdout.splitlines()[0]
    assert "interconnect: profile lumi-g" in result.stdout
    for name in ("weak-1x8", "strong-2x8"):
        assert name in result.stdout
    assert "2x8: below" in result.stdout and "samples per device, a step communicates longer than it computes" in result.stdout
    refused = run(gpuscale_cmd("predict", str(out / "weak-1x2"), "--profile", "lumi-g"))
    assert refused.returncode == 2 and "starts from a single-device run" in refused.stderr


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """gpuscale as `pip install gpuscale` gives it: a wheel built from this repository, installed in a new venv.

    The venv sees this machine's torch and the other dependencies (--system-site-packages), not the
    checkout: the wheel's own gpuscale comes first on its path, and commands run outside the checkout.
    """
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in ("src", "examples"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".", "-w", str(root / "dist")],
                           cwd=source, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    wheel = next((root / "dist").glob("gpuscale-*.whl"))
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv


def _run_installed(venv: Path, args: list[str], cwd: Path, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    environ = clean_env(**env)
    environ.pop("PYTHONPATH", None)  # nothing of the checkout
    return subprocess.run([str(venv / "bin" / "gpuscale"), *args], env=environ, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_the_wheel_carries_the_examples(installed_wheel, tmp_path):
    result = _run_installed(installed_wheel, ["demo", "--examples"], tmp_path, 120)
    assert_ok(result)
    folder = Path(result.stdout.strip())
    assert folder.is_relative_to(installed_wheel) and folder.name == "examples"
    assert {p.name for p in folder.glob("*.py")} == {p.name for p in (ROOT / "examples").glob("*.py")}


@pytest.mark.skipif(os.cpu_count() < 2, reason="the demo compares 1 and 2 processes")
def test_demo_prints_weak_and_strong_scaling_and_writes_the_report(installed_wheel, tmp_path):
    """The README's first command, from a wheel installed in a new venv, outside any checkout."""
    out = tmp_path / "demo"
    result = _run_installed(installed_wheel, ["demo", "--out", str(out)], tmp_path, 600,
                            GPUSCALE_DATA=str(tmp_path / "data"))  # fresh: generates its images
    assert_ok(result)
    assert str(installed_wheel) in (out / "none-weak-1x1" / "output.log").read_text().splitlines()[0], "the wheel's example ran"
    table = _table(result.stdout)
    names = {f"{rule}-{scaling}-1x{n}" for rule in ("none", "linear") for scaling in ("weak", "strong") for n in (1, 2)}
    for name in names:
        assert name in table
    assert "speed-up" in table and "efficiency" in table and "accuracy" in table and "time to result" in table
    assert "Why not more" in table and "none-weak-1x2: " in table and "lr rule" in table
    results = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in results["rows"]}
    assert set(rows) == names
    assert all(r["metric"] == "accuracy" and r["metric_value"] > 0.6 for r in rows.values())
    # the rule each run used, with its factor: x2 only where weak scaling doubled the global batch
    assert rows["linear-weak-1x2"]["lr"]["rule"] == "linear" and rows["linear-weak-1x2"]["lr"]["factor"] == 2
    assert rows["linear-strong-1x2"]["lr"]["factor"] == 1 and rows["none-weak-1x2"]["lr"]["factor"] == 1
    # the linear rule keeps weak scaling's accuracy within 2 points of one process (the demo's story)
    assert rows["linear-weak-1x1"]["metric_value"] - rows["linear-weak-1x2"]["metric_value"] <= 0.02
    for name in ("none-weak-1x2", "linear-weak-1x2", "none-strong-1x2"):
        assert rows[name]["sync_probe"]["status"] == "measured"
        assert sum(rows[name]["loss_breakdown"].values()) == pytest.approx(1 - rows[name]["efficiency"])
    # the answer first, above the table: one sentence per scaling, with the cost, a recommendation and the scales not run
    header = re.search(r"^run +scaling ", result.stdout, re.M)  # the table's header ("run beyond ..." may start a line too)
    answer = " ".join(result.stdout[:header.start()].split())  # the terminal wraps its lines
    for scaling in ("Strong scaling (none)", "Weak scaling (none)", "Strong scaling (linear)", "Weak scaling (linear)"):
        assert f"{scaling} to 2 processes: " in answer, scaling
    assert answer.count("the device-hours per sample") == 4 and answer.count("75% target") == 4
    assert answer.count("Predicted, not run") == 4 and "8 processes" in answer
    assert "device-h/1M samples" in table and "cost/sample" in table
    # one run stands for both one-process baselines of each variant, and the table says so
    for rule in ("none", "linear"):
        assert rows[f"{rule}-strong-1x1"]["same_as"] == f"{rule}-weak-1x1"
        assert f"{rule}-strong-1x1 (= {rule}-weak-1x1)" in table
        assert not (out / f"{rule}-strong-1x1" / "output.log").exists()
    # no part of the loss is shown negative but the rest (the measured parts' overshoot, which keeps each line's sum
    # equal to its loss) and the sum of the parts that read ~0%, where it is said; each flag's cause once
    why = " ".join(table[table.index("Why not more"):table.index("Flags:")].split())
    said = r"rest \(unexplained\) -\d+%|Its rest \(-\d+%\)|the parts that read ~0% measured -\d+% together"
    assert not re.search(r"\s-\d+%", re.sub(said, "", why)), why
    flags = [line for line in table[table.index("Flags:"):].splitlines()[1:] if line.startswith("  ") and ": " in line]
    advice = [line.rsplit(": ", 1)[1] for line in flags]
    assert len(advice) == len(set(advice)), flags
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 4 and 'data-plot="waterfall-' in html
    assert 'id="answer"' in html and 'data-plot="cost"' in html
    # `gpuscale report` gives the same table from the saved JSON
    again = run(gpuscale_cmd("report", str(out), "--no-files"))
    assert_ok(again)
    assert _table(again.stdout) == table


def test_a_ddp_script_without_a_dataloader_is_studied_with_samples_per_s(tmp_path):
    """nanoGPT's way of feeding batches: the probe counts the samples the DDP model trained on (30 steps of 8 per
    rank, the evaluations left out) and says so; the cells' throughput is samples over training time."""
    script = str(SCRIPTS / "memmap_batches.py")
    out = tmp_path / "study"
    result = run(gpuscale_cmd("study", "--nproc", "1,2", "--scaling", "weak", "--no-predict", "--out", str(out), "--",
                              script, "--steps", "30", "--batch-size", "8"), timeout=300)
    assert_ok(result)
    for world in (1, 2):
        summary = json.loads((out / f"weak-1x{world}" / "summary.json").read_text())
        assert summary["samples"] == 30 * 8 * world and summary["samples_from"] == "model inputs"
        assert summary["steps"] == 30 and summary["per_device_batch"] == 8 and summary["global_batch"] == 8 * world
        assert summary["samples_per_s"] == pytest.approx(summary["samples"] / summary["train_time_s"])
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["weak-1x2"]["samples_per_s"] > 0 and rows["weak-1x2"]["efficiency"] is not None
