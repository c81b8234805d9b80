"""Weak scaling on CPU: the dogs-vs-cats example, 1 -> 2 processes (one core, one thread each), by `gpuscale study`.

`gpuscale study --nproc 1,2 --scaling weak --repeat R --no-predict -- examples/dogs_vs_cats.py --epochs 2
--finetune-epochs 1` (the demo's workload, rounds interleaved by the study), efficiency = samples/s at
2 processes / (2 x samples/s at 1). Target: >= 90%. On a machine with more cores: python -m bench scaling_cpu --nproc 1,2,4,8.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.stats import ROOT, launch, summary

ARGS = ["--epochs", "2", "--finetune-epochs", "1"]


def run(repeat: int = 3, nproc: str = "1,2") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "study"
        launch([sys.executable, "-m", "gpuscale", "study", "--nproc", nproc, "--scaling", "weak", "--repeat", str(repeat),
                "--no-predict", "--out", str(out), "--", str(ROOT / "examples" / "dogs_vs_cats.py"), *ARGS], timeout=3600)
        rows = json.loads((out / "results.json").read_text())["rows"]
        runs = {}
        for cell in sorted(out.glob("weak-*")):  # weak-1x2, weak-1x2.r2, ...: one directory per round
            for summary_file in sorted(cell.rglob("summary.json")):
                runs.setdefault(cell.name.split(".")[0], []).append(json.loads(summary_file.read_text())["samples_per_s"])
    return {
        "repeat": repeat, "workload": "examples/dogs_vs_cats.py " + " ".join(ARGS),
        "rows": [{k: r.get(k) for k in ("name", "samples_per_s", "speedup", "efficiency", "metric_value")} for r in rows],
        "samples_per_s_each_run": {cell: summary(values) for cell, values in runs.items()},
        "efficiency_each_round": [two / (2 * one) for one, two in zip(runs.get("weak-1x1", []), runs.get("weak-1x2", []))],
        "nproc": nproc,
        "targets": {"weak efficiency >= 90%": all((r.get("efficiency") or 0) >= 0.9 for r in rows if r["name"] != "weak-1x1")},
    }


def report(record: dict[str, Any]) -> str:
    return "\n".join(f"{r['name']:<10} {r['samples_per_s']:8.1f} samples/s  speed-up {r['speedup']:.2f}x  "
                     f"efficiency {100 * (r['efficiency'] or 0):.0f}%" for r in record["rows"])
