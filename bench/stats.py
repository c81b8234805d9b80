"""Medians and spreads of repeated measurements, machine facts, and the JSON record every benchmark writes."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def summary(values: list[float]) -> dict[str, float]:
    """Median, min, max and the spread (max - min) / median of repeated measurements."""
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / median if median else 0.0, "n": len(values)}


def machine() -> dict[str, Any]:
    import torch

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": len(os.sched_getaffinity(0)), "cpu": cpu, "python": platform.python_version(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def write(name: str, record: dict[str, Any], out_dir: Path) -> Path:
    """OUT_DIR/NAME.json: the record with the machine it ran on, whole or not at all (a reader, or a kill while it
    writes, never sees half a file: `bench gpu` rewrites its record after every run it makes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    beside = path.with_name(f".{path.name}.tmp")
    beside.write_text(json.dumps({"benchmark": name, "machine": machine(), **record}, indent=2) + "\n")
    os.replace(beside, path)
    return path


def examples_on_path() -> None:
    """Put the checkout's examples/ on sys.path (once), so a benchmark can import an example's model and kernels."""
    where = str(ROOT / "examples")
    if where not in sys.path:
        sys.path.insert(0, where)


def launch(argv: list[str], timeout: float = 600, env: dict[str, str] | None = None) -> float:
    """Run a command to its end (raising with its output if it fails); the wall-clock time just before it started."""
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                             "OMP_NUM_THREADS", "GPUSCALE_BIND")}
    clean.update(env or {})
    started = time.time()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=clean, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with exit code {result.returncode}:\n{result.stderr[-3000:]}")
    return started


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
GPUSCALE_RUN = [sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", "2"]
