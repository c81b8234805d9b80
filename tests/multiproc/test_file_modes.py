"""Nothing gpuscale writes is world-writable, even under ``umask 000`` (issue 6: security).

Every command runs in a child whose umask is 000, the worst a user can have; then every file and
directory it created is checked for the "others may write" bit. A control run first proves that
the harness really leaves plain files world-writable, so a pass means gpuscale did the work.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from procs import ROOT, SCRIPTS, assert_ok, clean_env, gpuscale_cmd, torchrun_cmd

pytestmark = pytest.mark.multiproc

RESUME = str(SCRIPTS / "resume.py")
# A study cell's script that does not use gpuscale at all: its files are plain open() and
# os.makedirs, so only the umask it inherits from `gpuscale study` / `gpuscale run` protects them.
TINY = '''
import argparse, json, os
import gpuscale  # a gpuscale script (it writes its own summary.json): the study appends --scaling and --out
parser = argparse.ArgumentParser()
parser.add_argument("--out")
parser.add_argument("--scaling")
args = parser.parse_args()
os.makedirs(os.path.join(args.out, "extra", "deeper"), exist_ok=True)
with open(os.path.join(args.out, "extra", "deeper", "note.txt"), "w") as f:
    f.write("plain open()")
summary = {"world_size": 1, "scaling": args.scaling, "samples_per_s": 100.0, "train_time_s": 1.0, "epochs": 1,
           "global_batch": 8, "per_device_batch": 8, "steps": 10, "samples": 80, "step_time_s": 0.1, "accuracy": 0.5,
           "final_loss": 0.7, "device": "cpu", "time_split_s": {"startup": 0.1, "data_wait": 0.0, "compute": 0.9,
           "eval": 0.0, "checkpoint": 0.0}}
with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump(summary, f)
'''


def under_umask_000(cmd: list[str], timeout: float = 400, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=clean_env(), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=lambda: os.umask(0))


def world_writable(root: Path) -> list[str]:
    """Every file or directory under `root` (itself included) that others may write to, with its mode."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & stat.S_IWOTH:
            found.append(f"{path.relative_to(root.parent)} {stat.filemode(mode)}")
    return found


def test_the_harness_really_runs_with_umask_000(tmp_path):
    result = under_umask_000([sys.executable, "-c", "import os; os.makedirs('d/e'); open('d/e/f', 'w').close()"], cwd=tmp_path)
    assert_ok(result)
    assert len(world_writable(tmp_path / "d")) == 3  # d, d/e and d/e/f: plain Python leaves all three open


def test_slurm_script_study_and_report_write_nothing_world_writable(tmp_path):
    out = tmp_path / "made"
    script = under_umask_000(gpuscale_cmd("slurm", "script", "--profile", "local", "--gpus-per-node", "1", "--mode", "srun",
                                          "-o", str(out / "jobs" / "new" / "job.sh"), "--", RESUME))
    assert_ok(script)
    assert os.access(out / "jobs" / "new" / "job.sh", os.X_OK)

    tiny = tmp_path / "tiny.py"
    tiny.write_text(TINY)
    study_dir = out / "study"
    study = under_umask_000(gpuscale_cmd("study", "--nproc", "1", "--scaling", "weak", "--no-predict",
                                         "--out", str(study_dir), "--", str(tiny)))
    assert_ok(study)
    report = under_umask_000(gpuscale_cmd("report", str(study_dir)))
    assert_ok(report)

    written = {p.relative_to(study_dir).as_posix() for p in study_dir.rglob("*")}
    # what this test is about was really written: study.json, the cell's log, the script's own
    # files, results, report and plots
    assert {"study.json", "weak-1x1/summary.json", "weak-1x1/extra/deeper/note.txt", "results.json", "report.md",
            "report.html", "plots/throughput.png"} <= written, sorted(written)
    assert any(name.startswith("weak-1x1/") and name.endswith(".log") for name in written), sorted(written)
    assert world_writable(out) == []


def _sharded_checkpoint_files(out: Path) -> list[Path]:
    return [p for p in (out / "ckpt").rglob("*") if p.suffix == ".distcp"]


def test_gpuscale_run_fsdp_checkpoints_are_not_world_writable(tmp_path):
    """Two ranks write FSDP's sharded checkpoints (DCP: plain open() per shard) under `gpuscale run`."""
    out = tmp_path / "run"
    result = under_umask_000(gpuscale_cmd("run", "--nproc-per-node", "2", RESUME, str(out), "--strategy", "fsdp",
                                          "--steps", "3"))
    assert_ok(result)
    assert len(_sharded_checkpoint_files(out)) >= 2, sorted(p.name for p in out.rglob("*"))
    assert world_writable(out) == []


# gpuscale.init() tightens the umask itself for scripts started by plain torchrun or srun (no
# gpuscale CLI in between): runtime's _Restorer calls gpuscale.base.files.tighten_umask and restores
# the old umask at teardown.
def test_plain_torchrun_fsdp_checkpoints_are_not_world_writable(tmp_path):
    out = tmp_path / "torchrun"
    result = under_umask_000(torchrun_cmd(2, RESUME, str(out), "--strategy", "fsdp", "--steps", "3"))
    assert_ok(result)
    assert len(_sharded_checkpoint_files(out)) >= 2, sorted(p.name for p in out.rglob("*"))
    assert world_writable(out) == []
    assert json.loads((out / "losses.json").read_text())  # the run really finished
