"""A rank that dies ends the whole job quickly, with a non-zero exit and the culprit named first.

Every launcher (gpuscale run, bare torchrun, ranks started by hand), every way of dying (an
exception, SIGKILL), and a rank that hangs alive (only the collective timeout can end that one).
"""

from __future__ import annotations

import socket
import time

import pytest

from procs import SCRIPTS, gpuscale_cmd, run, run_by_hand, torchrun_cmd

pytestmark = pytest.mark.multiproc
DIE = str(SCRIPTS / "die.py")
BOUND_S = 60  # far below the collective timeout of a default job (600 s); well under a minute
HOST = socket.gethostname()


def _failure_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("[gpuscale] rank") and ("failed" in line or "stopped" in line)]


@pytest.mark.parametrize("mode", ["raise", "exit", "kill"])
def test_gpuscale_run_stops_everyone_when_a_rank_dies(mode):
    start = time.monotonic()
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", DIE, mode), timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < BOUND_S, f"took {elapsed:.0f} s to end"
    if mode == "raise":
        # the first failure report is the failing rank's: its rank, host and error, then its traceback ...
        assert _failure_lines(result.stderr)[0] == f"[gpuscale] rank 1/2 on {HOST} failed: planted failure on rank 1"
        assert "ValueError: planted failure on rank 1" in result.stderr and "Traceback" in result.stderr
        # ... the victim says in one line that a peer failed first, with no traceback of its own up front
        assert any(line.startswith("[gpuscale] rank 0/2") and "a peer rank failed first" in line for line in _failure_lines(result.stderr))
        # ... and the launcher's summary names it as the first failure, with its message
        assert f"gpuscale run: rank 1 on {HOST} failed first (exit code 1): planted failure on rank 1" in result.stderr
    else:
        assert f"gpuscale run: rank 1 on {HOST} failed first" in result.stderr
        assert ("exit code 7" if mode == "exit" else "signal SIGKILL") in result.stderr
        assert result.returncode == (7 if mode == "exit" else 137)


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_bare_torchrun_stops_everyone_when_a_rank_dies(mode):
    start = time.monotonic()
    result = run(torchrun_cmd(2, DIE, mode), timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert result.returncode != 0 and elapsed < BOUND_S, f"exit {result.returncode} after {elapsed:.0f} s"
    if mode == "raise":
        assert _failure_lines(result.stderr)[0] == f"[gpuscale] rank 1/2 on {HOST} failed: planted failure on rank 1"


@pytest.mark.parametrize("mode", ["exit", "kill", "raise"])
def test_ranks_started_by_hand_do_not_hang_when_a_peer_vanishes(mode):
    start = time.monotonic()
    results = run_by_hand([DIE, mode], world_size=2, timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert results[1].returncode == {"exit": 7, "kill": -9, "raise": 1}[mode]
    assert results[0].returncode != 0, "rank 0 claimed success although its peer died"
    assert elapsed < BOUND_S, f"rank 0 needed {elapsed:.0f} s to notice its peer died"
    if mode == "raise":
        assert _failure_lines(results[1].stderr)[0] == f"[gpuscale] rank 1/2 on {HOST} failed: planted failure on rank 1"
        assert "a peer rank failed first" in _failure_lines(results[0].stderr)[0]


def test_a_rank_that_hangs_alive_is_ended_by_the_collective_timeout():
    """Rank 1 stops taking part without dying: rank 0's all-reduce gives up after --timeout, and the job ends."""
    start = time.monotonic()
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "--timeout", "10", DIE, "hang"), timeout=BOUND_S + 30)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert 10 <= elapsed < BOUND_S, f"ended after {elapsed:.0f} s"
    assert f"gpuscale run: rank 0 on {HOST} failed first" in result.stderr
    assert "timed out" in result.stderr.lower() or "timeout" in result.stderr.lower()
