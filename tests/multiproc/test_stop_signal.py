"""StopSignal on 2 ranks: both stop after the same step, soon after the signal, and check no more often than needed."""

from __future__ import annotations

import json

import pytest

from procs import SCRIPTS, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc
STOP_CHECK = str(SCRIPTS / "stop_check.py")
SIGNAL_STEP = 40  # rank 1 signals itself after this step; steps take ~20 ms


def _stopped(tmp_path, every: str) -> list[dict[str, int]]:
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", STOP_CHECK, str(tmp_path), every), timeout=180)
    assert result.returncode == 75, result.stderr  # EXIT_STOPPED: a requested stop after a checkpoint
    return [json.loads((tmp_path / f"stopped-{rank}.json").read_text()) for rank in range(2)]


def test_auto_checks_about_every_interval_and_stops_within_it(tmp_path):
    stopped = _stopped(tmp_path, "auto")
    assert stopped[0]["step"] == stopped[1]["step"]  # after the same step on both ranks
    step, checks = stopped[0]["step"], stopped[0]["checks"]
    # 0.3 s between checks at ~20 ms (or more, on a busy machine) a step: one check per few steps, not per step ...
    assert checks <= step / 3, f"{checks} all-reduces in {step} steps"
    # ... and the stop comes within about one interval of the signal: 15 steps, plus the first checks' warm-up
    assert SIGNAL_STEP <= step <= SIGNAL_STEP + 20


def test_every_step_stops_at_the_next_check(tmp_path):
    stopped = _stopped(tmp_path, "1")
    assert stopped[0] == stopped[1] == {"step": SIGNAL_STEP, "checks": SIGNAL_STEP}


def test_every_k_checks_every_kth_call(tmp_path):
    stopped = _stopped(tmp_path, "7")
    assert stopped[0] == stopped[1] == {"step": 42, "checks": 6}  # checks at 7, 14, ..., 42: the first after step 40
