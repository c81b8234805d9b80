"""A job submitted by gpuscale under ``umask 000`` writes nothing world-writable (issue 6: security).

`gpuscale` tightens its umask before any verb runs; sbatch hands it to the job (SLURM_UMASK), so
the job's output file and whatever the job writes with plain open() are protected too.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slurm

WRITER = """
import os, sys
old = os.umask(0); os.umask(old)
os.makedirs(os.path.join(sys.argv[1], "sub"))
open(os.path.join(sys.argv[1], "sub", "plain.txt"), "w").close()
print(f"job umask {old:03o}", flush=True)
"""


def test_job_output_and_files_are_not_world_writable_under_umask_000(cluster, tmp_path):
    writer = tmp_path / "writer.py"
    writer.write_text(WRITER)
    made = tmp_path / "made"
    made.mkdir()  # SLURM opens the output file, but makes no directory for it
    result = subprocess.run(
        [sys.executable, "-m", "gpuscale", "slurm", "submit", "--profile", "local", "--gpus-per-node", "1", "--mode", "srun",
         "--wait", "--time", "5", "--output", str(made / "job-%j.out"), "--", str(writer), str(made)],
        env=cluster.env, cwd=tmp_path, capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.umask(0),
    )
    logs = "".join(p.read_text() for p in made.glob("job-*.out"))
    assert result.returncode == 0, result.stderr + logs
    assert "job umask 002" in logs
    created = [made / "sub", made / "sub" / "plain.txt", *made.glob("job-*.out")]
    assert len(created) == 3
    modes = {p.name: stat.filemode(p.stat().st_mode) for p in created}
    assert not any(p.stat().st_mode & stat.S_IWOTH for p in created), modes
