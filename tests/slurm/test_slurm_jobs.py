"""Against a real SLURM (the local cluster, `local` profile): every launch mode, binding, failures, the example."""

from __future__ import annotations

import json
import subprocess

import pytest

from slurm_helpers import EXAMPLE, SCRIPTS, read_ranks

pytestmark = pytest.mark.slurm
PROBE = str(SCRIPTS / "probe.py")


def _submit(cluster, tmp_path, *options: str, script: str = PROBE, args: tuple[str, ...] = ()):
    out = tmp_path / "ranks"
    result = cluster.gpuscale("slurm", "submit", "--profile", "local", "--wait", "--time", "10",
                              "--output", str(tmp_path / "job-%j.out"), *options, "--", script, *(args or (str(out),)), cwd=tmp_path)
    logs = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    return result, out, logs


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_two_nodes_one_gpu_each_rendezvous_across_nodes(cluster, tmp_path, mode):
    result, out, logs = _submit(cluster, tmp_path, "--nodes", "2", "--gpus-per-node", "1", "--mode", mode)
    assert result.returncode == 0, result.stderr + logs
    job_id = result.stdout.strip()
    ranks = read_ranks(out)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["host"] for r in ranks} == {"n1", "n2"}, "the ranks did not span both nodes"
    assert all(r["sum"] == 3.0 for r in ranks), "the all-reduce across nodes gave the wrong sum"
    assert all(r["world_size"] == 2 and r["num_nodes"] == 2 and r["master_addr"] == "n1" for r in ranks)
    assert all(r["launcher"] == ("slurm" if mode == "srun" else "torchrun") for r in ranks)
    if mode == "srun":  # the port derived from the job id (torchrun's workers get theirs from the c10d rendezvous)
        assert all(r["master_port"] == 10000 + int(job_id) % 10000 for r in ranks)
    assert all(r["device"] == "cpu" for r in ranks)  # fake GPUs: CPU with gloo ...
    assert "torch sees none" in logs and logs.count("torch sees none") == 1  # ... said once
    assert result.stderr.splitlines()[-1] == f"output: {tmp_path / f'job-{job_id}.out'}"  # where to read it, also on success


def test_srun_one_node_tasks_bound_to_exactly_their_masks(cluster, tmp_path):
    result, out, logs = _submit(cluster, tmp_path, "--nodes", "1", "--gpus-per-node", "2", "--mode", "srun",
                                "--exclusive", "--cpu-bind", "masks")
    assert result.returncode == 0, result.stderr + logs
    ranks = read_ranks(out)
    # the local profile puts GPU i next to core i: masks 0x1 and 0x2
    assert [r["cores"] for r in ranks] == [[0], [1]], [r["cores"] for r in ranks]
    assert all(r["binding"] == "launcher" for r in ranks)  # gpuscale kept srun's placement
    assert [r["visible_gpus"] for r in ranks] == ["0,1", "0,1"] and [r["local_rank"] for r in ranks] == [0, 1]
    assert "cpu-bind=MASK" not in logs  # srun binds without its verbose report: the ranks' cores above are the proof


def test_torchrun_one_node_workers_get_disjoint_cores(cluster, tmp_path):
    result, out, logs = _submit(cluster, tmp_path, "--nodes", "1", "--gpus-per-node", "2", "--mode", "torchrun")
    assert result.returncode == 0, result.stderr + logs
    ranks = read_ranks(out)
    assert [r["rank"] for r in ranks] == [0, 1] and {r["host"] for r in ranks} == {"n1"}
    assert set(ranks[0]["cores"]).isdisjoint(ranks[1]["cores"])
    assert all(r["sum"] == 3.0 for r in ranks)


def test_submit_wait_reports_a_failing_job(cluster, tmp_path):
    result, _, logs = _submit(cluster, tmp_path, "--nodes", "1", "--gpus-per-node", "1", "--mode", "srun",
                              script=str(SCRIPTS / "fail.py"), args=("x",))
    assert result.returncode == 3, result.stderr + logs
    assert "FAILED" in result.stderr and "exit code 3" in result.stderr
    job_id = result.stdout.strip()
    status = cluster.gpuscale("slurm", "status", job_id, cwd=tmp_path)
    assert status.returncode == 0 and "FAILED" in status.stdout
    logs_cmd = cluster.gpuscale("slurm", "logs", job_id, cwd=tmp_path)
    assert logs_cmd.returncode == 0 and logs_cmd.stdout == logs
    late = cluster.gpuscale("slurm", "cancel", job_id, "99999999", cwd=tmp_path)  # scancel says 0 to both
    assert late.returncode == 2 and late.stdout == "", late.stdout + late.stderr
    assert late.stderr.splitlines() == [
        f"gpuscale slurm cancel: error: job {job_id} has already ended (FAILED): nothing to cancel",
        "gpuscale slurm cancel: error: SLURM knows no job 99999999: a mistyped id, or a job that ended longer ago than "
        "SLURM keeps it (MinJobAge; `sacct -j 99999999` reads the accounting)"], late.stderr


def test_cancel_a_running_job(cluster, tmp_path):
    import time

    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    submitted = cluster.gpuscale("slurm", "submit", "--profile", "local", "--gpus-per-node", "1", "--mode", "srun",
                                 "--time", "10", "--output", str(tmp_path / "job-%j.out"), "--", str(sleeper), cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    deadline = time.monotonic() + 60
    while "RUNNING" not in cluster.gpuscale("slurm", "status", job_id, cwd=tmp_path).stdout:
        assert time.monotonic() < deadline, "job never started"
        time.sleep(1)
    cancelled = cluster.gpuscale("slurm", "cancel", job_id, cwd=tmp_path)
    assert cancelled.returncode == 0 and cancelled.stdout == f"cancelled {job_id} (it was RUNNING)\n", cancelled.stderr
    deadline = time.monotonic() + 90
    while "CANCELLED" not in (status := cluster.gpuscale("slurm", "status", job_id, cwd=tmp_path).stdout):
        assert time.monotonic() < deadline, status
        time.sleep(1)


def test_cancel_takes_an_array_whose_listed_task_has_ended_while_others_run(cluster, tmp_path):
    """scontrol lists an array under its last task first: here the task that ends at once. The array still runs, so
    cancel must cancel it, not say it has ended."""
    import time

    script = tmp_path / "array.sh"
    script.write_text("#!/bin/bash\nsleep $(( (2 - SLURM_ARRAY_TASK_ID) * 120 ))\n")
    submitted = subprocess.run(["sbatch", "--parsable", "--array=0-2", "--time=5", "-o", str(tmp_path / "a-%A_%a.out"), str(script)],
                               capture_output=True, text=True, env=cluster.env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while "COMPLETED" not in cluster.gpuscale("slurm", "status", job_id, cwd=tmp_path).stdout:
            assert time.monotonic() < deadline, "the array's quick task never ended"
            time.sleep(1)
        cancelled = cluster.gpuscale("slurm", "cancel", job_id, cwd=tmp_path)
        assert cancelled.returncode == 0, cancelled.stderr
        deadline = time.monotonic() + 60
        while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True, env=cluster.env).stdout.strip():
            assert time.monotonic() < deadline, "the array's other tasks still run"
            time.sleep(1)
    finally:  # the shared cluster runs the next tests: leave no task of this array behind
        subprocess.run(["scancel", job_id], env=cluster.env, capture_output=True)


def test_bad_options_are_refused_before_submission(cluster, tmp_path):
    result = cluster.gpuscale("slurm", "submit", "--profile", "local", "--gpus-per-node", "3", "--", PROBE, cwd=tmp_path)
    assert result.returncode == 2 and "more than a local node has (2)" in result.stderr
    assert result.stdout == ""  # nothing was submitted


@pytest.fixture(scope="module")
def local_run(cluster, tmp_path_factory) -> dict:
    """The same example with 2 processes on this machine, for comparison."""
    out = tmp_path_factory.mktemp("local") / "dvc"
    result = cluster.gpuscale("run", "--nproc-per-node", "2", str(EXAMPLE), "--out", str(out), cwd=out.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("nodes, mode", [(1, "srun"), (1, "torchrun"), (2, "srun"), (2, "torchrun")])
def test_example_trains_with_two_ranks_like_the_local_run(cluster, tmp_path, nodes, mode, local_run):
    out = tmp_path / "dvc"
    result, _, logs = _submit(cluster, tmp_path, "--nodes", str(nodes), "--gpus-per-node", str(2 // nodes), "--mode", mode,
                              script=str(EXAMPLE), args=("--out", str(out)))
    assert result.returncode == 0, result.stderr + logs[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["num_nodes"] == nodes
    assert summary["hosts"] == (["n1", "n2"] if nodes == 2 else ["n1"])
    assert summary["global_batch"] == 32 and summary["accuracy"] >= 0.9
    assert summary["launcher"] == ("slurm" if mode == "srun" else "torchrun")
    # same seed, same global batch, same rank layout: the same training as on this machine
    assert summary["accuracy"] == pytest.approx(local_run["accuracy"], abs=0.02)
    assert summary["final_loss"] == pytest.approx(local_run["final_loss"], rel=0.05)


def test_submit_follow_streams_the_output_and_logs_follow_drains_it(cluster, tmp_path):
    talker = tmp_path / "talk.py"
    talker.write_text("import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(1)\n")
    result = cluster.gpuscale("slurm", "submit", "--profile", "local", "--gpus-per-node", "1", "--mode", "srun", "--time", "5",
                              "--output", str(tmp_path / "job-%j.out"), "--follow", "--", str(talker), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job_id, *lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("line")] == ["line 0", "line 1", "line 2"]
    assert "COMPLETED" in result.stderr
    logs = cluster.gpuscale("slurm", "logs", "-f", job_id, cwd=tmp_path)
    assert logs.returncode == 0 and "line 2" in logs.stdout


def test_srun_without_binding_still_gives_ranks_disjoint_cores(cluster, tmp_path):
    # --cpu-bind none: srun binds nothing, every task sees the whole allocation; gpuscale splits it
    result, out, logs = _submit(cluster, tmp_path, "--nodes", "1", "--gpus-per-node", "2", "--mode", "srun",
                                "--exclusive", "--cpu-bind", "none")
    assert result.returncode == 0, result.stderr + logs
    ranks = read_ranks(out)
    assert [r["cores"] for r in ranks] == [[0], [1]] and all(r["binding"] == "even-split" for r in ranks)


TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                      "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR")


@pytest.mark.parametrize("nodes, gpus", [(2, 1), (1, 2)])
def test_srun_tasks_get_what_torchrun_gives_its_workers(cluster, tmp_path, nodes, gpus):
    """One plain script, run in srun mode and in torchrun mode on the same nodes and GPUs, reads the same variables
    with the same values, except the port: torchrun's workers meet on a port torchrun picks, srun's on the job's."""
    seen, jobs = {}, {}
    for mode in ("srun", "torchrun"):
        where = tmp_path / mode
        where.mkdir()
        result, out, logs = _submit(cluster, where, "--nodes", str(nodes), "--gpus-per-node", str(gpus), "--mode", mode,
                                    script=str(SCRIPTS / "torchrun_vars.py"))
        assert result.returncode == 0, result.stderr + logs
        jobs[mode] = result.stdout.strip()
        seen[mode] = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: int(r["RANK"]))
        assert [r["RANK"] for r in seen[mode]] == [str(rank) for rank in range(nodes * gpus)]
    for srun, torchrun in zip(seen["srun"], seen["torchrun"], strict=False):
        assert {name: srun[name] for name in TORCHRUN_VARIABLES} == {name: torchrun[name] for name in TORCHRUN_VARIABLES}
        assert srun["host"] == torchrun["host"]
        assert (srun["launcher"], torchrun["launcher"]) == ("slurm", "torchrun"), "gpuscale no longer tells srun's tasks apart"
        assert srun["TORCHELASTIC_RUN_ID"] == jobs["srun"] and torchrun["TORCHELASTIC_RUN_ID"]
        if nodes > 1:  # --rdzv-id is the job id (one node: --standalone makes up an id)
            assert torchrun["TORCHELASTIC_RUN_ID"] == jobs["torchrun"]
    for ranks in seen.values():
        assert len({r["MASTER_PORT"] for r in ranks}) == 1 and 1024 < int(ranks[0]["MASTER_PORT"]) < 65536
    assert seen["srun"][0]["MASTER_PORT"] == str(10000 + int(jobs["srun"]) % 10000)


def test_the_torchrun_task_gets_every_core_asked_for_where_srun_does_not_inherit_them(cluster, tmp_path):
    """Slurm 22.05-23.02's srun did not take sbatch's --cpus-per-task: with exact steps a task got one core, torchrun and
    its workers with it. The job's shell is made to behave so (SLURM_CPUS_PER_TASK gone, SLURM_EXACT=1: this cluster's
    22.05.8 srun still reads the variable); the batch script's own srun line must still ask for the node's 2 cores."""
    script = tmp_path / "job.sh"
    out = tmp_path / "ranks"
    written = cluster.gpuscale("slurm", "script", "--profile", "local", "--nodes", "1", "--gpus-per-node", "2", "--mode",
                               "torchrun", "--time", "10", "--output", str(tmp_path / "job-%j.out"), "-o", str(script), "--",
                               str(SCRIPTS / "step_cores.py"), str(out), cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    text = script.read_text()
    assert "set -euo pipefail\n" in text
    script.write_text(text.replace("set -euo pipefail\n", "set -euo pipefail\nunset SLURM_CPUS_PER_TASK; export SLURM_EXACT=1\n", 1))
    submitted = subprocess.run(["sbatch", "--wait", str(script)], env=cluster.env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=300)
    logs = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert submitted.returncode == 0, submitted.stderr + logs
    ranks = read_ranks(out)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["task_cores"] == [0, 1] for r in ranks), [r["task_cores"] for r in ranks]  # the node's 2 cores
    assert set(ranks[0]["cores"]).isdisjoint(ranks[1]["cores"])
