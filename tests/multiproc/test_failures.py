"""A rank that dies ends the whole job quickly, with a non-zero exit and the culprit named first."""

from __future__ import annotations

import time

import pytest

from procs import SCRIPTS, gpuscale_cmd, run, run_by_hand

pytestmark = pytest.mark.multiproc
DIE = str(SCRIPTS / "die.py")
BOUND_S = 60  # far below the collective timeout of a default job; well under a minute


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_gpuscale_run_stops_everyone_when_a_rank_dies(mode):
    start = time.monotonic()
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", DIE, mode), timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < BOUND_S, f"took {elapsed:.0f} s to end"
    assert "rank 1" in result.stderr
    if mode == "raise":
        # the failing rank names itself, its host and its traceback ...
        assert "rank 1/2 on" in result.stderr and "ValueError: planted failure on rank 1" in result.stderr
        assert "Traceback" in result.stderr
        # ... and the launcher's summary points at it as the first failure
        assert "gpuscale run: rank 1 on" in result.stderr
    else:
        assert "exit code 7" in result.stderr


def test_ranks_started_by_hand_do_not_hang_when_a_peer_vanishes():
    start = time.monotonic()
    results = run_by_hand([DIE, "exit"], world_size=2, timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert results[1].returncode == 7
    assert results[0].returncode != 0, "rank 0 claimed success although its peer died"
    assert elapsed < BOUND_S, f"rank 0 needed {elapsed:.0f} s to notice its peer died"
