"""Preemption on the real local SLURM: the warning signal stops the job at a checkpoint, the job requeues
itself, and the requeued job resumes from exactly that step, ending bit for bit where an uninterrupted
run ends. Once in each launch mode of the batch scripts (srun across two nodes, torchrun on one), and
under a torchrun older than 2.10 (without --signals-to-handle). scancel never requeues. (A plain script, without
gpuscale.StopSignal, is not told, runs on to its time limit and is not requeued: test_slurm_failures.py's
time-limit cases, in both modes.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from slurm_helpers import ROOT, SCRIPTS

pytestmark = pytest.mark.slurm
TRAIN = str(SCRIPTS / "preempt_train.py")
STEPS = 30


def _slurm(cluster, *cmd: str) -> str:
    return subprocess.run(cmd, env=cluster.env, capture_output=True, text=True, timeout=60, check=True).stdout


def _job_field(cluster, job: str, name: str) -> str:
    line = _slurm(cluster, "scontrol", "show", "job", "-o", job)
    return next((f.split("=", 1)[1] for f in line.split() if f.startswith(name + "=")), "")


def _until(what: str, check, timeout: float, logs=lambda: ""):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{logs()}"
        time.sleep(0.5)


def _followers(tmp_path, run):
    """The job's logs (its job-*.out files in `tmp_path`) and the step its training wrote to `run`/progress, as functions."""
    def logs() -> str:
        return "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))

    def progress() -> int:
        try:
            return int((run / "progress").read_text() or 0)
        except (OSError, ValueError):
            return 0

    return logs, progress


def _straight_run(tmp_path):
    """The same training, uninterrupted, under `gpuscale run` on this machine (2 processes, gloo, CPU)."""
    out = tmp_path / "straight"
    result = subprocess.run([sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", "2", TRAIN, str(out), "--steps", str(STEPS)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _old_torch(where) -> str:
    """A folder that makes the job's Python report torch 2.9.0 (its package metadata, first on PYTHONPATH): the batch
    script then starts torchrun as it must before 2.10, without --signals-to-handle (torch itself stays the same)."""
    info = where / "torch-2.9.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0\n")
    return str(where)


@pytest.mark.parametrize("mode, nodes, gpus, torch_before_2_10", [("srun", "2", "1", False), ("torchrun", "1", "2", False),
                                                                   ("torchrun", "1", "2", True)],
                         ids=["srun", "torchrun", "torchrun-before-2.10"])
def test_warning_signal_checkpoints_requeues_and_resumes_bit_for_bit(cluster, tmp_path, mode, nodes, gpus, torch_before_2_10):
    run = tmp_path / "preempted"
    old = ["--env", f"PYTHONPATH={_old_torch(tmp_path / 'old-torch')}"] if torch_before_2_10 else []
    submitted = cluster.gpuscale(
        "slurm", "submit", "--profile", "local", "--mode", mode, "--nodes", nodes, "--gpus-per-node", gpus, "--time", "10", *old,
        "--output", str(tmp_path / "job-%j.out"), "--", TRAIN, str(run), "--steps", str(STEPS), "--sleep", "0.4", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split()[-1]

    logs, progress = _followers(tmp_path, run)

    straight = _straight_run(tmp_path)  # meanwhile the job starts on the cluster
    _until("the job to train a few steps", lambda: progress() >= 5, 180, logs)
    # What SLURM does at --signal=B:USR1@N before the time limit: USR1 to the batch shell only.
    _slurm(cluster, "scancel", "--signal=USR1", "--batch", job)
    _until("the job to requeue itself", lambda: _job_field(cluster, job, "Restarts") == "1", 120, logs)
    _until("the requeued job to be pending", lambda: _job_field(cluster, job, "JobState") == "PENDING", 60, logs)
    # SLURM holds a requeued job ~120 s; the test releases it sooner, but not within the second of the requeue:
    # slurmd revoked the old launch credential at that second (1-s resolution) and refuses a new launch stamped
    # with the same second ("Job N already killed, do not launch batch job"), failing the job.
    time.sleep(2)
    _slurm(cluster, "scontrol", "update", f"jobid={job}", "StartTime=now")
    _until("the requeued job to finish", lambda: _job_field(cluster, job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED"), 300, logs)
    assert _job_field(cluster, job, "JobState") == "COMPLETED", logs()

    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    kinds = [(e["event"], e["restarts"]) for e in events]
    assert kinds == [("start", 0), ("stop", 0), ("start", 1), ("finish", 1)], kinds
    stopped_at = events[1]["step"]
    assert 5 <= stopped_at < STEPS and events[1]["signal"] == "SIGUSR1"
    assert events[2]["step"] == stopped_at, "the requeued job did not resume from the step it stopped at"
    assert all(e["job"] == job and e["world_size"] == 2 for e in events)
    assert {e["launcher"] for e in events} == {"slurm" if mode == "srun" else "torchrun"}
    text = logs()
    assert f"requeueing job {job} (restart 1 of at most 10)" in text
    # torchrun (before 2.10: ignoring USR1, which SLURM handed to the workers) saw its workers end with 75: gpuscale's
    # agent takes that as the stop it is, where plain torchrun printed a FAILED block for it
    assert "FAILED" not in text and "exitcode" not in text, text[-3000:]
    assert text.count("[gpuscale] placement of 2 ranks") == 2, "the output of the first run was not kept (--open-mode=append)"

    expected = torch.load(straight / "final.pt", weights_only=True)
    resumed = torch.load(run / "final.pt", weights_only=True)
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), f"{name} differs after preemption and resume"
    assert json.loads((run / "losses.json").read_text()) == json.loads((straight / "losses.json").read_text())


def _wait_for_end(cluster, job: str, logs, timeout: float) -> str:
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
    _until("the job to end", lambda: _job_field(cluster, job, "JobState") in ended, timeout, logs)
    return _job_field(cluster, job, "JobState")


def test_scancel_ends_a_stop_signal_job_without_requeue(cluster, tmp_path):
    run = tmp_path / "cancelled"
    submitted = cluster.gpuscale("slurm", "submit", "--profile", "local", "--mode", "srun", "--gpus-per-node", "1",
                                 "--time", "10", "--output", str(tmp_path / "job-%j.out"),
                                 "--", TRAIN, str(run), "--steps", str(STEPS), "--sleep", "0.4", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split()[-1]

    def logs() -> str:
        return "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))

    _until("the job to train a few steps", lambda: (run / "progress").exists() and int((run / "progress").read_text() or 0) >= 3,
           180, logs)
    _slurm(cluster, "scancel", job)
    assert _wait_for_end(cluster, job, logs, 60) == "CANCELLED", logs()
    time.sleep(15)  # past KillWait (10 s): a requeue would have happened by now
    assert _job_field(cluster, job, "JobState") == "CANCELLED" and _job_field(cluster, job, "Restarts") == "0", logs()
    assert "requeueing" not in logs()


@pytest.mark.parametrize("nodes, gpus", [("1", "2")])
def test_lightning_auto_requeue_gets_the_warning_checkpoints_and_requeues_the_job(cluster, tmp_path, nodes, gpus):
    """Lightning's SLURM auto-requeue, as its documentation sets it up: SLURM's warning reaches its SIGUSR1 handler
    (gpuscale's start-up hook saw the handler installed), which saves its hpc checkpoint and requeues the job itself;
    gpuscale claims no requeue of its own."""
    root = tmp_path / "lightning"
    script = str(ROOT / "tests" / "slurm" / "scripts" / "lightning_requeue.py")
    submitted = cluster.gpuscale("slurm", "submit", "--profile", "local", "--mode", "srun", "--nodes", nodes, "--gpus-per-node",
                                 gpus, "--time", "10", "--output", str(tmp_path / "job-%j.out"), "--", script, str(root),
                                 "--devices", gpus, "--num-nodes", nodes, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split()[-1]

    logs, progress = _followers(tmp_path, root)

    _until("Lightning to train a few steps", lambda: progress() >= 3, 240, logs)
    _slurm(cluster, "scancel", "--signal=USR1", "--batch", job)  # what SLURM does at --signal=B:USR1@N
    _until("Lightning to requeue the job", lambda: _job_field(cluster, job, "Restarts") == "1", 120, logs)
    _slurm(cluster, "scancel", job)  # its resumed run is Lightning's business
    assert list(root.glob("hpc_ckpt_*.ckpt")), f"no hpc checkpoint in {root}\n{logs()}"
    text = logs()
    assert "passed on to the step, whose script handles it with its own SIGUSR1 handler" in text, text
    assert "requeueing job" not in text  # gpuscale's own requeue did not run: Lightning's did
