"""gpuscale doctor inside real SLURM jobs: before the training with --doctor (both launch modes), and on a
step whose binding is deliberately wrong (two tasks mapped onto one core), which it must flag."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slurm

TRAIN = 'import os; print(f"trained rank {os.environ.get(\'RANK\')}", flush=True)\n'


@pytest.mark.parametrize("mode, nodes, gpus", [("srun", 2, 1), ("torchrun", 1, 2)])
def test_submit_doctor_checks_every_rank_before_the_training(cluster, tmp_path, mode, nodes, gpus):
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    result = cluster.gpuscale("slurm", "submit", "--doctor", "--profile", "local", "--nodes", str(nodes), "--gpus-per-node", str(gpus),
                              "--mode", mode, "--wait", "--time", "5", "--output", str(tmp_path / "job-%j.out"), "--", str(train),
                              cwd=tmp_path, timeout=400)
    log = "".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert result.returncode == 0, result.stderr + log
    table = [line.split() for line in log.split("placement:\n")[1].split("\n\n")[0].splitlines()[1:]]
    assert [row[1] for row in table] == ["0", "1"]
    if nodes == 2 and cluster.layout == "two":
        assert {row[0] for row in table} == {"n1", "n2"}
    assert "busbw peak" in log and "256 MiB" in log and "doctor passed" in log
    # the training ran after the doctor, on both ranks
    assert log.index("doctor passed") < log.index("trained rank 0") and "trained rank 1" in log


WRONG_BINDING = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=5
MASTER_ADDR=$(hostname) MASTER_PORT=$((10000 + SLURM_JOB_ID % 10000))
export MASTER_ADDR MASTER_PORT
# the mistake: both tasks mapped onto core 0
srun --cpu-bind=map_cpu:0,0 bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS exec {python} -m gpuscale doctor --no-bandwidth'
echo "doctor exit code $?"
"""


def test_doctor_flags_two_srun_tasks_bound_to_one_core(cluster, tmp_path):
    script = tmp_path / "wrong.sh"
    script.write_text(WRONG_BINDING.format(python=sys.executable))
    out = tmp_path / "wrong.out"
    submitted = subprocess.run(["sbatch", "--parsable", "--wait", "--partition", "debug", "--output", str(out), str(script)],
                               env=cluster.env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    log = out.read_text() if out.exists() else ""
    assert "doctor exit code 1" in log, submitted.stderr + log
    assert "share core(s) 0 (rank 0: 0, rank 1: 0)" in log and "doctor FAILED" in log
    assert "launcher slurm" in log
