"""A rank that dies inside a SLURM job ends the job quickly, in both launch modes, with the culprit named first."""

from __future__ import annotations

import subprocess

import pytest

from slurm_helpers import ROOT

pytestmark = pytest.mark.slurm
DIE = str(ROOT / "tests" / "multiproc" / "scripts" / "die.py")
BOUND_S = 60


@pytest.mark.parametrize("mode, nodes, gpus", [("srun", "2", "1"), ("torchrun", "1", "2")])
def test_a_failing_rank_ends_the_job_within_a_minute(cluster, tmp_path, mode, nodes, gpus):
    result = cluster.gpuscale("slurm", "submit", "--profile", "local", "--wait", "--time", "10", "--mode", mode, "--nodes", nodes,
                              "--gpus-per-node", gpus, "--output", str(tmp_path / "job-%j.out"), "--", DIE, "raise",
                              cwd=tmp_path, timeout=BOUND_S + 300)
    logs = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert result.returncode != 0 and "FAILED" in result.stderr, result.stderr + logs
    job = result.stdout.strip().split()[-1]
    line = subprocess.run(["scontrol", "show", "job", "-o", job], env=cluster.env, capture_output=True, text=True, timeout=30).stdout
    runtime = next(f.split("=", 1)[1] for f in line.split() if f.startswith("RunTime="))  # from start, not from submission
    hours, minutes, seconds = (int(x) for x in runtime.split(":"))
    assert hours * 3600 + minutes * 60 + seconds < BOUND_S, f"the job ran {runtime} before it ended"
    failures = [line for line in logs.splitlines() if line.startswith("[gpuscale] rank") and ("failed" in line or "stopped" in line)]
    hosts = ["n2"] if mode == "srun" else ["n1", "n2"]  # srun: rank 1 is the task on the second node
    assert failures[0] in [f"[gpuscale] rank 1/2 on {host} failed: planted failure on rank 1" for host in hosts], logs
