"""Unit tests for gpuscale.detect.env: every launcher, derived addresses and ports, and the classic mistakes.

Every test builds its environment as an explicit dict: nothing depends on the machine's variables.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import subprocess
import sys

import pytest

from gpuscale.detect.env import (
    DEFAULT_PORT,
    DistEnv,
    check_one_launcher_per_node,
    detect_env,
    device_index,
    expand_hostlist,
    port_from_job_id,
    tasks_per_node,
    visible_devices,
)
from gpuscale.slurm.render import JobSpec, render_sbatch

from lumi import lumi_g_for_other_tests

# --------------------------------------------------------------------------------------------------
# environment builders (what each launcher really sets)


def torchrun_env(rank, world, local_rank, local_world, group_rank=0, addr="127.0.0.1", port="29400", **extra):
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(group_rank),
        "ROLE_RANK": str(rank),
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
    }
    env.update(extra)
    return env


def batch_shell_env(job_id="4567890", ntasks=8, nodes=1, nodelist="nid005001", tasks_per_node="8", **extra):
    """The batch script's own shell: SLURM_PROCID=0 etc. but no step id."""
    env = {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_GPUS_ON_NODE": "8",
    }
    env.update(extra)
    return env


def srun_task_env(procid, localid, nodeid, ntasks, nnodes, step_tasks_per_node, nodelist,
                  job_id="4567890", step_id="0", **extra):
    """One task of an srun step."""
    env = batch_shell_env(job_id=job_id, ntasks=ntasks, nodes=nnodes, nodelist=nodelist,
                          tasks_per_node=step_tasks_per_node)
    env.update({
        "SLURM_STEP_ID": step_id,
        "SLURM_STEPID": step_id,
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": step_tasks_per_node,
    })
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------------
# plain process, manual


def test_plain_process_is_single():
    env = detect_env({"HOME": "/root", "PATH": "/usr/bin"})
    assert env.launcher == "single"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (0, 0, 1, 1)
    assert (env.node_rank, env.num_nodes) == (0, 1)
    assert env.master_port == DEFAULT_PORT
    assert env.job_id is None
    assert not env.is_distributed
    assert env.is_main


def test_empty_environment_is_single():
    assert detect_env({}).launcher == "single"


def test_dist_env_is_frozen():
    env = detect_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.rank = 3  # type: ignore[misc]


def test_manual_two_processes_on_one_node():
    base = {"WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "12345"}
    envs = [detect_env({**base, "RANK": str(r)}) for r in range(2)]
    for r, env in enumerate(envs):
        assert env.launcher == "manual"
        assert env.rank == r
        assert env.local_rank == r  # LOCAL_RANK defaults to RANK on one node
        assert env.world_size == 2 and env.local_world_size == 2
        assert (env.node_rank, env.num_nodes) == (0, 1)
        assert env.master_addr == "10.0.0.1" and env.master_port == 12345
        assert env.is_distributed
    assert envs[0].is_main and not envs[1].is_main


def test_manual_two_nodes_with_local_world_size():
    env = detect_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "node0"})
    assert env.launcher == "manual"
    assert (env.rank, env.local_rank, env.node_rank, env.num_nodes) == (5, 1, 1, 2)


def test_manual_world_size_one_is_single():
    env = detect_env({"RANK": "0", "WORLD_SIZE": "1"})
    assert env.launcher == "single"
    assert env.world_size == 1


def test_manual_world_size_without_master_addr_fails():
    with pytest.raises(ValueError) as info:
        detect_env({"RANK": "0", "WORLD_SIZE": "2"})
    msg = str(info.value)
    assert "WORLD_SIZE=2" in msg
    assert "MASTER_ADDR" in msg  # what is missing ...
    assert "set MASTER_ADDR" in msg  # ... and the fix


def test_manual_rank_without_world_size_fails():
    with pytest.raises(ValueError) as info:
        detect_env({"RANK": "1", "MASTER_ADDR": "10.0.0.1"})
    msg = str(info.value)
    assert "WORLD_SIZE not set" in msg
    assert "RANK" in msg
    assert "together" in msg  # the fix: set them together


def test_manual_world_size_without_rank_fails():
    with pytest.raises(ValueError) as info:
        detect_env({"WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"})
    msg = str(info.value)
    assert "RANK not set" in msg
    assert "together" in msg


@pytest.mark.parametrize("rank", ["2", "-1", "17"])
def test_manual_rank_out_of_range_fails(rank):
    with pytest.raises(ValueError) as info:
        detect_env({"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    msg = str(info.value)
    assert f"RANK={rank}" in msg
    assert "0..1" in msg and "WORLD_SIZE=2" in msg


@pytest.mark.parametrize("name,value", [("RANK", "one"), ("WORLD_SIZE", "2.0"), ("WORLD_SIZE", "two"),
                                        ("LOCAL_RANK", "x"), ("MASTER_PORT", "http")])
def test_manual_non_integer_fails(name, value):
    environ = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1234"}
    environ[name] = value
    with pytest.raises(ValueError) as info:
        detect_env(environ)
    msg = str(info.value)
    assert name in msg and repr(value) in msg
    assert "not an integer" in msg and "whole number" in msg


def test_manual_world_size_not_multiple_of_local_world_size_fails():
    with pytest.raises(ValueError) as info:
        detect_env({"RANK": "0", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h"})
    msg = str(info.value)
    assert "WORLD_SIZE=6" in msg and "LOCAL_WORLD_SIZE=4" in msg


def test_manual_world_size_zero_is_value_error():
    with pytest.raises(ValueError, match="WORLD_SIZE=0"):
        detect_env({"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "h"})


def test_manual_local_world_size_zero_is_value_error():
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        detect_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "0", "MASTER_ADDR": "h"})


def test_manual_in_batch_shell_is_manual_not_slurm():
    # Hand-set ranks in the batch shell itself (no srun step): SLURM's variables do not count.
    env = detect_env(batch_shell_env(RANK="1", WORLD_SIZE="2", MASTER_ADDR="nid005001"))
    assert env.launcher == "manual"
    assert env.rank == 1 and env.world_size == 2
    assert env.job_id == "4567890"


# --------------------------------------------------------------------------------------------------
# torchrun


def test_torchrun_single_node():
    envs = [detect_env(torchrun_env(r, 4, r, 4)) for r in range(4)]
    for r, env in enumerate(envs):
        assert env.launcher == "torchrun"
        assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (r, r, 4, 4)
        assert (env.node_rank, env.num_nodes) == (0, 1)
        assert env.master_addr == "127.0.0.1" and env.master_port == 29400
        assert env.job_id is None


def test_torchrun_multi_node():
    env = detect_env(torchrun_env(rank=13, world=16, local_rank=5, local_world=8, group_rank=1, addr="nid005001"))
    assert env.launcher == "torchrun"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (13, 5, 16, 8)
    assert (env.node_rank, env.num_nodes) == (1, 2)
    assert env.master_addr == "nid005001"


def test_torchrun_detected_by_run_id_alone():
    environ = torchrun_env(1, 2, 1, 2)
    del environ["GROUP_RANK"]
    env = detect_env(environ)
    assert env.launcher == "torchrun"
    assert env.node_rank == 0


def test_torchrun_inside_slurm_batch_shell_wins_over_slurm():
    # One task with all CPUs, torchrun started from the batch shell: SLURM says procid 0 of 1 task.
    environ = {**batch_shell_env(ntasks=1, tasks_per_node="1"), **torchrun_env(3, 8, 3, 8, port="29401")}
    env = detect_env(environ)
    assert env.launcher == "torchrun"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 3, 8, 8)
    assert env.job_id == "4567890"
    assert env.master_port == 29401


def test_torchrun_inside_srun_step_one_task_per_node_wins_over_slurm():
    # Many nodes, torchrun: srun starts one torchrun per node (SLURM_STEP_TASKS_PER_NODE=1(x2)).
    slurm = srun_task_env(procid=1, localid=0, nodeid=1, ntasks=2, nnodes=2,
                          step_tasks_per_node="1(x2)", nodelist="nid[005001-005002]")
    environ = {**slurm, **torchrun_env(rank=9, world=16, local_rank=1, local_world=8, group_rank=1, addr="nid005001")}
    env = detect_env(environ)
    assert env.launcher == "torchrun"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (9, 1, 16, 8)
    assert (env.node_rank, env.num_nodes) == (1, 2)
    assert env.master_addr == "nid005001"


def test_torchrun_without_master_port_takes_port_from_slurm_job():
    environ = {**batch_shell_env(job_id="4567890"), **torchrun_env(0, 2, 0, 2)}
    del environ["MASTER_PORT"]
    assert detect_env(environ).master_port == 17890


def test_several_torchruns_started_by_srun_on_one_node_fails():
    # --ntasks-per-node=8 and a torchrun in each task: 8 launchers x 8 workers.
    slurm = srun_task_env(procid=2, localid=2, nodeid=0, ntasks=8, nnodes=1,
                          step_tasks_per_node="8", nodelist="nid005001")
    environ = {**slurm, **torchrun_env(3, 8, 3, 8)}
    with pytest.raises(ValueError) as info:
        detect_env(environ)
    msg = str(info.value)
    assert "8 times" in msg  # what was found
    assert "SLURM_STEP_TASKS_PER_NODE=8" in msg
    assert "--ntasks-per-node=1" in msg  # the fix


@pytest.mark.parametrize("name,value", [("WORLD_SIZE", "eight"), ("RANK", ""), ("LOCAL_RANK", "0x1")])
def test_torchrun_bad_values_fail(name, value):
    environ = torchrun_env(0, 8, 0, 8)
    environ[name] = value
    with pytest.raises(ValueError, match=name):
        detect_env(environ)


def test_torchrun_rank_out_of_range_fails():
    with pytest.raises(ValueError) as info:
        detect_env(torchrun_env(8, 8, 0, 8))
    assert "RANK=8" in str(info.value) and "0..7" in str(info.value)


def test_torchrun_local_rank_out_of_range_fails():
    with pytest.raises(ValueError) as info:
        detect_env(torchrun_env(1, 8, 4, 4))
    msg = str(info.value)
    assert "LOCAL_RANK=4" in msg and "LOCAL_WORLD_SIZE=4" in msg


# --------------------------------------------------------------------------------------------------
# srun steps


def test_srun_step_one_node():
    envs = [
        detect_env(srun_task_env(procid=r, localid=r, nodeid=0, ntasks=8, nnodes=1,
                                 step_tasks_per_node="8", nodelist="nid005001"))
        for r in range(8)
    ]
    for r, env in enumerate(envs):
        assert env.launcher == "slurm"
        assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (r, r, 8, 8)
        assert (env.node_rank, env.num_nodes) == (0, 1)
        assert env.master_addr == "nid005001"
        assert env.master_port == 17890  # 1 + last four digits of 4567890
        assert env.job_id == "4567890"


def test_srun_step_two_nodes():
    nodelist = "nid[005001-005002]"
    env = detect_env(srun_task_env(procid=13, localid=5, nodeid=1, ntasks=16, nnodes=2,
                                   step_tasks_per_node="8(x2)", nodelist=nodelist))
    assert env.launcher == "slurm"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (13, 5, 16, 8)
    assert (env.node_rank, env.num_nodes) == (1, 2)
    assert env.master_addr == "nid005001"  # first host of the step's node list


def test_srun_step_heterogeneous_tasks_per_node():
    # 5 tasks on 3 nodes: 2, 2, 1.
    nodelist = "n[1-3]"
    layout = [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1), (4, 0, 2)]
    expected_local_world = [2, 2, 2, 2, 1]
    for (procid, localid, nodeid), lws in zip(layout, expected_local_world, strict=True):
        env = detect_env(srun_task_env(procid=procid, localid=localid, nodeid=nodeid, ntasks=5, nnodes=3,
                                       step_tasks_per_node="2(x2),1", nodelist=nodelist))
        assert env.rank == procid and env.local_rank == localid
        assert env.node_rank == nodeid and env.num_nodes == 3
        assert env.world_size == 5
        assert env.local_world_size == lws
        assert env.master_addr == "n1"


def test_srun_step_master_addr_from_step_nodelist_not_job_nodelist():
    environ = srun_task_env(procid=0, localid=0, nodeid=0, ntasks=2, nnodes=1,
                            step_tasks_per_node="2", nodelist="nid005002")
    environ["SLURM_JOB_NODELIST"] = environ["SLURM_NODELIST"] = "nid[005001-005002]"
    assert detect_env(environ).master_addr == "nid005002"


def test_srun_step_explicit_master_addr_and_port_win():
    environ = srun_task_env(procid=1, localid=1, nodeid=0, ntasks=2, nnodes=1,
                            step_tasks_per_node="2", nodelist="nid005001",
                            MASTER_ADDR="myhost", MASTER_PORT="23456")
    env = detect_env(environ)
    assert env.master_addr == "myhost"
    assert env.master_port == 23456


def test_srun_step_one_node_without_nodelist_uses_hostname():
    environ = srun_task_env(procid=0, localid=0, nodeid=0, ntasks=2, nnodes=1,
                            step_tasks_per_node="2", nodelist="x")
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        del environ[name]
    assert detect_env(environ).master_addr == socket.gethostname()


def test_srun_step_two_nodes_without_nodelist_fails():
    environ = srun_task_env(procid=0, localid=0, nodeid=0, ntasks=2, nnodes=2,
                            step_tasks_per_node="1(x2)", nodelist="x")
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        del environ[name]
    with pytest.raises(ValueError) as info:
        detect_env(environ)
    msg = str(info.value)
    assert "SLURM_STEP_NODELIST" in msg and "set MASTER_ADDR" in msg


def test_srun_step_with_correct_hand_set_variables_is_fine():
    # The course: RANK=\$SLURM_PROCID LOCAL_RANK=\$SLURM_LOCALID WORLD_SIZE=$SLURM_NPROCS, escaped right.
    environ = srun_task_env(procid=3, localid=3, nodeid=0, ntasks=4, nnodes=1,
                            step_tasks_per_node="4", nodelist="nid005001",
                            RANK="3", LOCAL_RANK="3", WORLD_SIZE="4", MASTER_ADDR="nid005001")
    env = detect_env(environ)
    assert env.launcher == "slurm" and env.rank == 3 and env.world_size == 4


def test_srun_step_rank_expanded_once_by_batch_shell_fails():
    environ = srun_task_env(procid=3, localid=3, nodeid=0, ntasks=4, nnodes=1,
                            step_tasks_per_node="4", nodelist="nid005001", RANK="0")
    with pytest.raises(ValueError) as info:
        detect_env(environ)
    msg = str(info.value)
    assert "RANK=0" in msg and "SLURM_PROCID=3" in msg  # what was found
    assert "batch shell" in msg  # why
    assert "\\$SLURM_PROCID" in msg and "unset" in msg  # the fix


def test_srun_step_local_rank_expanded_once_fails():
    environ = srun_task_env(procid=1, localid=1, nodeid=0, ntasks=2, nnodes=1,
                            step_tasks_per_node="2", nodelist="nid005001", LOCAL_RANK="0")
    with pytest.raises(ValueError) as info:
        detect_env(environ)
    msg = str(info.value)
    assert "LOCAL_RANK=0" in msg and "SLURM_LOCALID=1" in msg
    assert "\\$SLURM_LOCALID" in msg


@pytest.mark.parametrize("count_var", ["SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"])
def test_srun_step_world_size_disagreeing_with_step_fails(count_var):
    environ = srun_task_env(procid=0, localid=0, nodeid=0, ntasks=4, nnodes=1,
                            step_tasks_per_node="4", nodelist="nid005001", WORLD_SIZE="8")
    if count_var == "SLURM_NTASKS":
        del environ["SLURM_STEP_NUM_TASKS"]
    with pytest.raises(ValueError) as info:
        detect_env(environ)
    msg = str(info.value)
    assert "WORLD_SIZE=8" in msg and "=4" in msg  # what was found
    assert "--ntasks" in msg and "leave WORLD_SIZE unset" in msg  # the fix


@pytest.mark.parametrize("name,value", [("SLURM_PROCID", "zero"), ("SLURM_LOCALID", "1.5"),
                                        ("SLURM_STEP_NUM_TASKS", "four"), ("RANK", "r0")])
def test_srun_step_non_integer_fails(name, value):
    environ = srun_task_env(procid=0, localid=0, nodeid=0, ntasks=4, nnodes=1,
                            step_tasks_per_node="4", nodelist="nid005001")
    environ[name] = value
    with pytest.raises(ValueError) as info:
        detect_env(environ)
    msg = str(info.value)
    assert name in msg and repr(value) in msg and "not an integer" in msg


def test_srun_step_bad_tasks_per_node_fails():
    environ = srun_task_env(procid=0, localid=0, nodeid=0, ntasks=4, nnodes=1,
                            step_tasks_per_node="four", nodelist="nid005001")
    with pytest.raises(ValueError, match="tasks-per-node"):
        detect_env(environ)


def test_srun_step_procid_out_of_range_fails():
    environ = srun_task_env(procid=4, localid=0, nodeid=0, ntasks=4, nnodes=1,
                            step_tasks_per_node="4", nodelist="nid005001")
    with pytest.raises(ValueError) as info:
        detect_env(environ)
    msg = str(info.value)
    assert "RANK=4" in msg and "0..3" in msg and "srun" in msg


def test_srun_step_node_id_out_of_range_is_value_error():
    environ = srun_task_env(procid=2, localid=0, nodeid=2, ntasks=4, nnodes=2,
                            step_tasks_per_node="2(x2)", nodelist="n[1-2]")
    with pytest.raises(ValueError, match="SLURM_NODEID"):
        detect_env(environ)


def test_srun_step_detected_by_old_stepid_name():
    environ = srun_task_env(procid=1, localid=1, nodeid=0, ntasks=2, nnodes=1,
                            step_tasks_per_node="2", nodelist="nid005001")
    del environ["SLURM_STEP_ID"]
    assert detect_env(environ).launcher == "slurm"


def _srun_task_environment(tmp_path, task_env: dict[str, str]) -> dict[str, str]:
    """The environment a task of a rendered srun-mode batch script gives its script: bash runs the task's own
    command line (with the task's SLURM variables) and the 'script' dumps what it got."""
    dump = tmp_path / "dump.py"
    dump.write_text("import json, os, sys\njson.dump(dict(os.environ), open(sys.argv[1], 'w'))\n")
    job = JobSpec(script=str(dump), script_args=(str(tmp_path / "env.json"),), mode="srun", nodes=2, gpus_per_node=8,
                  python=sys.executable)
    line = next(line for line in render_sbatch(lumi_g_for_other_tests(), job).splitlines() if line.startswith("srun "))
    argv = shlex.split(line.rstrip(" &"))
    command = argv[argv.index("-c") + 1]
    result = subprocess.run(["bash", "-c", command], env={"PATH": os.environ["PATH"], **task_env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "env.json").read_text())


def test_a_gpuscale_srun_task_carries_torchruns_variables_and_is_still_srun(tmp_path):
    """In srun mode gpuscale's batch scripts export what torchrun gives a worker, with a marker: gpuscale still sees
    srun (which placed the task on its cores); a torchrun worker with the same variables and no marker is torchrun's."""
    task = srun_task_env(procid=13, localid=5, nodeid=1, ntasks=16, nnodes=2, step_tasks_per_node="8(x2)",
                         nodelist="nid[005001-005002]")
    environ = _srun_task_environment(tmp_path, task)
    assert {name: environ[name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                              "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                                              "TORCHELASTIC_RUN_ID")} == {
        "RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "13", "ROLE_WORLD_SIZE": "16", "ROLE_NAME": "default",
        "TORCHELASTIC_RUN_ID": "4567890"}
    env = detect_env(environ)
    assert env.launcher == "slurm"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank, env.num_nodes) == (13, 5, 16, 8, 1, 2)
    # unmarked, the same variables are a torchrun worker's (outside a step: inside, 8 torchruns per node are refused)
    worker = {name: value for name, value in environ.items() if not name.startswith("SLURM_")}
    for unmarked in ("", "0"):
        assert detect_env({**worker, "GPUSCALE_SRUN_TASK": unmarked}).launcher == "torchrun"
    del worker["GPUSCALE_SRUN_TASK"]
    assert detect_env(worker).launcher == "torchrun"


# --------------------------------------------------------------------------------------------------
# the batch shell (no step id)


def test_slurm_batch_shell_is_single():
    env = detect_env(batch_shell_env(ntasks=8, nodes=2, nodelist="nid[005001-005002]", tasks_per_node="4(x2)"))
    assert env.launcher == "single"
    assert (env.rank, env.world_size, env.local_world_size, env.num_nodes) == (0, 1, 1, 1)
    assert env.job_id == "4567890"
    assert env.master_port == 17890


# --------------------------------------------------------------------------------------------------
# ports


@pytest.mark.parametrize("job_id,port", [("4567890", 17890), (4567890, 17890), ("12345", 12345),
                                         ("10000", 10000), ("99999999", 19999), ("42", 10042),
                                         ("4567890_3", 18903)])
def test_port_from_job_id(job_id, port):
    # "1" followed by the job id's last four digits (short ids padded with zeros).
    assert port_from_job_id(job_id) == port
    assert 10000 <= port_from_job_id(job_id) <= 19999


def test_port_from_job_id_without_digits_fails():
    with pytest.raises(ValueError) as info:
        port_from_job_id("abc")
    assert "abc" in str(info.value) and "MASTER_PORT" in str(info.value)


def test_two_jobs_get_different_ports():
    assert port_from_job_id("4567890") != port_from_job_id("4567891")


def test_master_port_wins_over_job_id():
    environ = srun_task_env(procid=0, localid=0, nodeid=0, ntasks=1, nnodes=1,
                            step_tasks_per_node="1", nodelist="n1", MASTER_PORT="23456")
    assert detect_env(environ).master_port == 23456


def test_empty_master_port_is_treated_as_unset():
    environ = srun_task_env(procid=0, localid=0, nodeid=0, ntasks=1, nnodes=1,
                            step_tasks_per_node="1", nodelist="n1", MASTER_PORT="")
    assert detect_env(environ).master_port == 17890


def test_default_port_outside_slurm():
    env = detect_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    assert env.master_port == DEFAULT_PORT == 29500


@pytest.mark.parametrize("port", ["0", "65536", "-5"])
def test_master_port_out_of_range_fails(port):
    with pytest.raises(ValueError) as info:
        detect_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": port})
    msg = str(info.value)
    assert f"MASTER_PORT={port}" in msg and "1024-65535" in msg


# --------------------------------------------------------------------------------------------------
# hostlists, tasks per node


@pytest.mark.parametrize("hostlist,hosts", [
    ("nid005001", ["nid005001"]),
    ("nid[005001-005003]", ["nid005001", "nid005002", "nid005003"]),
    ("nid[08-10]", ["nid08", "nid09", "nid10"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("nid[005001-005003,005007]", ["nid005001", "nid005002", "nid005003", "nid005007"]),
    ("nid[005001-005002,005007],login1", ["nid005001", "nid005002", "nid005007", "login1"]),
    ("a1,b2,c3", ["a1", "b2", "c3"]),
    ("gpu[1-2],cpu[01-02]", ["gpu1", "gpu2", "cpu01", "cpu02"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("node[1,3,5]", ["node1", "node3", "node5"]),
    ("x[7]", ["x7"]),
    ("  n[1-2]  ", ["n1", "n2"]),
    ("", []),
])
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("spec,counts", [
    ("8", [8]),
    ("4(x2),3", [4, 4, 3]),
    ("2(x2),1", [2, 2, 1]),
    ("1(x4)", [1, 1, 1, 1]),
    ("1,2,3", [1, 2, 3]),
])
def test_tasks_per_node(spec, counts):
    assert tasks_per_node(spec) == counts


@pytest.mark.parametrize("spec", ["", "four", "2(x)", "2x2", "(x2)"])
def test_tasks_per_node_bad_spec_fails(spec):
    with pytest.raises(ValueError, match="tasks-per-node"):
        tasks_per_node(spec)


# --------------------------------------------------------------------------------------------------
# visible devices, device index


def test_visible_devices_unrestricted():
    assert visible_devices({}) is None


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"])
def test_visible_devices_each_variable(name):
    assert visible_devices({name: "0,1,3"}) == ["0", "1", "3"]
    assert visible_devices({name: "2"}) == ["2"]
    assert visible_devices({name: ""}) == []


def test_visible_devices_innermost_restriction_decides():
    # ROCR first, then HIP/CUDA index into what it left: with --gpus-per-task=1 both say one GPU.
    assert visible_devices({"ROCR_VISIBLE_DEVICES": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "1"}) == ["1"]
    assert visible_devices({"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "0"}) == ["0"]


def _env(local_rank, local_world, launcher="torchrun"):
    return DistEnv(rank=local_rank, local_rank=local_rank, world_size=local_world, local_world_size=local_world,
                   node_rank=0, num_nodes=1, master_addr="h", master_port=1, launcher=launcher)


def test_device_index_is_local_rank_when_enough_gpus():
    assert [device_index(_env(r, 8), 8) for r in range(8)] == list(range(8))
    assert [device_index(_env(r, 2), 4) for r in range(2)] == [0, 1]


def test_device_index_one_visible_gpu_per_task_is_zero():
    # srun --gpus-per-task=1: every task sees its own GPU as device 0.
    assert [device_index(_env(r, 8, launcher="slurm"), 1) for r in range(8)] == [0] * 8


def test_device_index_too_few_gpus_fails_on_every_rank():
    # 4 processes, 2 GPUs: ranks 0 and 1 would fit, but they must fail too, or 2 and 3 hang them.
    for r in range(4):
        with pytest.raises(ValueError) as info:
            device_index(_env(r, 4), 2)
        msg = str(info.value)
        assert "only 2 GPUs are visible" in msg
        assert "at most 2 processes per node" in msg


def test_device_index_no_gpu_fails():
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        device_index(_env(0, 1), 0)


def test_device_index_torchrun_workers_sharing_one_visible_gpu_fail():
    for r in range(8):
        with pytest.raises(ValueError):
            device_index(_env(r, 8, launcher="torchrun"), 1)


# --------------------------------------------------------------------------------------------------
# one launcher per node


def test_one_launcher_per_node_outside_step_is_fine():
    check_one_launcher_per_node({})
    check_one_launcher_per_node(batch_shell_env(tasks_per_node="8"))  # batch shell: no step


def test_one_launcher_per_node_one_task_per_node_is_fine():
    check_one_launcher_per_node({"SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x4)"})
    check_one_launcher_per_node({"SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "1"})


def test_one_launcher_per_node_several_tasks_fails():
    with pytest.raises(ValueError) as info:
        check_one_launcher_per_node({"SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "8"}, workers_per_launcher=8)
    msg = str(info.value)
    assert "8 times" in msg and "8 workers" in msg
    assert "--ntasks-per-node=1" in msg and "one task per GPU" in msg


def test_one_launcher_per_node_heterogeneous_layout_fails():
    with pytest.raises(ValueError, match="2 times"):
        check_one_launcher_per_node({"SLURM_STEP_ID": "3", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1"})


def test_one_launcher_per_node_falls_back_to_tasks_per_node():
    with pytest.raises(ValueError, match="4 times"):
        check_one_launcher_per_node({"SLURM_STEP_ID": "0", "SLURM_TASKS_PER_NODE": "4"})
