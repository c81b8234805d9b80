"""One script, every launch mode: each rank really ran, sits on its own cores, and gradients synced."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from procs import ROOT, SCRIPTS, assert_ok, clean_env, gpuscale_cmd, read_ranks, run, run_by_hand, torchrun_cmd

pytestmark = pytest.mark.multiproc
PROBE = str(SCRIPTS / "probe.py")


def _assert_synced(ranks: list[dict]) -> None:
    world = len(ranks)
    assert [r["rank"] for r in ranks] == list(range(world))
    assert all(r["world_size"] == world for r in ranks)
    mean_grad = 4 * sum(r + 1 for r in range(world)) / world  # what all-reduce must produce
    for r in ranks:
        assert r["grad"] == pytest.approx([mean_grad] * 8), "gradients were not averaged over ranks"
        assert r["initial_weight"] == ranks[0]["initial_weight"], "DDP did not broadcast rank 0's weights"
        assert r["weight"] == ranks[0]["weight"], "weights differ between ranks after a step"
    assert all(r["tokenizers_parallelism"] == "false" for r in ranks)


def _assert_disjoint_cores(ranks: list[dict]) -> None:
    seen: set[int] = set()
    for r in ranks:
        assert r["cores"], f"rank {r['rank']} has no cores"
        assert not seen & set(r["cores"]), f"ranks share cores: {[x['cores'] for x in ranks]}"
        seen |= set(r["cores"])
        assert r["torch_threads"] == len(r["cores"]) == int(r["omp_num_threads"])


def test_single_process_runs_without_a_process_group(tmp_path):
    assert_ok(run([sys.executable, PROBE, str(tmp_path)]))
    (only,) = read_ranks(tmp_path, 1)
    assert only["launcher"] == "single" and only["backend"] is None
    assert only["grad"] == pytest.approx([4.0] * 8)  # its own gradient, nothing to average with


def test_gpuscale_run_two_ranks_disjoint_cores_synced_gradients(tmp_path):
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", PROBE, str(tmp_path)), timeout=300)
    assert_ok(result)
    ranks = read_ranks(tmp_path, 2)
    assert {r["launcher"] for r in ranks} == {"torchrun"} and {r["backend"] for r in ranks} == {"gloo"}
    _assert_synced(ranks)
    _assert_disjoint_cores(ranks)
    # rank 0 printed where every rank runs, once
    assert result.stderr.count("placement of 2 ranks") == 1
    assert "even-split" in result.stderr


def test_plain_torchrun(tmp_path):
    assert_ok(run(torchrun_cmd(2, PROBE, str(tmp_path)), timeout=300))
    ranks = read_ranks(tmp_path, 2)
    assert {r["launcher"] for r in ranks} == {"torchrun"}
    _assert_synced(ranks)
    # torchrun forces OMP_NUM_THREADS=1 itself; gpuscale honours a value it did not set
    assert all(r["omp_num_threads"] == "1" for r in ranks)
    assert set(ranks[0]["cores"]).isdisjoint(ranks[1]["cores"])


def test_ranks_set_by_hand_like_the_course_srun_recipe(tmp_path):
    results = run_by_hand([PROBE, str(tmp_path)], world_size=2, timeout=300)
    for result in results:
        assert_ok(result)
    ranks = read_ranks(tmp_path, 2)
    assert {r["launcher"] for r in ranks} == {"manual"}
    _assert_synced(ranks)
    _assert_disjoint_cores(ranks)


def test_bind_none_leaves_affinity_alone_and_shares_fewer_cores_one_thread_each(tmp_path):
    """Two CPU ranks on one core: refused in one line, as `gpuscale study` refuses; with --bind none they share it,
    one thread each (torchrun's way), and keep the core they were given."""
    one_core = ["taskset", "-c", "0"]
    refused = run([*one_core, *gpuscale_cmd("run", "--nproc-per-node", "2", PROBE, str(tmp_path / "refused"))], timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "asks for 2 CPU processes but this process may use 1 cores" in refused.stderr and "--bind none" in refused.stderr
    assert not (tmp_path / "refused").exists()  # nothing started
    assert_ok(run([*one_core, *gpuscale_cmd("run", "--nproc-per-node", "2", "--bind", "none", PROBE, str(tmp_path))],
                  timeout=300))
    ranks = read_ranks(tmp_path, 2)
    assert ranks[0]["cores"] == ranks[1]["cores"] == [0]
    assert [r["torch_threads"] for r in ranks] == [1, 1]
    assert all(p["binding"] == "none" for p in ranks[0]["placements"])


def test_gpuscale_env_prints_one_line_per_rank():
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "-m", "gpuscale", "env"), timeout=300)
    assert_ok(result)
    lines = [line.split() for line in result.stdout.splitlines()]
    table = [cells for cells in lines if len(cells) >= 4 and cells[1].isdigit()]
    assert [cells[1] for cells in table] == ["0", "1"], result.stdout
    assert "launcher torchrun: 2 rank(s) on 1 node(s)" in result.stdout


def test_gpuscale_env_single_process_json():
    import json

    result = run(gpuscale_cmd("env", "--json"), timeout=200)
    assert_ok(result)
    info = json.loads(result.stdout)
    assert info["launcher"] == "single" and info["world_size"] == 1
    assert info["placements"][0]["rank"] == 0


@pytest.mark.parametrize("torchrun", ["installed", "before 2.10"])
def test_usr1_to_gpuscale_run_reaches_every_worker(tmp_path, torchrun):
    """SLURM's warning before the time limit (USR1) goes on to the workers, as TERM does, whichever torchrun runs them.

    Before torch 2.10 torchrun cannot be told to pass USR1 on (no --signals-to-handle); its default action would
    end the launcher at once. The old torchrun is the installed one without that option (old_torchrun_launcher.py).
    """
    args = ["run", "--nproc-per-node", "2", str(SCRIPTS / "signal_wait.py"), str(tmp_path)]
    cmd = gpuscale_cmd(*args) if torchrun == "installed" else [sys.executable, str(SCRIPTS / "old_torchrun_launcher.py"), *args]
    launcher, err = _signalled_when_ready(cmd, tmp_path, signal.SIGUSR1)
    assert [(tmp_path / f"got-{rank}").read_text() for rank in (0, 1)] == ["SIGUSR1", "SIGUSR1"], err
    assert launcher.returncode == 128 + signal.SIGUSR1, err  # no gpuscale.StopSignal stopped at a checkpoint
    assert err.splitlines()[-1] == ("gpuscale run: got SIGUSR1; passed it on to the workers, which ended without stopping "
                                    "at a checkpoint (a script with gpuscale.StopSignal writes one)"), err


def _signalled_when_ready(cmd: list[str], out, signum: int) -> tuple[subprocess.Popen, str]:
    """Start `cmd`, send the launcher `signum` once both ranks wrote OUT/ready-RANK; the launcher and its stderr."""
    launcher = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not all((out / f"ready-{rank}").exists() for rank in (0, 1)):
            assert time.monotonic() < deadline and launcher.poll() is None, "the workers did not start"
            time.sleep(0.1)
        launcher.send_signal(signum)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    return launcher, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_to_gpuscale_run_that_stops_the_ranks_at_a_checkpoint_ends_it_with_75(tmp_path, signum):
    """A loop around the command must tell "run me again" from a death: where gpuscale.StopSignal stopped the ranks at
    a checkpoint, `gpuscale run` exits 75 (EX_TEMPFAIL), as the ranks did, not 128 + the signal it got."""
    cmd = gpuscale_cmd("run", "--nproc-per-node", "2", str(SCRIPTS / "stop_signal_wait.py"), str(tmp_path))
    launcher, err = _signalled_when_ready(cmd, tmp_path, signum)
    assert all((tmp_path / f"checkpoint-{rank}").exists() for rank in (0, 1)), err
    assert launcher.returncode == 75, err
    name = signal.Signals(signum).name
    assert err.splitlines()[-1] == (f"gpuscale run: got {name}; passed it on to the workers, which stopped at a checkpoint "
                                    "(exit code 75): run the same command again to resume"), err
