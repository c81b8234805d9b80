"""Hostile input through the real local SLURM: a job name that could smuggle an #SBATCH line or a
command is refused before anything is submitted; hostile script arguments and --env values reach the
script byte for byte, and their payload (``touch PAYLOAD`` in several shell spellings) never runs.
tests/unit/test_hostile_input.py does the same with random values and stand-ins for srun.
"""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.slurm

ARGS = ["a b", "it's", '"$(touch PAYLOAD)"', "`touch PAYLOAD`", "; touch PAYLOAD", "&& touch PAYLOAD", "$HOME", "${PATH}",
        "line\nbreak", "back\\slash\\", "*", "é 日本 🙂", "--x=$(touch PAYLOAD)", "", "'", '"']
ENV = {"GS_SUBST": "$(touch PAYLOAD)", "GS_TICKS": "`touch PAYLOAD`; touch PAYLOAD", "GS_QUOTES": "it's \"quoted\"\nnext line",
       "GS_VARS": "$HOME ${PATH} \\"}
DUMP = """import json, os, sys
from pathlib import Path
Path(__file__).with_name("seen.json").write_text(json.dumps(
    {"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items() if k.startswith("GS_")}}))
"""


def _job_names(cluster) -> list[str]:
    result = subprocess.run(["squeue", "-h", "-o", "%j"], env=cluster.env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("name", ["x\n#SBATCH --uid=0", "$(touch PAYLOAD)", "a b"])
def test_a_hostile_job_name_is_refused_and_nothing_is_submitted(cluster, tmp_path, name):
    (tmp_path / "dump.py").write_text(DUMP)
    before = _job_names(cluster)
    result = cluster.gpuscale("slurm", "submit", "--profile", "local", "--gpus-per-node", "1", "--mode", "srun", "--time", "5",
                              "--job-name", name, "--", str(tmp_path / "dump.py"), cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gpuscale slurm submit: error: --job-name") and result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""  # no job id: sbatch never ran
    assert _job_names(cluster) == before and not (tmp_path / "PAYLOAD").exists()


def test_hostile_arguments_and_environment_arrive_verbatim_and_run_nothing(cluster, tmp_path):
    (tmp_path / "dump.py").write_text(DUMP)
    env = [f"--env={name}={value}" for name, value in ENV.items()]
    result = cluster.gpuscale("slurm", "submit", "--profile", "local", "--gpus-per-node", "1", "--mode", "srun", "--time", "5",
                              "--wait", "--output", str(tmp_path / "job-%j.out"), *env, "--", str(tmp_path / "dump.py"), *ARGS,
                              cwd=tmp_path, timeout=300)
    logs = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert result.returncode == 0, result.stderr + logs
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == ARGS
    assert seen["env"] == ENV
    assert not list(tmp_path.rglob("PAYLOAD")), "the payload ran"
