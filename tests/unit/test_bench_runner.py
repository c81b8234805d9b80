"""The benchmark runner's arithmetic and its refusal of bad input (the benchmarks themselves run in bench/, not here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.stats import summary  # noqa: E402


def test_summary_gives_median_range_and_relative_spread():
    s = summary([10.0, 12.0, 11.0, 30.0])
    assert s == {"median": 11.5, "min": 10.0, "max": 30.0, "spread": pytest.approx(20.0 / 11.5), "n": 4}
    assert summary([5.0])["spread"] == 0.0


@pytest.mark.parametrize("argv, message", [(["nosuch"], "unknown benchmark(s) nosuch"), (["--repeat", "0"], "--repeat 0 must be at least 1"),
                                           (["--nproc", "1,x"], "is not a comma-separated list of process counts")])
def test_bad_arguments_are_one_line_errors(argv, message):
    result = subprocess.run([sys.executable, "-m", "bench", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
