"""Weak scaling on CPU: the dogs-vs-cats example, 1 -> 2 processes (one core, one thread each), by `gpuscale study`.

`gpuscale study --nproc 1,2 --scaling weak --repeat R --no-predict -- examples/dogs_vs_cats.py --epochs 2
--finetune-epochs 1 --batch-size B` (the demo's workload, rounds interleaved by the study), for each per-process batch B of
--batch-sizes (default 32, the course's), efficiency = samples/s at
2 processes / (2 x samples/s at 1). Target: >= 90%. On a machine with more cores: python -m bench scaling_cpu --nproc 1,2,4,8.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.stats import ROOT, launch, summary

ARGS = ["--epochs", "2", "--finetune-epochs", "1"]


def study(repeat: int, nproc: str, batch_size: int) -> dict[str, Any]:
    """One `gpuscale study` of the example at a per-process batch: its table, each run's throughput, each round's efficiency."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "study"
        launch([sys.executable, "-m", "gpuscale", "study", "--nproc", nproc, "--scaling", "weak", "--repeat", str(repeat),
                "--no-predict", "--out", str(out), "--", str(ROOT / "examples" / "dogs_vs_cats.py"), *ARGS,
                "--batch-size", str(batch_size)], timeout=3600)
        rows = json.loads((out / "results.json").read_text())["rows"]
        runs: dict[str, list[float]] = {}
        steps: dict[str, list[dict[str, float]]] = {}
        for cell in sorted(out.glob("weak-*")):  # weak-1x2, weak-1x2.r2, ...: one directory per round
            for summary_file in sorted(cell.rglob("summary.json")):
                record = json.loads(summary_file.read_text())
                runs.setdefault(cell.name.split(".")[0], []).append(record["samples_per_s"])
                if record.get("step_time_s") and record.get("steps"):
                    steps.setdefault(cell.name.split(".")[0], []).append(
                        {"step_ms": 1e3 * record["step_time_s"], **{k: v / record["steps"] * 1e3 for k, v in record["time_split_s"].items()
                                                                     if k in ("compute", "data_wait")}})
    return {
        "batch_size": batch_size,
        "rows": [{k: r.get(k) for k in ("name", "samples_per_s", "speedup", "efficiency", "metric_value")} for r in rows],
        "samples_per_s_each_run": {cell: summary(values) for cell, values in runs.items()},
        "ms_per_step_median": {cell: {k: statistics.median(s[k] for s in items) for k in items[0]} for cell, items in steps.items()},
        "efficiency_each_round": [two / (2 * one) for one, two in zip(runs.get("weak-1x1", []), runs.get("weak-1x2", []), strict=False)],
    }


def run(repeat: int = 3, nproc: str = "1,2", batch_sizes: str = "32") -> dict[str, Any]:
    studies = [study(repeat, nproc, int(b)) for b in batch_sizes.split(",")]
    return {
        "repeat": repeat, "workload": "examples/dogs_vs_cats.py " + " ".join(ARGS), "nproc": nproc,
        "studies": studies,
        "targets": {f"weak efficiency >= 90% at batch {s['batch_size']}": all((r.get("efficiency") or 0) >= 0.9 for r in s["rows"]
                                                                          if r["name"] != "weak-1x1") for s in studies},
    }


def report(record: dict[str, Any]) -> str:
    lines = []
    for s in record["studies"]:
        for r in s["rows"]:
            split = s["ms_per_step_median"].get(r["name"].split(".")[0], {})
            lines.append(f"batch {s['batch_size']:<4} {r['name']:<10} {r['samples_per_s']:8.1f} samples/s  speed-up {r['speedup']:.2f}x  "
                         f"efficiency {100 * (r['efficiency'] or 0):.0f}%  step {split.get('step_ms', 0):.1f} ms "
                         f"(compute+sync {split.get('compute', 0):.1f}, data {split.get('data_wait', 0):.1f})")
    return "\n".join(lines)
