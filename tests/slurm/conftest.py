"""A real SLURM for the tests: the local cluster of scripts/local-slurm (two nodes, fake GPUs).

The session fixture starts it if it is not up (it needs root). Where it cannot start, the SLURM
tests are skipped with the reason, except under CI (CI=true), where SLURM tests must run: there
they fail instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIX = Path(os.environ.get("GPUSCALE_SLURM_PREFIX", "/tmp/gpuscale-slurm"))
START = ROOT / "scripts" / "local-slurm" / "start.sh"
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "OMP_NUM_THREADS", "GPUSCALE_BIND", "CUDA_VISIBLE_DEVICES")


@dataclass
class Cluster:
    env: dict[str, str]
    layout: str

    def gpuscale(self, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuscale", *args], env=self.env, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"SLURM tests must run in CI, but: {reason}")
    pytest.skip(reason)


def _read_env_file() -> dict[str, str]:
    exports = {}
    for line in (PREFIX / "env.sh").read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            exports[key] = value.strip().strip("'\"")
    return exports


def _cluster_up(env: dict[str, str]) -> bool:
    try:
        result = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    states = result.stdout.split()
    return result.returncode == 0 and bool(states) and all(s.rstrip("*") in ("idle", "mixed", "allocated", "completing") for s in states)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    base = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    base["PYTHONUNBUFFERED"] = "1"
    if not ((PREFIX / "env.sh").exists() and _cluster_up({**base, **_read_env_file()})):
        if os.geteuid() != 0:
            _unavailable("the local SLURM cluster is not running and starting it needs root (scripts/local-slurm/start.sh)")
        result = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            _unavailable(f"scripts/local-slurm/start.sh failed: {(result.stderr or result.stdout).strip().splitlines()[-1:]}")
    env = {**base, **_read_env_file()}
    if not _cluster_up(env):
        _unavailable("the local SLURM cluster started but its nodes are not usable (sinfo)")
    return Cluster(env=env, layout=env.get("GPUSCALE_SLURM_LAYOUT", "single"))
