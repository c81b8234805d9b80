"""The README's script under `gpuscale run` on two processes, as the README shows it: two ranks, one DDP model,
the exact global batch (tests/unit/test_readme.py runs it on one process and checks the README's other commands)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from procs import ROOT, clean_env

pytestmark = pytest.mark.multiproc

sys.path.insert(0, str(ROOT / "tests" / "unit"))
from test_readme import command_lines, readme_script  # noqa: E402


def test_the_readmes_script_runs_on_two_processes_as_written(tmp_path):
    (tmp_path / "train.py").write_text(readme_script())
    line = next(line for line in command_lines() if line.startswith("gpuscale run "))
    assert line == "gpuscale run --nproc-per-node 2 train.py"
    result = subprocess.run([sys.executable, "-m", "gpuscale", *line.split()[1:]], cwd=tmp_path, env=clean_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "mine" / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["samples"] == 3 * 4096  # the global batch of 32 split 16 + 16: every sample once per epoch
    assert summary["strategy"] == "ddp" and summary.get("final_loss") is not None
