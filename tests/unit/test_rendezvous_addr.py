"""The rendezvous endpoint is a node of the job, never a wildcard address (issue 6: security).

Where it comes from: MASTER_ADDR (checked by every detector), ``gpuscale run --master-addr``
(checked before torchrun starts), the first node of the SLURM job (batch scripts compute it).
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import subprocess

import pytest

import gpuscale.cli.run
from gpuscale.detect.env import check_master_addr, detect_env
from gpuscale.slurm.profiles import load_profile
from gpuscale.slurm.render import JobSpec, render_sbatch

WILDCARDS = ["0.0.0.0", "::", "[::]", "*", "", "  ", "0", "0.0", "00.0.0.0", "0:0:0:0:0:0:0:0", "::0"]
HOSTS = ["n1", "nid005001", "node0.cluster.example.org", "10.0.0.1", "127.0.0.1", "localhost", "::1", "fe80::1", "0node"]


@pytest.mark.parametrize("addr", WILDCARDS)
def test_wildcard_addresses_are_refused_in_one_line_that_says_what_to_use(addr):
    with pytest.raises(ValueError) as info:
        check_master_addr(addr)
    message = str(info.value)
    assert "\n" not in message and repr(addr) in message
    assert "wildcard" in message and "host name of node 0" in message
    with pytest.raises(ValueError, match="^--master-addr="):
        check_master_addr(addr, "--master-addr")


@pytest.mark.parametrize("addr", HOSTS)
def test_hosts_pass(addr):
    assert check_master_addr(addr) == addr


def _torchrun(addr):
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
            "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": addr, "MASTER_PORT": "29400"}


def _srun(addr=None):
    env = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
           "SLURM_STEP_NODELIST": "nid[005001-005002]"}
    return env if addr is None else {**env, "MASTER_ADDR": addr}


def _manual(addr):
    return {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": addr, "MASTER_PORT": "12345"}


@pytest.mark.parametrize("environ", [_torchrun, _srun, _manual], ids=["torchrun", "srun", "manual"])
@pytest.mark.parametrize("addr", ["0.0.0.0", "::", "*", ""])
def test_every_detector_refuses_a_wildcard_master_addr(environ, addr):
    with pytest.raises(ValueError, match=r"MASTER_ADDR=.*wildcard.*host name of node 0"):
        detect_env(environ(addr))


def test_detectors_keep_a_real_host_and_srun_defaults_to_the_first_node_of_the_step():
    assert detect_env(_torchrun("n1")).master_addr == "n1"
    assert detect_env(_manual("10.0.0.1")).master_addr == "10.0.0.1"
    assert detect_env(_srun()).master_addr == "nid005001"
    assert detect_env(_srun("nid005001")).master_addr == "nid005001"


def test_one_process_has_no_rendezvous_so_a_stray_master_addr_does_not_matter():
    assert detect_env({"MASTER_ADDR": "0.0.0.0"}).launcher == "single"
    assert detect_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "0.0.0.0"}).world_size == 1


# `gpuscale run --master-addr 0.0.0.0` is refused too (cli/run.py's torchrun_argv).
@pytest.mark.parametrize("nnodes", [1, 2])
def test_gpuscale_run_refuses_a_wildcard_master_addr(nnodes):
    args = argparse.Namespace(nnodes=nnodes, node_rank=0, master_addr="0.0.0.0", master_port=12345, max_restarts=0,
                              module=False, script="train.py", script_args=[])
    with pytest.raises(ValueError, match=r"^--master-addr='0.0.0.0' is a wildcard"):
        gpuscale.cli.run.torchrun_argv(args, 2, {})
    args.master_addr = "node0"
    assert "node0" in gpuscale.cli.run.torchrun_argv(args, 2, {})


@pytest.fixture
def fake_scontrol(tmp_path):
    """`scontrol show hostnames LIST` as SLURM answers it, for running a batch script's preamble here."""
    tool = tmp_path / "bin" / "scontrol"
    tool.parent.mkdir()
    # answers only for the node list the test sets: proof the script asks about the job's own nodes
    tool.write_text("#!/bin/sh\n[ \"$*\" = 'show hostnames gpu-[0017-0018]' ] || exit 2\nprintf 'gpu-0017\\ngpu-0018\\n'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool.parent


@pytest.mark.parametrize("mode", ["torchrun", "srun"])
@pytest.mark.parametrize("profile", ["local", "lumi-g", "generic-nvidia"])
def test_batch_scripts_meet_on_the_first_node_of_the_job(fake_scontrol, profile, mode):
    """The rendered script's own lines compute MASTER_ADDR: run them with a job's node list."""
    keeps = {"account": "project_1", "container": "/scratch/project_1/torch.sif"} if profile == "lumi-g" else {}
    text = render_sbatch(load_profile(profile), JobSpec(script="train.py", nodes=2, gpus_per_node=1, mode=mode, **keeps))
    assert not re.search(r"0\.0\.0\.0|\[::\]|\*:\$|\blocalhost\b", text)
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("MASTER_ADDR="))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("export MASTER_ADDR"))
    preamble = "\n".join([*lines[start:end + 1], 'echo "$MASTER_ADDR $MASTER_PORT"'])
    env = {**os.environ, "PATH": f"{fake_scontrol}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-[0017-0018]",
           "SLURM_JOB_ID": "123456"}
    result = subprocess.run(["bash", "-euc", preamble], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["gpu-0017", "13456"]
    if mode == "torchrun":  # across nodes torchrun's c10d rendezvous is that host, not one it picks
        assert '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"' in text
