"""The README's examples run as written: its Python block is a script that trains on one process, every
`gpuscale` command it shows parses, and those that need no cluster or training (the batch script, the lint of
the README's own script) run to exit 0. Its `gpuscale run` on two processes is in tests/multiproc/test_readme_runs.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpuscale.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def readme_script() -> str:
    """The README's one Python block: the library in ten lines, saved as train.py."""
    (script,) = blocks("python")
    return script


def command_lines() -> list[str]:
    """Every `gpuscale ...` command of the README's shell blocks (a line, or a part of one joined by &&), with its
    variables as the block sets them and its comment removed."""
    lines, variables = [], {}
    for block in blocks("bash"):
        for line in block.splitlines():
            if match := re.fullmatch(r"([A-Z_]+)=(\S+)", line):
                variables[match.group(1)] = match.group(2)
            line = line.split("  #")[0].strip()
            for name, value in variables.items():
                line = line.replace(f"${name}", value)
            lines += [part.strip() for part in line.split("&&") if part.strip().startswith("gpuscale ")]
    return lines


def test_the_readme_shows_the_commands_it_promises():
    verbs = {shlex.split(line)[1] for line in command_lines()}
    assert {"demo", "run", "study", "report", "slurm", "lint"} <= verbs, verbs


@pytest.mark.parametrize("line", command_lines())
def test_every_command_of_the_readme_parses(line):
    argv = shlex.split(line)[1:]
    verb = argv[0]
    try:
        build_parser(verb).parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"README's `{line}` does not parse (exit {exc.code})")


def test_the_readmes_script_trains_as_written(tmp_path):
    """`python train.py` on one process: three epochs of 4096 samples, a summary with the loss it ended on."""
    (tmp_path / "train.py").write_text(readme_script())
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "mine" / "summary.json").read_text())
    assert summary["world_size"] == 1
    assert summary["samples"] == 3 * 4096
    assert 0 < summary["final_loss"] < 1.0  # cross-entropy of 2 classes starts near ln 2 = 0.69


def test_the_readmes_batch_script_and_lint_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(readme_script())
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.delenv("SBATCH_ACCOUNT", raising=False)
    script = next(line for line in command_lines() if line.startswith("gpuscale slurm script"))
    assert main(shlex.split(script)[1:]) == 0
    written = capsys.readouterr().out
    assert written.startswith("#!/bin/bash") and "--nodes=2" in written and "train.py" in written
    lint = next(line for line in command_lines() if line.startswith("gpuscale lint"))
    assert main(shlex.split(lint)[1:]) == 0, capsys.readouterr().out  # the README's own script has no classic mistake


def test_the_manuals_ten_lines_are_the_readmes_that_run():
    """docs/training.md's "library in ten lines" is the README's script (which the test above runs), not a fragment
    that names data and a model it never defines."""
    manual = (ROOT / "docs" / "training.md").read_text()
    first = re.findall(r"```python\n(.*?)```", manual, re.S)[0]
    assert first == readme_script()
