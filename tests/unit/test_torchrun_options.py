"""Every torchrun line of every torchrun-mode batch script is one the job's torch accepts, from torch 2.6 (the oldest
gpuscale declares, and what LUMI's containers carry) to the newest installed here.

bash runs each step's own command line, with the shell variables a job has and a stand-in Python that hands
`-m torch.distributed.run` its argv to a dump; the job's torch version is what its package metadata says (a
made-up torch-X.dist-info first on PYTHONPATH). The argv is then parsed by the installed torch's own torchrun parser,
and its options are checked against torch 2.6's list."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.run import get_args_parser

from gpuscale.slurm.profiles import load_profile
from gpuscale.slurm.render import TORCHRUN_SIGNALS, JobSpec, render_sbatch

from lumi import lumi_g_for_other_tests

TORCH_2_6_OPTIONS = frozenset({
    "-h", "--help", "--nnodes", "--nproc-per-node", "--nproc_per_node", "--rdzv-backend", "--rdzv_backend",
    "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--standalone",
    "--max-restarts", "--max_restarts", "--monitor-interval", "--monitor_interval", "--start-method", "--start_method",
    "--role", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path", "--log-dir", "--log_dir",
    "-r", "--redirects", "-t", "--tee", "--local-ranks-filter", "--local_ranks_filter", "--node-rank", "--node_rank",
    "--master-addr", "--master_addr", "--master-port", "--master_port", "--local-addr", "--local_addr", "--logs-specs",
    "--logs_specs",
})
"""torchrun's option strings in torch 2.6.0: get_args_parser() of torch/distributed/run.py in pytorch v2.6.0 (as
shipped in the torch 2.6.0 wheel on PyPI). --signals-to-handle is not among them; it came with torch 2.10.0."""

def _profile(name: str):
    return lumi_g_for_other_tests() if name == "lumi-g" else load_profile(name)


CASES = {
    "lumi-g one node": ("lumi-g", JobSpec(script="train.py", nodes=1, mode="torchrun", account="p")),
    "lumi-g two nodes, container, doctor": ("lumi-g", JobSpec(script="train.py", script_args=("--epochs", "3"), nodes=2,
                                                              mode="torchrun", container="/scratch/p/pytorch.sif", doctor=True)),
    "lumi-g two GPUs, study probe": ("lumi-g", JobSpec(script="train.py", gpus_per_node=2, mode="torchrun", probe_dir="/p/probe")),
    "local two nodes, doctor": ("local", JobSpec(script="train.py", nodes=2, gpus_per_node=1, mode="torchrun", doctor=True)),
    "generic-nvidia one node": ("generic-nvidia", JobSpec(script="train.py", mode="torchrun")),
}

# Stand-in for the job's Python: `-m torch.distributed.run` or `-m gpuscale.agent` (which takes torchrun's argv) dumps
# its argv (and whether USR1 is ignored), the rest is the real interpreter. NO_GPUSCALE hides gpuscale from it.
STAND_IN = """#!/bin/bash
if [ "$1" = -m ] && {{ [ "$2" = torch.distributed.run ] || [ "$2" = gpuscale.agent ]; }}; then
    launcher=$2
    shift 2
    exec "{python}" -c 'import json, os, signal, sys
record = {{"launcher": sys.argv[1], "argv": sys.argv[2:], "usr1_ignored": signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN}}
open(os.environ["ARGV_OUT"], "a").write(json.dumps(record) + "\\n")' "$launcher" "$@"
fi
if [ -n "${{NO_GPUSCALE:-}}" ] && [ "$1" = -c ]; then exit 1; fi  # its find_spec of gpuscale: not installed
exec "{python}" "$@"
"""


def _fake_torch(root: Path, version: str) -> Path:
    """A folder whose only content is torch's package metadata at `version` (importlib.metadata reads the first found)."""
    info = root / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    return root


def _torchrun_argvs(tmp_path: Path, profile: str, job: JobSpec, torch_version: str | None, gpuscale: bool = True) -> list[dict]:
    """Run every step line of the rendered script as its task would and return what torchrun was given."""
    stand_in = tmp_path / "python3"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    out = tmp_path / "argv.jsonl"
    job = JobSpec(**{**job.__dict__, "python": str(stand_in)})
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SLURM_NNODES": str(job.nodes), "SLURM_JOB_ID": "123456",
           "MASTER_ADDR": "n1", "MASTER_PORT": "13456", "WITH_CONDA": "true", "ARGV_OUT": str(out)}
    if torch_version:
        env["PYTHONPATH"] = str(_fake_torch(tmp_path / "fake", torch_version))
    if not gpuscale:
        env["NO_GPUSCALE"] = "1"
    for line in render_sbatch(_profile(profile), job).splitlines():
        if line.startswith("srun "):
            argv = shlex.split(line.split(" || ")[0].rstrip(" &"))
            result = subprocess.run(["bash", "-c", argv[argv.index("-c") + 1]], env=env, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def _options(argv: list[str]) -> list[str]:
    """The option strings before the training script (every option gpuscale writes is --name=value or a flag)."""
    script = get_args_parser().parse_args(argv).training_script
    return [token.split("=", 1)[0] for token in argv[:argv.index(script)]]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("torch_version", ["2.6.0", "2.9.1+rocm6.4", None], ids=["torch-2.6", "torch-2.9", "installed"])
def test_torchrun_lines_parse_with_the_jobs_torch(tmp_path, case, torch_version):
    profile, job = CASES[case]
    runs = _torchrun_argvs(tmp_path, profile, job, torch_version)
    assert len(runs) == 1 + job.doctor
    newest = {option for action in get_args_parser()._actions for option in action.option_strings}
    for run in runs:
        args = get_args_parser().parse_args(run["argv"])  # the installed torch's parser: SystemExit on a bad option
        options = _options(run["argv"])
        assert set(options) <= newest, options  # exact names: argparse would also take abbreviations
        assert run["usr1_ignored"], "torchrun must ignore USR1: before 2.10 it would end torchrun"
        assert run["launcher"] == "gpuscale.agent"  # the job's Python has gpuscale: torchrun under gpuscale's account of a failure
        if torch_version:
            assert set(options) <= TORCH_2_6_OPTIONS, f"torch {torch_version} has no {set(options) - TORCH_2_6_OPTIONS}"
        else:
            assert args.signals_to_handle == TORCHRUN_SIGNALS and "SIGUSR1" in args.signals_to_handle.split(",")
        assert args.nproc_per_node == str(job.gpus_per_node or _profile(profile).gpus_per_node)
        if job.nodes > 1:
            assert (args.nnodes, args.rdzv_id, args.rdzv_backend, args.rdzv_endpoint) == ("2", "123456", "c10d", "n1:13456")
        else:
            assert args.standalone and args.nnodes == "1"


@pytest.mark.parametrize("version, flag", [("2.6.0+rocm6.2.4", False), ("2.7.1", False), ("2.9.1", False), ("2.10.0", True),
                                           ("2.10.0a0+git1234abc", True), ("2.11.0.dev20260101+cpu", True), ("3.0.0", True)])
def test_the_flag_follows_the_jobs_torch_version(tmp_path, version, flag):
    profile, job = CASES["lumi-g one node"]
    (run,) = _torchrun_argvs(tmp_path, profile, job, version)
    assert any(token.startswith("--signals-to-handle=") for token in run["argv"]) == flag


def test_a_job_python_without_gpuscale_gets_plain_torchrun(tmp_path):
    profile, job = CASES["local two nodes, doctor"]
    runs = _torchrun_argvs(tmp_path, profile, job, None, gpuscale=False)
    assert [run["launcher"] for run in runs] == ["torch.distributed.run"] * 2


def test_torchrun_lets_its_workers_stop_as_long_as_slurms_warning(monkeypatch):
    """torch 2.12 and later read how long torchrun waits for its workers after passing a signal on from the
    environment; an older torch ignores the variable (it kills them after 30 s)."""
    from torch.distributed.launcher.api import LaunchConfig

    text = render_sbatch(lumi_g_for_other_tests(), JobSpec(script="t.py", mode="torchrun"))
    (line,) = [line for line in text.splitlines() if line.startswith("export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=")]
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", line.split("=", 1)[1])
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).shutdown_timeout == load_profile("lumi-g").warn_before_end_s
    mine = JobSpec(script="t.py", mode="torchrun", env=(("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "600"),))
    assert render_sbatch(lumi_g_for_other_tests(), mine).count("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") == 1  # the user's stands
