"""The static checks the field runs, at 0 findings under the project's declared configurations (pyproject.toml's
[tool.ruff] and [tool.mypy]), and each able to fail: a planted finding is reported under the same configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "pyproject.toml"


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(CONFIG), *args],
                          capture_output=True, text=True, cwd=ROOT, input=stdin, timeout=120)


def _mypy(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MYPYPATH": str(ROOT / "src")}  # a planted file finds this checkout's gpuscale
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(CONFIG), "--cache-dir", str(cache), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)


def test_ruff_finds_nothing_in_the_tree():
    result = _ruff(".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_reports_a_planted_finding():
    planted = "import os\nimport sys\n\n\ndef pairs(a, b):\n    return list(zip(a, b))\n"  # unused imports, zip without strict=
    result = _ruff("--stdin-filename", "src/gpuscale/planted.py", "-", stdin=planted)
    assert result.returncode == 1
    assert "F401" in result.stdout and "B905" in result.stdout


def test_mypy_finds_nothing_in_src_bench_and_examples(tmp_path):
    result = _mypy(cache=tmp_path / "cache")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Success: no issues found" in result.stdout


def test_mypy_reports_a_planted_finding(tmp_path):
    planted = tmp_path / "planted.py"  # a set where a Sequence is declared
    planted.write_text("from gpuscale.detect.topology import format_cpulist\n\nformat_cpulist({0, 1})\n")
    result = _mypy(str(planted), cache=tmp_path / "cache")
    assert result.returncode == 1
    assert 'Argument 1 to "format_cpulist" has incompatible type "set[int]"' in result.stdout, result.stdout
