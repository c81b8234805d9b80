"""gpuscale doctor inside real SLURM jobs: before the training with --doctor (both launch modes), on a
step whose binding is deliberately wrong (two tasks mapped onto one core), which it must flag, and on
two nodes told to use gloo over loopback, which it must refuse before the ranks try to meet.

The network lines are checked against an independent truth: each node's interfaces as `ip` lists
them inside that node's network namespace (scripts/local-slurm/start.sh names them gpuscale-<node>)."""

from __future__ import annotations

import re
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
    network = log.split("network (gloo's address by torch's rule, one line per node):\n")[1].split("\n\n")[0].splitlines()
    hosts = sorted({row[0] for row in table})
    assert [line.split(":")[0].strip() for line in network] == hosts  # one line per node
    if nodes == 2 and cluster.layout == "two":
        for host, line in zip(hosts, network, strict=False):
            interface, address = _node_address(host)
            assert line == f"  {host}: gloo over TCP on {interface} {address} (host name {host} resolves to it)", network
        assert "ok    network      gloo binds a routable address on all 2 nodes" in log
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
srun --cpu-bind=map_cpu:0,0 \\
    bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS exec {python} -m gpuscale doctor --no-bandwidth'
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


def _node_address(node: str) -> tuple[str, str]:
    """(interface, IPv4 address) of the node's one non-loopback interface, read with ip inside its network namespace."""
    out = subprocess.run(["ip", "-n", f"gpuscale-{node}", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                         timeout=20, check=True).stdout
    found = [(m.group(1), m.group(2)) for m in re.finditer(r"^\d+: (\S+)\s+inet (\S+)/", out, re.M) if m.group(1) != "lo"]
    assert len(found) == 1, out
    return found[0]


GLOO_ON_LOOPBACK = ("GLOO_SOCKET_IFNAME=lo MASTER_ADDR=n1 MASTER_PORT=$((10000 + SLURM_JOB_ID % 10000)) RANK=$SLURM_PROCID "
                    "LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS LOCAL_WORLD_SIZE=1 exec {python} -m gpuscale doctor --no-bandwidth")


def test_doctor_refuses_gloo_on_loopback_across_nodes(cluster, tmp_path):
    """The mistake: gloo told to use the loopback interface on two nodes. Each rank says so and exits 1 at once (srun: ~7 s)."""
    if cluster.layout != "two":
        pytest.skip("needs the two-node layout of the local cluster")
    result = subprocess.run(["srun", "-N2", "--ntasks-per-node=1", "--partition", "debug", "--time", "5", "bash", "-c",
                             GLOO_ON_LOOPBACK.format(python=sys.executable)],
                            env=cluster.env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    for rank, host in ((0, "n1"), (1, "n2")):
        assert (f"gpuscale doctor: FAIL network: rank {rank} on {host}: gloo would bind the loopback address 127.0.0.1 "
                "(GLOO_SOCKET_IFNAME=lo), which ranks on the other 1 node(s) cannot reach") in result.stderr, result.stderr
    assert "Fix: export GLOO_SOCKET_IFNAME=" in result.stderr and "Traceback" not in result.stderr
