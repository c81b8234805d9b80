"""Measure the interconnect as the ring model sees it: all-reduce times over sizes, fitted to alpha and B.

    gpuscale run --nproc-per-node 2 -m gpuscale.study.linkbench link.json

Every rank all-reduces float32 tensors from 8 KiB to 32 MiB on its device (gloo on CPU, NCCL/RCCL
on GPUs), takes the median of repeated runs, and rank 0 fits T(S) = a + c * S by least squares,
so that a = 2 (N - 1) alpha and c = 2 (N - 1) / (N B) (see `gpuscale.study.predict`). The fit,
the raw times and the backend are written to the JSON file. `gpuscale predict --measure` and
`gpuscale study` on a machine without a profile use it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = tuple(2**k for k in range(13, 26, 2))  # 8 KiB .. 32 MiB
MIN_REPEATS, MAX_REPEATS, BUDGET_S = 5, 50, 0.5


def fit(sizes: list[float], seconds: list[float], world_size: int) -> tuple[float, float]:
    """(latency alpha in s, bandwidth B in bytes/s) from all-reduce times.

    Least squares on relative errors (weights 1/t^2), so that the small and middle sizes where
    gradients of real models fall are fitted as well as the largest one.
    """
    weights = [1.0 / t**2 for t in seconds]
    total = sum(weights)
    mean_s = sum(w * s for w, s in zip(weights, sizes)) / total
    mean_t = sum(w * t for w, t in zip(weights, seconds)) / total
    slope = sum(w * (s - mean_s) * (t - mean_t) for w, s, t in zip(weights, sizes, seconds)) / \
        sum(w * (s - mean_s) ** 2 for w, s in zip(weights, sizes))
    intercept = max(mean_t - slope * mean_s, 0.0)
    steps = 2 * (world_size - 1)
    return intercept / steps, steps / world_size / slope


class MeasureError(RuntimeError):
    """The interconnect benchmark did not run to its end."""


def measure_local(out: Path, nproc: int = 2, cores: list[int] | None = None, timeout_s: float = 120) -> dict:
    """Run the benchmark with `nproc` processes on this node (bound to `cores` if given); its JSON."""
    argv = [sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", str(nproc), "-m", "gpuscale.study.linkbench", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    if result.returncode != 0 or not out.is_file():
        raise MeasureError(f"measuring the interconnect failed (exit code {result.returncode}): {result.stderr.strip()[-500:]}")
    return json.loads(out.read_text())


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    import gpuscale
    from gpuscale.files import atomic_write_json

    if len(argv) != 1:
        print("usage: gpuscale run --nproc-per-node N -m gpuscale.study.linkbench OUT.json", file=sys.stderr)
        return 2
    with gpuscale.init() as rt:
        if not rt.is_distributed:
            print("linkbench: needs at least 2 processes (gpuscale run --nproc-per-node 2 ...)", file=sys.stderr)
            return 2
        times = []
        for size in SIZES:
            tensor = torch.ones(size // 4, dtype=torch.float32, device=rt.device)
            for _ in range(3):
                dist.all_reduce(tensor)
            samples: list[float] = []
            while len(samples) < MIN_REPEATS or (len(samples) < MAX_REPEATS and sum(samples) < BUDGET_S):
                rt.barrier()
                if rt.device.type == "cuda":
                    torch.cuda.synchronize(rt.device)
                start = time.perf_counter()
                dist.all_reduce(tensor)
                if rt.device.type == "cuda":
                    torch.cuda.synchronize(rt.device)
                # every rank stops its clock; the slowest rank's time is the collective's
                elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=rt.device)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                samples.append(float(elapsed.item()))
            times.append(statistics.median(samples))
        alpha, bandwidth = fit([float(s) for s in SIZES], times, rt.world_size)
        if rt.is_main:
            atomic_write_json(Path(argv[0]), {
                "world_size": rt.world_size, "backend": rt.backend, "device": rt.device.type,
                "latency_s": alpha, "bandwidth_bytes_per_s": bandwidth,
                "sizes_bytes": list(SIZES), "seconds": times,
            })
            print(f"all-reduce over {rt.world_size} ranks ({rt.backend}): latency {alpha * 1e6:.1f} us per ring step, "
                  f"bandwidth {bandwidth / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
