"""Per-step overhead: the same model, data and loop in plain PyTorch DDP, Accelerate and gpuscale, 2 CPU processes.

Each round launches every variant once under the same bare torchrun, in an order that rotates from
round to round (so a slow minute of this VM hits each variant alike), and reads its steady step time
(steps after the warm-up). The ratios gpuscale / plain and gpuscale / Accelerate are taken within
each round and their medians reported. `gpuscale (bind none)` is gpuscale with its CPU binding
switched off, to tell the binding's share from the rest of gpuscale. `plain (probe)` is the plain
DDP loop with gpuscale's probe loaded in each rank, as `gpuscale run` and every study cell load it
(`gpuscale.measure.probe`: hooks on optimizer steps and DataLoader iterators, a record at exit). Targets:
gpuscale within 2% of plain PyTorch, never slower than Accelerate, and the probe within 1% of plain.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.stats import ROOT, TORCHRUN, launch, summary
from gpuscale.measure.probe import probe_environ, read_records

VARIANTS = {
    "plain": ("plain_ddp.py", {}),
    "accelerate": ("accelerate_ddp.py", {}),
    "gpuscale": ("gpuscale_ddp.py", {}),
    "gpuscale (bind none)": ("gpuscale_ddp.py", {"GPUSCALE_BIND": "none"}),
    "plain (probe)": ("plain_ddp.py", {"GPUSCALE_PROBE_DIR": ""}),  # the folder is made per round
}


def run(repeat: int = 5, steps: int = 220, warmup: int = 20) -> dict[str, Any]:
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(repeat):
            order = names[round_ % len(names):] + names[: round_ % len(names)]
            for name in order:
                script, env = VARIANTS[name]
                out = Path(tmp) / f"{round_}-{name.replace(' ', '_')}.json"
                if "GPUSCALE_PROBE_DIR" in env:
                    env = probe_environ(Path(tmp) / f"probe-{round_}")
                launch([*TORCHRUN, str(ROOT / "bench" / "loops" / script), str(out), str(steps), str(warmup)], env=env)
                times[name].append(json.loads(out.read_text())["step_s"])
                if "GPUSCALE_PROBE_DIR" in env:  # the probe really rode along: it counted every step of both ranks
                    records = read_records(env["GPUSCALE_PROBE_DIR"])
                    assert len(records) == 2 and all(r["optimizers"][0]["steps"] >= steps for r in records), records
    paired = {
        "gpuscale / plain": [g / p for g, p in zip(times["gpuscale"], times["plain"], strict=False)],
        "gpuscale / accelerate": [g / a for g, a in zip(times["gpuscale"], times["accelerate"], strict=False)],
        "gpuscale (bind none) / plain": [g / p for g, p in zip(times["gpuscale (bind none)"], times["plain"], strict=False)],
        "plain (probe) / plain": [g / p for g, p in zip(times["plain (probe)"], times["plain"], strict=False)],
    }
    return {
        "repeat": repeat, "steps": steps, "warmup": warmup,
        "step_ms": {name: summary([t * 1e3 for t in values]) for name, values in times.items()},
        "ratios": {name: summary(values) for name, values in paired.items()},
        "targets": {"gpuscale / plain <= 1.02": statistics.median(paired["gpuscale / plain"]) <= 1.02,
                    "gpuscale / accelerate <= 1.0": statistics.median(paired["gpuscale / accelerate"]) <= 1.0,
                    "plain (probe) / plain <= 1.01": statistics.median(paired["plain (probe) / plain"]) <= 1.01},
        "raw_step_s": times,
    }


def report(record: dict[str, Any]) -> str:
    lines = [f"{name:<22} {s['median']:7.2f} ms/step (min {s['min']:.2f}, max {s['max']:.2f}, spread {s['spread']:.0%})"
             for name, s in record["step_ms"].items()]
    lines += [f"{name:<30} {s['median']:.3f} (min {s['min']:.3f}, max {s['max']:.3f})" for name, s in record["ratios"].items()]
    return "\n".join(lines)
