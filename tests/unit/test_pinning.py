"""Placing a rank before its script runs (gpuscale.runtime.pinning): the decision, GPUs found in sysfs, and the
start-up hook doing it in a real interpreter before the script's first line, without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscale.detect.env import detect_env
from gpuscale.detect.topology import pci_gpus
from gpuscale.measure.probe import SITE_DIR
from gpuscale.runtime import pinning

ROOT = Path(__file__).resolve().parents[2]


def _env(local_rank: int, local_world_size: int, **extra: str) -> tuple:
    environ = {"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(local_world_size),
               "LOCAL_WORLD_SIZE": str(local_world_size), "TORCHELASTIC_RUN_ID": "t", "GROUP_RANK": "0", **extra}
    return detect_env(environ), environ


def _no_gpus() -> None:
    return None


def test_an_even_split_on_a_cpu_only_node():
    env, environ = _env(1, 4)
    plan = pinning.plan_node(env, "auto", environ, range(8), _no_gpus)
    assert plan.source == "even-split" and plan.cores == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_the_launchers_plan_comes_first_and_is_checked():
    env, environ = _env(0, 2, GPUSCALE_RANK_CORES="gpu-local:4-7;0-3", GPUSCALE_GPU_CORES="0;1")
    plan = pinning.plan_node(env, "auto", environ, range(8), _no_gpus)
    assert plan.source == "gpu-local" and plan.cores == ((4, 5, 6, 7), (0, 1, 2, 3))
    assert pinning.rank_cores_text(plan) == "gpu-local:4-7;0-3"
    for bad in ("even-split:0-3", "0-3;4-7", "even-split:0-3;x"):
        with pytest.raises(ValueError, match=f"GPUSCALE_RANK_CORES='{bad}'.*each of the 2 local ranks"):
            pinning.plan_node(env, "auto", {**environ, "GPUSCALE_RANK_CORES": bad}, range(8), _no_gpus)


def test_a_task_srun_bound_keeps_its_cores_and_one_srun_left_unbound_is_split():
    slurm = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2", "SLURM_NODEID": "0",
             "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2",
             "SLURM_STEP_NODELIST": "n1", "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1", "SLURM_STEP_ID": "0"}
    env = detect_env(slurm)
    assert env.launcher == "slurm"
    bound = pinning.plan_node(env, "auto", slurm, (3,), _no_gpus)
    assert bound.source == "launcher" and bound.for_rank(1) == (3,)
    unbound = pinning.plan_node(env, "auto", {**slurm, "SLURM_CPU_BIND_TYPE": "none"}, range(4), _no_gpus)
    assert unbound.source == "even-split" and unbound.for_rank(1) == (2, 3)


def test_the_profiles_map_follows_the_visible_gpus():
    # LUMI-G's GCD map; SLURM gave this job GCDs 2 and 3
    lumi = "49-55;57-63;17-23;25-31;1-7;9-15;33-39;41-47"
    env, environ = _env(1, 2, GPUSCALE_GPU_CORES=lumi, ROCR_VISIBLE_DEVICES="2,3")
    plan = pinning.plan_node(env, "auto", environ, range(64), _no_gpus)
    assert plan.source == "gpu-local" and plan.cores == (tuple(range(17, 24)), tuple(range(25, 32)))
    # a map of one GPU for two local ranks on GPUs 0 and 1: the message names both
    env, environ = _env(1, 2, GPUSCALE_GPU_CORES="0-1")
    with pytest.raises(ValueError, match=r"lists 1 GPUs, but this node's 2 local ranks use GPUs \[0, 1\]"):
        pinning.plan_node(env, "auto", environ, range(64), _no_gpus)


def test_bind_none_leaves_everything_alone():
    env, environ = _env(0, 2)
    plan = pinning.plan_node(env, "none", environ, (0, 1, 2), _no_gpus)
    assert plan.source == "none" and plan.for_rank(0) == (0, 1, 2)


def _fake_pci(root: Path, name: str, vendor: str, kind: str, cores: str) -> None:
    device = root / name
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "class").write_text(kind + "\n")
    (device / "local_cpulist").write_text(cores + "\n")


def test_gpus_are_found_in_sysfs_in_bus_order_without_their_other_functions(tmp_path, monkeypatch):
    _fake_pci(tmp_path, "0000:c1:00.0", "0x1002", "0x038000", "48-63")   # an AMD Instinct GCD
    _fake_pci(tmp_path, "0000:1b:00.0", "0x10de", "0x030200", "0-15")    # a data-centre NVIDIA GPU
    _fake_pci(tmp_path, "0000:1b:00.1", "0x10de", "0x040300", "0-15")    # its audio function
    _fake_pci(tmp_path, "0000:05:00.0", "0x10de", "0x068000", "0-15")    # an NVSwitch
    _fake_pci(tmp_path, "0000:03:00.0", "0x1a03", "0x030000", "0-15")    # the BMC's VGA
    assert pci_gpus(tmp_path) == ["0000:1b:00.0", "0000:c1:00.0"]
    monkeypatch.setattr(pinning, "pci_gpus", lambda: pci_gpus(tmp_path))
    monkeypatch.setattr(pinning, "gpu_local_cores", lambda address: {"0000:1b:00.0": [0, 1, 2, 3],
                                                                     "0000:c1:00.0": [4, 5, 6, 7]}[address])
    env, environ = _env(0, 2)
    assert pinning.sysfs_gpu_cores(env, environ) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # restricted (SLURM numbers a job's own GPUs from 0), hidden, or fewer GPUs than ranks: not knowable
    # before torch starts, and on such a GPU node the hook leaves the binding to gpuscale.init()
    for visible in ("1,0", "", "GPU-5e3a"):
        assert pinning.sysfs_gpu_cores(env, {**environ, "CUDA_VISIBLE_DEVICES": visible}) is None
    assert pinning.sysfs_gpu_cores(*_env(0, 3)) is None
    assert pinning.gpus_known_only_to_torch({"CUDA_VISIBLE_DEVICES": "0,1"}) and not pinning.gpus_known_only_to_torch({})
    assert pinning.place_this_rank({**environ, "CUDA_VISIBLE_DEVICES": "0,1"}) is None
    plan = pinning.plan_node(env, "auto", environ, range(8), lambda: pinning.sysfs_gpu_cores(env, environ))
    assert plan.source == "gpu-local" and plan.cores == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_thread_pools_follow_the_cores_unless_the_user_chose():
    environ = {"OMP_NUM_THREADS": "1", "GPUSCALE_OMP_FROM_LAUNCHER": "1"}  # gpuscale run's placeholder for torchrun
    pinning.size_thread_pools(4, environ)
    assert environ == {"OMP_NUM_THREADS": "4", "TOKENIZERS_PARALLELISM": "false"}
    mine = {"OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "true"}
    pinning.size_thread_pools(4, mine)
    assert mine == {"OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "true"}


def test_only_the_process_that_placed_itself_counts_as_placed(monkeypatch):
    monkeypatch.setenv("GPUSCALE_PLACED", f"{os.getpid()}:even-split")
    assert pinning.placed_source() == "even-split"
    monkeypatch.setenv("GPUSCALE_PLACED", f"{os.getpid() + 1}:even-split")  # a parent's: this is its child
    assert pinning.placed_source() is None
    assert pinning.place_this_rank({"RANK": "0", "GPUSCALE_PLACED": "1:even-split"}) is None  # and it keeps its cores


SHOW = """
import json, os, sys
seen = {"torch_loaded": "torch" in sys.modules, "cores": sorted(os.sched_getaffinity(0)),
        "omp": os.environ.get("OMP_NUM_THREADS"), "placed": os.environ.get("GPUSCALE_PLACED", "")}
import torch
seen["threads"] = torch.get_num_threads()
print(json.dumps(seen))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to place two ranks apart")
def test_the_start_up_hook_places_a_rank_before_its_first_line_without_torch(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    cores = sorted(os.sched_getaffinity(0))
    seen = []
    for rank in (0, 1):
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCALE_", "SLURM_", "OMP_"))}
        environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", GROUP_RANK="0",
                       TORCHELASTIC_RUN_ID="t", PYTHONPATH=os.pathsep.join([SITE_DIR, str(ROOT / "src")]),
                       OMP_NUM_THREADS="1", GPUSCALE_OMP_FROM_LAUNCHER="1", CUDA_VISIBLE_DEVICES="")
        result = subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        seen.append(json.loads(result.stdout))
    half = len(cores) // 2
    assert [s["cores"] for s in seen] == [cores[:half + len(cores) % 2], cores[half + len(cores) % 2:]]
    for s in seen:
        assert not s["torch_loaded"] and s["omp"] == str(len(s["cores"])) == str(s["threads"])
        assert s["placed"].endswith(":even-split")


@pytest.mark.parametrize("first", ["gpuscale.runtime.init", "gpuscale.measure.monitor", "gpuscale.base.batches", "torch"])
def test_the_hooks_wait_for_a_gpuscale_module_that_imported_torch(tmp_path, first):
    """The after-torch hooks import gpuscale modules; when one of those imported torch, they must not meet it half
    made (an ImportError "partially initialized module"): they run at the next import instead."""
    code = (f"import {first}, sys, decimal\n"
            "recorder = sys.modules.get('gpuscale.measure.probe.recorder')\n"
            "print(recorder is not None and recorder.ACTIVE is not None, 'gpuscale.runtime.teardown' in sys.modules)")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCALE_", "SLURM_"))}
    environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", GPUSCALE_BIND="none", GPUSCALE_PROBE_DIR=str(tmp_path),
                   PYTHONPATH=os.pathsep.join([SITE_DIR, str(ROOT / "src")]))
    result = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.split() == ["True", "True"]


def test_a_child_of_a_rank_ignores_slurms_warning_and_keeps_its_cores(tmp_path):
    """SLURM hands USR1 to every process of the step: a rank's spawned DataLoader worker or subprocess must not
    die of it (the rank stops at its checkpoint); it keeps the cores it inherits instead of being placed anew."""
    script = tmp_path / "parent.py"
    script.write_text("import os, subprocess, sys\n"
                      "print(os.environ['GPUSCALE_PLACED'].split(':')[0] == str(os.getpid()))\n"
                      "code = 'import os, signal; print(signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN, "
                      "sorted(os.sched_getaffinity(0)))'\n"
                      "print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout.strip())\n"
                      "import signal; print(signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL, sorted(os.sched_getaffinity(0)))\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCALE_", "SLURM_", "OMP_"))}
    environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", GROUP_RANK="0", TORCHELASTIC_RUN_ID="t",
                   CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([SITE_DIR, str(ROOT / "src")]))
    result = subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    placed, child, parent = result.stdout.splitlines()
    assert placed == "True"
    assert child.split(" ", 1)[0] == "True" and parent.split(" ", 1)[0] == "True"  # the rank itself keeps USR1's default
    assert child.split(" ", 1)[1] == parent.split(" ", 1)[1]  # the child's cores are its rank's


def test_on_a_node_without_gpus_accelerate_is_told_to_distribute_over_the_ranks(monkeypatch):
    """As `accelerate launch --cpu` does: without ACCELERATE_USE_CPU, Accelerate (and the HF Trainer) leaves each of a
    launcher's ranks on its own on a node without GPUs, and N ranks train N copies. Not for one rank, not where the
    node has GPUs (whatever a visibility variable says), never over the user's own choice. DeepSpeed's CPU
    accelerator is told the node's process count, even for one rank."""
    two = detect_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    one = detect_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    monkeypatch.setattr(pinning, "no_gpu_hardware", lambda: True)
    environ: dict[str, str] = {"CUDA_VISIBLE_DEVICES": "0,1"}  # SLURM's GPUs of a node that has none
    assert pinning.distribute_on_cpus(two, environ) and environ["ACCELERATE_USE_CPU"] == "true"
    assert environ["LOCAL_SIZE"] == "2"  # DeepSpeed's CPU accelerator counts its devices from it, as its launcher sets it
    environ = {}
    assert not pinning.distribute_on_cpus(one, environ) and environ == {"LOCAL_SIZE": "1"}  # DeepSpeed's count only
    environ = {"ACCELERATE_USE_CPU": "0", "LOCAL_SIZE": "4"}
    assert not pinning.distribute_on_cpus(two, environ) and environ == {"ACCELERATE_USE_CPU": "0", "LOCAL_SIZE": "4"}
    monkeypatch.setattr(pinning, "no_gpu_hardware", lambda: False)
    environ = {}
    assert not pinning.distribute_on_cpus(two, environ) and environ == {}


def test_the_cpu_flag_gpuscale_set_is_taken_back_for_deepspeed_and_a_users_never(monkeypatch):
    """Accelerate turns DeepSpeed off under ACCELERATE_USE_CPU: gpuscale's Trainer arguments for DeepSpeed take back
    the flag gpuscale set, never one the user set."""
    two = detect_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    monkeypatch.setattr(pinning, "no_gpu_hardware", lambda: True)
    environ: dict[str, str] = {}
    pinning.distribute_on_cpus(two, environ)
    pinning.withdraw_cpu_flag(environ)
    assert environ == {"LOCAL_SIZE": "2"}  # DeepSpeed's CPU device count stays: DeepSpeed reads it
    users = {"ACCELERATE_USE_CPU": "1"}
    pinning.withdraw_cpu_flag(users)
    assert users == {"ACCELERATE_USE_CPU": "1"}
