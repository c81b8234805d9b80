"""Exposed communication and imbalance of a script nobody changed, from DDP's own timers: a delay
injected on one rank of a plain DDP script comes back as the step's imbalance."""

from __future__ import annotations

import json

import pytest

from procs import SCRIPTS, assert_ok, gpuscale_cmd, run

pytestmark = pytest.mark.multiproc

DELAY = 0.04


def test_an_injected_straggler_comes_back_as_imbalance(tmp_path):
    out = tmp_path / "straggler"
    # rank 0 is the slow one, so the rank that waits (the reference) is rank 1: nothing rests on rank 0 being it
    result = run(gpuscale_cmd("run", "--nproc-per-node", "2", "--summary", str(out), str(SCRIPTS / "ddp_straggler.py"),
                              "--delay", str(DELAY), "--slow-rank", "0"), timeout=240)
    assert_ok(result)
    summary = json.loads((out / "summary.json").read_text())
    probe = summary["sync_probe"]
    assert probe["status"] == "measured" and probe["source"] == "ddp_timers", probe
    assert probe["probes"] >= 8 and probe["reference_rank"] == 1
    # on CPUs DDP timed every iteration: the parts rest on all steps after its first 10
    # (DDP logs an iteration's timers at the next forward: the last one is never read)
    assert probe["of_steps"] == summary["steps"] and probe["probes"] >= summary["steps"] - 12, probe
    part = summary["step_breakdown_s"]
    assert 0.7 * DELAY < part["imbalance"] < 1.4 * DELAY, part
    # rank 0 lags on every step: the imbalance is persistent, and rank 0 is named
    assert probe["slow_rank"] == 0 and part["persistent_imbalance"] > 0.8 * part["imbalance"], part
    assert part["exposed_comm"] < DELAY / 2, part  # a 33k-parameter all-reduce on one host: far below the delay
    waits = {r["rank"]: r["sync_wait_s"] for r in summary["ranks"]}
    assert waits[1] > waits[0] + 0.7 * DELAY  # the fast rank waited, the slow one did not
    steps = summary["steps"]
    assert summary["time_split_s"]["imbalance"] == pytest.approx(steps * part["imbalance"])
    assert part["step"] > DELAY  # the step holds the delay it waited for
    assert not any("exposed communication" in t for t in summary["probe"]["not_measured"])
    assert "imbalance" in result.stderr and "exposed communication" in result.stderr
