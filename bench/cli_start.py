"""How fast the CLI answers: wall time of `gpuscale VERB ...` for verbs that neither train nor measure.

Each command runs to its end in a fresh interpreter (`python -m gpuscale ...`), round by round in
turn with a bare `python -c pass` (the interpreter's own start, which no CLI can beat); the figure is
the command's time minus that round's interpreter start, and the command's whole time beside it.
Target: each verb within 0.5 s of wall time on the project's 2-core machine. The verbs' inputs are
real: a script to lint, a two-cell study to table and predict from, a batch script to render.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import ROOT, summary
from gpuscale.study import runner
from gpuscale.study.matrix import Cell

TARGET_S = 0.5


def _inputs(folder: Path) -> dict[str, list[str]]:
    """The commands, each with real input written under `folder`."""
    (folder / "train.py").write_text((ROOT / "examples" / "dogs_vs_cats.py").read_text())
    study = folder / "study"
    study.mkdir()
    runner.record_study(study, ["train.py"], "local", [Cell("weak", 1, 1), Cell("weak", 1, 2)])
    for n, samples_per_s in ((1, 100.0), (2, 180.0)):
        (study / f"weak-1x{n}").mkdir()
        (study / f"weak-1x{n}" / "summary.json").write_text(json.dumps({
            "world_size": n, "scaling": "weak", "samples_per_s": samples_per_s, "train_time_s": 10.0, "epochs": 1,
            "global_batch": 32 * n, "per_device_batch": 32, "grad_accum_steps": 1, "steps": 10, "samples": 320 * n,
            "step_time_s": 0.32, "gradient_bytes": 4_000_000, "device": "cpu", "strategy": "ddp"}))
    return {
        "--help": ["--help"],
        "lint": ["lint", "train.py"],
        "slurm script": ["slurm", "script", "--profile", "lumi-g", "--account", "project_1", "--container",
                         "/x/lumi-pytorch-rocm.sif", "--", "train.py"],
        "profiles": ["profiles", "lumi-g"],
        "report --no-files": ["report", "study", "--no-files"],
        "predict": ["predict", "study/weak-1x1", "--profile", "lumi-g", "--nproc", "1,8", "--nodes", "1,2", "--step-time", "0.1"],
    }


def _wall(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - started
    if result.returncode not in (0, 1):  # lint exits 1 when it finds something
        raise RuntimeError(f"{' '.join(argv)} failed with exit code {result.returncode}:\n{result.stderr[-2000:]}")
    return seconds


def run(repeat: int = 9) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        commands = _inputs(folder)
        bare: list[float] = []
        wall: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(repeat):
            bare.append(_wall([sys.executable, "-c", "pass"], folder))
            for name, argv in commands.items():
                wall[name].append(_wall([sys.executable, "-m", "gpuscale", *argv], folder))
    verbs = {name: {"wall_s": summary(times), "minus_interpreter_s": summary([t - b for t, b in zip(times, bare, strict=False)])}
             for name, times in wall.items()}
    return {"repeat": repeat, "interpreter_s": summary(bare), "verbs": verbs,
            "targets": {f"{name} <= {TARGET_S} s": v["wall_s"]["median"] <= TARGET_S for name, v in verbs.items()}}


def report(record: dict[str, Any]) -> str:
    lines = [f"python -c pass        {record['interpreter_s']['median']:.3f} s"]
    for name, v in record["verbs"].items():
        wall, own = v["wall_s"], v["minus_interpreter_s"]
        lines.append(f"gpuscale {name:<17} {wall['median']:.3f} s (min {wall['min']:.3f}, max {wall['max']:.3f}); "
                     f"{own['median']:.3f} s beyond the interpreter")
    return "\n".join(lines)
