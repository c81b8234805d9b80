"""A rank that dies inside a SLURM job ends the job quickly, in both launch modes, with the culprit named first, and
the job's exit code is that rank's own (srun returns its tasks' highest, a victim's 143)."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from slurm_helpers import ROOT

pytestmark = pytest.mark.slurm
DIE = str(ROOT / "tests" / "multiproc" / "scripts" / "die.py")
BOUND_S = 60


def _job(cluster, job: str) -> dict[str, str]:
    line = subprocess.run(["scontrol", "show", "job", "-o", job], env=cluster.env, capture_output=True, text=True, timeout=30).stdout
    return dict(field.split("=", 1) for field in line.split() if "=" in field)


@pytest.mark.parametrize("mode, nodes, gpus", [("srun", "2", "1"), ("srun", "1", "2"), ("torchrun", "1", "2")])
def test_a_failing_rank_ends_the_job_within_a_minute(cluster, tmp_path, mode, nodes, gpus):
    result = cluster.gpuscale("slurm", "submit", "--profile", "local", "--wait", "--time", "10", "--mode", mode, "--nodes", nodes,
                              "--gpus-per-node", gpus, "--output", str(tmp_path / "job-%j.out"), "--", DIE, "raise",
                              cwd=tmp_path, timeout=BOUND_S + 300)
    logs = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert result.returncode != 0 and "FAILED" in result.stderr, result.stderr + logs
    job = result.stdout.strip().split()[-1]
    fields = _job(cluster, job)
    assert fields["ExitCode"] == "1:0", (fields["ExitCode"], logs)  # rank 1's own exit code, not a victim's 143
    runtime = fields["RunTime"]  # from start, not from submission
    hours, minutes, seconds = (int(x) for x in runtime.split(":"))
    assert hours * 3600 + minutes * 60 + seconds < BOUND_S, f"the job ran {runtime} before it ended"
    failures = [line for line in logs.splitlines() if line.startswith("[gpuscale] rank") and ("failed" in line or "stopped" in line)]
    hosts = ["n2"] if mode == "srun" and nodes == "2" else ["n1", "n2"]  # srun 2 x 1: rank 1 is the task on the second node
    assert failures[0] in [f"[gpuscale] rank 1/2 on {host} failed: planted failure on rank 1" for host in hosts], logs
    if mode == "srun":  # srun's own code: 143 when it ended a peer first, 1 when both tasks were out already
        assert re.search(r"^gpuscale: rank 1 failed first, with exit code 1 \(srun: (1|143)\); the job ends with 1$", logs, re.M), logs


@pytest.mark.parametrize("nodes, gpus", [("2", "1"), ("1", "2")])
def test_a_rank_that_exits_75_before_its_peers_ends_the_job_with_75_and_requeues_it(cluster, tmp_path, nodes, gpus):
    """EX_TEMPFAIL from one rank, in srun mode: the job's code is that 75, not the 143 of the peers srun ended, and
    the batch script requeues the job on it (no side file involved: the script does not use StopSignal)."""
    result = cluster.gpuscale("slurm", "submit", "--profile", "local", "--time", "10", "--mode", "srun", "--nodes", nodes,
                              "--gpus-per-node", gpus, "--output", str(tmp_path / "job-%j.out"), "--", DIE, "requeue",
                              cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    job = result.stdout.strip().split()[-1]

    def logs() -> str:
        return "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))

    deadline = time.monotonic() + BOUND_S + 60
    while _job(cluster, job).get("Restarts") != "1":
        assert time.monotonic() < deadline, f"the job did not requeue itself\n{logs()}"
        time.sleep(0.5)
    subprocess.run(["scancel", job], env=cluster.env, timeout=30, check=True)  # its second run is not this test's
    text = logs()
    assert "gpuscale: rank 1 failed first, with exit code 75" in text, text
    assert f"requeueing job {job} (restart 1 of at most 10)" in text, text
