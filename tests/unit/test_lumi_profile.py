"""What lumi-g asks of a job (an account, a software environment) and what each container image gets.

The truths: LUMI's SLURM refuses a job without --account; the host's python3 on LUMI has no torch; the LUMI AI
guide (2026) starts its AI Factory images with `singularity run` after `module use /appl/local/laifs/modules;
module load lumi-aif-singularity-bindings` and sets no RCCL variables for them; LUMI's earlier lumi-pytorch-rocm
images are activated by $WITH_CONDA with the network libraries and file systems bound by hand. Scripts are run
by bash with stand-ins for module, singularity and srun, so what is checked is what the job's shell really does.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from gpuscale.cli import main
from gpuscale.slurm.profiles import load_profile, profile_from_dict
from gpuscale.slurm.render import JobSpec, render_sbatch

from lumi import AI_FACTORY_IMAGE, OLD_IMAGE

ROOT = Path(__file__).resolve().parents[2]
NETWORK_BINDS = ["/var/spool/slurmd", "/opt/cray", "/usr/lib64/libcxi.so.1", "/usr/lib64/libjansson.so.4"]
FILE_SYSTEMS = ["/pfs", "/scratch", "/projappl", "/project", "/flash", "/appl"]


def _script_error(capsys, monkeypatch, tmp_path, *options: str) -> tuple[int, str]:
    """Exit code and stderr of `gpuscale slurm script --profile lumi-g OPTIONS -- train.py`."""
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    code = main(["slurm", "script", "--profile", "lumi-g", *options, "--", str(train)])
    return code, capsys.readouterr().err


def test_lumi_without_an_account_is_refused_in_one_line_that_says_what_to_add(capsys, monkeypatch, tmp_path):
    code, err = _script_error(capsys, monkeypatch, tmp_path, "--nodes", "2", "--mode", "srun")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "lumi-g needs the project to charge: add --account PROJECT" in err


def test_lumi_without_a_software_environment_is_refused_in_one_line_with_the_choices(capsys, monkeypatch, tmp_path):
    code, err = _script_error(capsys, monkeypatch, tmp_path, "--account", "project_465000", "--nodes", "2", "--mode", "srun")
    assert code == 2 and len(err.strip().splitlines()) == 1
    for choice in ("--container IMAGE.sif", "lumi-multitorch-*", "--module NAME", "--venv DIR", "--no-container"):
        assert choice in err
    code, err = _script_error(capsys, monkeypatch, tmp_path, "--account", "p", "--container", "a.sif", "--no-container")
    assert code == 2 and "contradict each other" in err and len(err.strip().splitlines()) == 1
    code, err = _script_error(capsys, monkeypatch, tmp_path, "--account", "p", "--module", "PyTorch 2.7")
    assert code == 2 and "one module name without spaces" in err


@pytest.mark.parametrize("software", [["--container", AI_FACTORY_IMAGE], ["--module", "cray-python"], ["--venv", "/p/venv"],
                                      ["--no-container"]])
def test_each_software_environment_is_enough(capsys, monkeypatch, tmp_path, software):
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    monkeypatch.setenv("SBATCH_ACCOUNT", "project_465000")  # sbatch's own variable stands for --account
    assert main(["slurm", "script", "--profile", "lumi-g", *software, "--", str(train)]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --account=project_465000" in text
    assert ("singularity" in text) == (software[0] == "--container")


def test_the_software_requirement_can_be_lifted_for_a_cluster_like_lumi(capsys, monkeypatch, tmp_path):
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    assert main(["slurm", "script", "--profile", "lumi-g", "--set", "require_account=false", "--set", "require_software=false",
                 "--", str(train)]) == 0
    assert "#SBATCH --account" not in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------
# Each image family gets what LUMI's documentation gives it, and nothing of another family's


def _render(container: str, mode: str = "srun", nodes: int = 2) -> str:
    return render_sbatch(load_profile("lumi-g"), JobSpec(script="train.py", nodes=nodes, mode=mode, account="project_465000",
                                                         container=container))


def _srun_argv(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("srun "))
    return shlex.split(line.rstrip(" &"))


def test_ai_factory_images_start_with_singularity_run_after_lumis_bindings_module_and_get_no_rccl_variables():
    text = _render(AI_FACTORY_IMAGE)
    lines = text.splitlines()
    use, load = lines.index("module use /appl/local/laifs/modules"), lines.index("module load lumi-aif-singularity-bindings")
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    assert use < load < srun
    argv = _srun_argv(text)
    assert argv[argv.index("singularity"):argv.index("singularity") + 3] == ["singularity", "run", "$IMAGE"]
    assert "--bind" not in argv and "$WITH_CONDA" not in text  # the module binds; the run script activates
    assert f"IMAGE={AI_FACTORY_IMAGE}" in lines
    assert "NCCL_NET_GDR_LEVEL" not in text and "NCCL_SOCKET_IFNAME" not in text


def test_earlier_lumi_images_activate_with_with_conda_and_bind_the_network_and_file_systems_by_hand():
    text = _render(OLD_IMAGE, mode="torchrun")
    argv = _srun_argv(text)
    at = argv.index("singularity")
    assert argv[at:at + 2] == ["singularity", "exec"]
    assert argv[argv.index("--bind") + 1].split(",") == NETWORK_BINDS + FILE_SYSTEMS
    assert argv[argv.index("-c") + 1].startswith("$WITH_CONDA && {")  # expanded inside the container
    assert "export NCCL_NET_GDR_LEVEL=PHB" in text and "export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3" in text
    assert "module load" not in text


def test_any_other_image_gets_the_hand_binds_and_the_networks_interfaces():
    """An image of the user's own (cotainr on a LUMI base) gets what the network needs: RCCL otherwise picks an
    interface it cannot use (LUMI's PyTorch container recipe sets it too); no GPU-direct level, no activation."""
    text = _render("/scratch/project_465000/images/mine.sif")
    argv = _srun_argv(text)
    assert argv[argv.index("--bind") + 1].split(",") == NETWORK_BINDS + FILE_SYSTEMS
    assert "export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3" in text.splitlines()
    assert "NCCL_NET_GDR_LEVEL" not in text and "$WITH_CONDA" not in text and "\nmodule load" not in text
    mine = render_sbatch(load_profile("lumi-g"), JobSpec(script="train.py", nodes=2, mode="srun", account="p",
                                                         container="/images/mine.sif", env=(("NCCL_SOCKET_IFNAME", "hsn0"),)))
    exports = [line for line in mine.splitlines() if line.startswith("export NCCL_SOCKET_IFNAME=")]
    assert exports[-1] == "export NCCL_SOCKET_IFNAME=hsn0"  # the user's --env comes last and wins


def _fake_lmod(loaded: dict[str, str]) -> str:
    """A `module` shell function as Lmod's behaves for this test: `purge` unsets what the loaded modules set,
    `load NAME` records NAME."""
    unsets = " ".join(loaded)
    return ('module() { case "$*" in *purge*) unset ' + unsets + '; export LOADEDMODULES= ;; '
            '*load*) export LOADEDMODULES="${LOADEDMODULES:+$LOADEDMODULES:}${*: -1}" ;; esac; }\nexport -f module\n')


def test_jobs_start_from_a_clean_module_environment_and_keep_what_the_user_named():
    """What a shell that had LUMI's PyTorch module loaded hands the job is gone before srun; the user's --module
    and --env, named in the script, are what the step gets. The script's own lines run in bash to show it."""
    job = JobSpec(script="train.py", nodes=2, mode="srun", account="p", container="/images/mine.sif", modules=("mine/1.0",),
                  env=(("SINGULARITYENV_MY_FLAG", "1"),))
    lines = render_sbatch(load_profile("lumi-g"), job).splitlines()
    start = lines.index("set -euo pipefail")
    end = next(i for i, line in enumerate(lines) if line.startswith("stop_dir="))
    body = [line for line in lines[start:end] if not line.startswith(("MASTER_ADDR=", "MASTER_PORT="))]
    inherited = {"SINGULARITYENV_PYTHONPATH": "/site", "NCCL_SOCKET_IFNAME": "hsn", "SINGULARITYENV_LEFT": "x",
                 "APPTAINERENV_OLD": "y"}
    module_set = {k: v for k, v in inherited.items() if k in ("SINGULARITYENV_PYTHONPATH", "NCCL_SOCKET_IFNAME")}
    program = _fake_lmod(module_set) + "\n".join(body) + '\npython3 -c "import json, os; print(json.dumps(dict(os.environ)))"'
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30,
                            env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", "SLURM_JOB_ACCOUNT": "p", "USER": "u",
                                 "LOADEDMODULES": "PyTorch/2.7", **inherited})
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout)
    assert not any(name.startswith(("SINGULARITYENV_PYTHONPATH", "SINGULARITYENV_LEFT", "APPTAINERENV_")) for name in env)
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"  # the image's, not the module's "hsn"
    assert env["LOADEDMODULES"] == "mine/1.0" and env["SINGULARITYENV_MY_FLAG"] == "1"
    assert lines.index("module --quiet purge") < lines.index("module load mine/1.0")


def test_every_task_makes_the_miopen_folders_before_the_script_starts(tmp_path):
    for mode in ("srun", "torchrun"):
        text = _render(AI_FACTORY_IMAGE, mode=mode)
        inner = _srun_argv(text)[-1]  # bash -c '...' inside the container
        assert inner.startswith('mkdir -p "$MIOPEN_USER_DB_PATH" "$MIOPEN_CUSTOM_CACHE_DIR"; '), inner
        prefix = inner.split(";", 1)[0]
        env = {"PATH": os.environ["PATH"], "MIOPEN_USER_DB_PATH": str(tmp_path / mode / "db"),
               "MIOPEN_CUSTOM_CACHE_DIR": str(tmp_path / mode / "cache")}
        for _ in range(2):  # a node's second task finds them made: no error
            assert subprocess.run(["bash", "-c", prefix], env=env, timeout=30).returncode == 0
        assert (tmp_path / mode / "db").is_dir() and (tmp_path / mode / "cache").is_dir()


def test_no_container_runs_the_hosts_python_without_any_images_needs():
    text = render_sbatch(load_profile("lumi-g"), JobSpec(script="train.py", nodes=2, mode="srun", account="p", no_container=True))
    assert "singularity" not in text and "IMAGE=" not in text and "NCCL_" not in text
    assert _srun_argv(text)[-3:-1] == ["bash", "-c"]


def test_the_first_matching_image_table_wins_and_binds_add_to_the_containers():
    profile = profile_from_dict("site", {
        "description": "x", "gpu_vendor": "nvidia", "gpus_per_node": 4, "cpus_per_node": 32, "full_node_partition": "gpu",
        "partial_node_partition": "gpu", "partitions": {"gpu": {"whole_node": False, "max_time": "01:00:00"}},
        "container": {"exec": "apptainer exec", "binds": ["/etc/slurm"], "activate": "source /env"},
        "containers": {"ngc-*.sif": {"binds": ["/etc/slurm", "/data"], "activate": "", "env": {"NCCL_IB_HCA": "mlx5"}},
                       "*": {"exec": "apptainer run"}},
    })
    ngc = profile.container_for("/images/ngc-24.10.sif")
    assert (ngc.exec, ngc.activate, ngc.binds, ngc.env, ngc.pattern) == ("apptainer exec", None, ("/etc/slurm", "/data"),
                                                                         {"NCCL_IB_HCA": "mlx5"}, "ngc-*.sif")
    other = profile.container_for("/images/mine.sif")
    assert (other.exec, other.activate, other.binds, other.env) == ("apptainer run", "source /env", ("/etc/slurm",), {})


@pytest.mark.parametrize("tables, message", [
    ({"containers": {"x*": {"binds": ["/a"]}}}, "need a [container] table"),
    ({"container": {}, "containers": {"x*": {"bind": ["/a"]}}}, "unknown key 'bind'; valid keys are: activate, binds, env, exec"),
    ({"container": {}, "containers": {"/images/x*": {}}}, "must match an image's file name (no '/')"),
    ({"container": {}, "containers": {"x*": {"env": {"BAD NAME": "1"}}}}, "not a valid environment variable name"),
    ({"container": {}, "containers": {"x*": {"modules": "lumi-aif-singularity-bindings"}}}, "modules must be a list of strings"),
    ({"require_account": "yes"}, "require_account='yes' must be true or false"),
])
def test_image_tables_and_requirements_are_checked_in_one_line(tables, message):
    data = {"description": "x", "gpu_vendor": "amd", "gpus_per_node": 8, "cpus_per_node": 56, "full_node_partition": "g",
            "partial_node_partition": "g", "partitions": {"g": {"whole_node": True, "max_time": "01:00:00"}}, **tables}
    with pytest.raises(ValueError) as refused:
        profile_from_dict("site", data)
    assert message in str(refused.value) and "\n" not in str(refused.value)


# --------------------------------------------------------------------------------------------------
# Caches off the home file system


def _exported(text: str, env: dict[str, str]) -> dict[str, str]:
    """The environment after the script's exports of the profile's environment, run by bash with `env`."""
    exports = [line for line in text.splitlines() if re.match(r"export (HF_HOME|TORCH_HOME|MIOPEN_\w+|TOKENIZERS_\w+)=", line)]
    assert len(exports) == 5
    program = "\n".join(["set -euo pipefail", *exports, 'python3 -c "import json, os; print(json.dumps(dict(os.environ)))"'])
    result = subprocess.run(["bash", "-c", program], env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_caches_go_to_the_projects_scratch_and_per_node_tmp_unless_the_user_set_them():
    text = _render(AI_FACTORY_IMAGE)
    job = {"HOME": "/users/alice", "USER": "alice", "SLURM_JOB_ID": "4242", "SLURM_JOB_ACCOUNT": "project_465000"}
    env = _exported(text, job)
    assert env["HF_HOME"] == "/scratch/project_465000/alice/hf-home"
    assert env["TORCH_HOME"] == "/scratch/project_465000/alice/torch-home"
    assert env["MIOPEN_USER_DB_PATH"] == env["MIOPEN_CUSTOM_CACHE_DIR"] == "/tmp/alice-miopen-cache-4242-0"
    requeued = _exported(text, {**job, "SLURM_RESTART_COUNT": "1"})  # a fresh cache for the requeued run
    assert requeued["MIOPEN_USER_DB_PATH"] == "/tmp/alice-miopen-cache-4242-1"
    assert not any(env[name].startswith(job["HOME"]) for name in ("HF_HOME", "TORCH_HOME", "MIOPEN_USER_DB_PATH"))
    mine = _exported(text, {**job, "HF_HOME": "/flash/project_465000/hf"})
    assert mine["HF_HOME"] == "/flash/project_465000/hf"  # the user's own choice stands


# --------------------------------------------------------------------------------------------------
# The script the manual's SLURM page shows is the one gpuscale writes


def test_the_manuals_lumi_script_is_what_gpuscale_writes(tmp_path, monkeypatch, capsys):
    readme = (ROOT / "docs" / "slurm.md").read_text()
    match = re.search(r"```bash\n(gpuscale slurm script --profile lumi-g [^\n]*)\n```\n\n<details>[^\n]*\n\n```bash\n(#!/bin/bash\n.*?)```",
                      readme, re.S)
    assert match, "docs/slurm.md shows the LUMI command and its script"
    command, shown = match.group(1), match.group(2)
    argv = command.split()[1:]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    assert main(argv) == 0
    written = capsys.readouterr().out
    assert shown == written
