"""The interconnect's figures for the prediction, from the benchmark `gpuscale.study.linkbench` runs in its ranks.

`measure_local` starts that benchmark on this node (`gpuscale run -m gpuscale.study.linkbench`) and
reads its JSON; `fit` turns its times into the ring model's latency and bandwidth. No torch here:
the study's planner and `gpuscale predict` import this module, and only the ranks import torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["MeasureError", "fit", "measure_local"]


def fit(sizes: list[float], seconds: list[float], world_size: int) -> tuple[float, float]:
    """(latency alpha in s, bandwidth B in bytes/s) from all-reduce times.

    Least squares on relative errors (weights 1/t^2), so that the small and middle sizes where
    gradients of real models fall are fitted as well as the largest one.
    """
    weights = [1.0 / t**2 for t in seconds]
    total = sum(weights)
    mean_s = sum(w * s for w, s in zip(weights, sizes, strict=True)) / total
    mean_t = sum(w * t for w, t in zip(weights, seconds, strict=True)) / total
    slope = sum(w * (s - mean_s) * (t - mean_t) for w, s, t in zip(weights, sizes, seconds, strict=True)) / \
        sum(w * (s - mean_s) ** 2 for w, s in zip(weights, sizes, strict=True))
    intercept = max(mean_t - slope * mean_s, 0.0)
    steps = 2 * (world_size - 1)
    return intercept / steps, steps / world_size / slope


class MeasureError(RuntimeError):
    """The interconnect benchmark did not run to its end."""


def measure_local(out: Path, nproc: int = 2, cores: list[int] | None = None, timeout_s: float = 120) -> dict:
    """Run the benchmark with `nproc` processes on this node (bound to `cores` if given); its JSON."""
    argv = [sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", str(nproc), "-m", "gpuscale.study.linkbench", str(out)]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    except subprocess.TimeoutExpired:
        raise MeasureError(f"measuring the interconnect did not finish within {timeout_s:.0f} s") from None
    if result.returncode != 0 or not out.is_file():
        raise MeasureError(f"measuring the interconnect failed (exit code {result.returncode}): {result.stderr.strip()[-500:]}")
    return json.loads(out.read_text())
