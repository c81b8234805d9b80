"""Load on a real SLURM (issue 6): many jobs back to back, several at once on one node.

Every job is a real 2-rank job rendered by gpuscale for the `local` profile (srun and torchrun
modes alternately) and submitted with gpuscale's own `jobs.submit`; each rank rendezvouses,
all-reduces and writes a report into the job's own directory (scripts/load_probe.py). Passing
means: every job COMPLETED, every report and every output file holds its own job only, the sums
are right, the rendezvous was on a node of the job, and nobody hit "Address already in use".

The jobs running at once share one node in the local cluster's `load` partition (OverSubscribe=
FORCE:4, scripts/local-slurm/start.sh): its nodes have 2 CPUs and 2 fake GPUs, and GPUs are never
shared, so those jobs ask for CPUs only (``--gpus-per-node=0`` on sbatch's command line, which
overrides the script's ``#SBATCH`` line). Their ranks wait for one another before and after the
rendezvous, so all of them meet at the same moment, and the times they report prove the overlap.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from gpuscale.detect.env import expand_hostlist
from gpuscale.slurm import jobs
from gpuscale.slurm.profiles import load_profile
from gpuscale.slurm.render import JobSpec, render_sbatch

from slurm_helpers import SCRIPTS, read_ranks

pytestmark = pytest.mark.slurm

PROBE = str(SCRIPTS / "load_probe.py")
NUM_BACK_TO_BACK = 20
NUM_AT_ONCE = 4
LOAD_PARTITION = "load"
PORT_TROUBLE = re.compile(r"Address already in use|EADDRINUSE|errno: 98", re.IGNORECASE)


@pytest.fixture
def slurm(cluster, monkeypatch):
    """`gpuscale.slurm.jobs` runs sbatch and scontrol with this process's environment: make it the cluster's."""
    for name in list(os.environ):
        if name not in cluster.env:
            monkeypatch.delenv(name)
    for name, value in cluster.env.items():
        monkeypatch.setenv(name, value)
    return cluster


def _sinfo(*fields: str) -> list[str]:
    out = subprocess.run(["sinfo", "-h", *fields], capture_output=True, text=True, timeout=30, check=True).stdout
    return list(dict.fromkeys(out.split()))


def _job(mode: str, nodes: int, out: Path, tmp_path: Path, *probe_args: str) -> str:
    """The batch script of one 2-rank job: 2 nodes x 1 GPU, or 1 node x 2 GPUs."""
    spec = JobSpec(script=PROBE, script_args=(str(out), *probe_args), nodes=nodes, gpus_per_node=2 // nodes, mode=mode,
                   time="5", job_name=f"load-{mode}", output=str(tmp_path / "job-%j.out"))
    return render_sbatch(load_profile("local"), spec)


def _wait(job_ids: list[str], timeout_s: float) -> dict[str, jobs.JobInfo]:
    deadline = time.monotonic() + timeout_s
    infos: dict[str, jobs.JobInfo] = {}
    while True:
        infos.update({j: jobs.job_info(j) for j in job_ids if j not in infos or not infos[j].finished})
        if all(info.finished for info in infos.values()):
            return infos
        if time.monotonic() > deadline:
            late = {j: i.state for j, i in infos.items() if not i.finished}
            raise AssertionError(f"jobs still not finished after {timeout_s:.0f} s: {late}")
        time.sleep(1.0)


def _cancel_unfinished(job_ids: list[str]) -> None:
    for job_id in job_ids:
        try:
            if not jobs.job_info(job_id).finished:
                jobs.cancel(job_id)
        except jobs.SlurmError:
            pass


def _check_job(info: jobs.JobInfo, out: Path, log: str, mode: str, nodes: int) -> list[dict]:
    """One job's own story: finished well, its reports and output name it alone, its sums add up."""
    where = f"job {info.job_id} ({mode}, {nodes} node(s)):\n{log[-3000:]}"
    assert info.state == "COMPLETED" and info.exit_code == 0, where
    assert not PORT_TROUBLE.search(log), where
    ranks = read_ranks(out)
    assert [r["rank"] for r in ranks] == [0, 1], where
    assert all(r["job_id"] == r["slurm_job_id"] == info.job_id for r in ranks), ([r["job_id"] for r in ranks], where)
    assert all(r["sum"] == 3.0 and r["world_size"] == 2 for r in ranks), where
    assert all(r["launcher"] == ("slurm" if mode == "srun" else "torchrun") for r in ranks), where
    # the job's output file holds this job's ranks and nobody else's
    assert sorted(re.findall(r"load-probe job=(\S+) rank=(\d+)", log)) == [(info.job_id, "0"), (info.job_id, "1")], where
    job_nodes = expand_hostlist(info.nodes or "")
    assert {r["host"] for r in ranks} == set(job_nodes), where
    # the rendezvous is on a node of the job: its first node, or torchrun --standalone's own store on the one node
    allowed = {job_nodes[0]} | ({"localhost"} if mode == "torchrun" and nodes == 1 else set())
    assert all(r["master_addr"] in allowed for r in ranks), ([r["master_addr"] for r in ranks], job_nodes, where)
    if mode == "srun":
        assert all(r["master_port"] == 10000 + int(info.job_id) % 10000 for r in ranks), where
    return ranks


def test_twenty_jobs_submitted_back_to_back_all_finish_with_their_own_outputs(slurm, tmp_path):
    node_counts = [1, 2] if len(_sinfo("-N", "-o", "%N")) >= 2 else [1]
    shapes = [(("srun", "torchrun")[i % 2], node_counts[(i // 2) % len(node_counts)]) for i in range(NUM_BACK_TO_BACK)]
    outs = [tmp_path / f"out-{i:02d}" for i in range(NUM_BACK_TO_BACK)]
    scripts = [_job(mode, nodes, out, tmp_path) for (mode, nodes), out in zip(shapes, outs, strict=False)]

    started = time.monotonic()
    job_ids: list[str] = []
    try:
        for text in scripts:  # back to back: rendered beforehand, nothing between two sbatch calls
            job_ids.append(jobs.submit(text))
        submit_s = time.monotonic() - started
        infos = _wait(job_ids, timeout_s=420)  # about 2-3 minutes: 2 jobs at a time on 2 shared cores
    finally:
        _cancel_unfinished(job_ids)

    assert len(set(job_ids)) == NUM_BACK_TO_BACK
    for job_id, (mode, nodes), out in zip(job_ids, shapes, outs, strict=False):
        log = (tmp_path / f"job-{job_id}.out").read_text()
        _check_job(infos[job_id], out, log, mode, nodes)
    assert submit_s < 20, f"submitting took {submit_s:.1f} s: not back to back"


def test_four_jobs_at_once_on_one_node_meet_on_their_own_ports(slurm, tmp_path):
    partitions = _sinfo("-o", "%R")
    if LOAD_PARTITION not in partitions:
        pytest.fail(f"the local cluster has no '{LOAD_PARTITION}' partition ({', '.join(partitions)}): it was started by an "
                    "older scripts/local-slurm/start.sh; run scripts/local-slurm/stop.sh, then start.sh")
    node = _sinfo("-N", "-o", "%N")[0]
    gate = tmp_path / "gate"
    gate.mkdir()
    modes = [("srun", "torchrun")[i % 2] for i in range(NUM_AT_ONCE)]
    outs = [tmp_path / f"out-{i}" for i in range(NUM_AT_ONCE)]
    scripts = [_job(mode, 1, out, tmp_path, "--gate", str(gate), "--ranks", str(2 * NUM_AT_ONCE)) for mode, out in zip(modes, outs, strict=False)]
    # CPUs only (fake GPUs are never shared), on one node of the partition that lets 4 jobs share a CPU
    # (a 1 x 2 job takes every GPU of a node, so its script asks to own the node: --exclusive; --oversubscribe here
    # overrides it, for these jobs share the node on purpose)
    on_one_node = (f"--partition={LOAD_PARTITION}", f"--nodelist={node}", "--gpus-per-node=0", "--oversubscribe")

    job_ids: list[str] = []
    try:
        for text in scripts:
            job_ids.append(jobs.submit(text, extra_args=on_one_node))
        infos = _wait(job_ids, timeout_s=180)
    finally:
        _cancel_unfinished(job_ids)

    everyone = []
    for job_id, mode, out in zip(job_ids, modes, outs, strict=False):
        log = (tmp_path / f"job-{job_id}.out").read_text()
        assert infos[job_id].nodes == node, (job_id, infos[job_id].nodes)
        everyone += _check_job(infos[job_id], out, log, mode, 1)
    # every process group was up at the same time: the last rank was ready before the first one left
    last_ready, first_left = max(r["ready"] for r in everyone), min(r["left"] for r in everyone)
    assert last_ready < first_left, f"the jobs did not overlap: last ready {last_ready:.2f}, first left {first_left:.2f}"
    ports = {r["job_id"]: r["master_port"] for r in everyone}
    assert len(set(ports.values())) == NUM_AT_ONCE, f"jobs on one node shared a rendezvous port: {ports}"
