"""Helpers for tests that start real processes talking over gloo on this machine.

(A plain module, not conftest.py: two folders' conftest modules would clash under one name.)

Every launch gets a clean environment (no launcher or SLURM variables leak in from the shell
running pytest), a free port, and a timeout, so a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
EXAMPLES = ROOT / "examples"
LAUNCHER_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "GPUSCALE_BIND", "GPUSCALE_TIMEOUT", "GPUSCALE_LAUNCH_TIME",
    "GPUSCALE_OMP_FROM_LAUNCHER", "CUDA_VISIBLE_DEVICES", "GPUSCALE_PROBE_DIR", "GPUSCALE_PROBE_OWNER", "GPUSCALE_PROBE",
    "GPUSCALE_PLACED", "GPUSCALE_RANK_CORES",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run(cmd: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a command to completion with a clean environment; fail the test if it outlives `timeout`."""
    return subprocess.run(cmd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def gpuscale_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuscale", *args]


def torchrun_cmd(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


def run_by_hand(script_args: list[str], world_size: int = 2, timeout: float = 300, **env: str) -> list[subprocess.CompletedProcess[str]]:
    """Start `world_size` processes with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by hand."""
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, *script_args],
            env=clean_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for r in range(world_size)
    ]
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def read_ranks(directory: Path, world_size: int) -> list[dict]:
    files = sorted(directory.glob("rank*.json"))
    assert len(files) == world_size, f"expected {world_size} rank reports, found {[f.name for f in files]}"
    return [json.loads(f.read_text()) for f in files]


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\nSTDOUT:\n{result.stdout[-4000:]}\nSTDERR:\n{result.stderr[-4000:]}"


