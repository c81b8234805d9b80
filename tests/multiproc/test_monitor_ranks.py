"""The utilisation monitor in a real 2-process run: one series per rank, gathered on rank 0.

Rank 0 keeps its core busy while rank 1 sleeps; each rank samples only itself (bound to its own
core by `gpuscale run`), so timeline.json and the summary must tell them apart. Rank 0's reading
is compared with its own CPU clock rather than with 100%: on a shared machine a busy process may
get only part of its core, and the monitor must report that share.
"""

from __future__ import annotations

import json

import pytest

from procs import SCRIPTS, assert_ok, gpuscale_cmd, read_ranks, run

pytestmark = pytest.mark.multiproc


def test_two_ranks_each_sample_their_own_cores(tmp_path):
    assert_ok(run(gpuscale_cmd("run", "--nproc-per-node", "2", str(SCRIPTS / "busy_idle.py"), str(tmp_path), "4"), timeout=300))
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    assert timeline["version"] == 1 and timeline["interval_s"] == 0.5 and timeline["started"] > 0
    series = timeline["series"]
    assert [s["rank"] for s in series] == [0, 1]
    for s in series:
        assert s["device"] == "cpu" and s["source"] == "proc" and s["name"].startswith("cores ")
        t = s["t"]
        assert len(t) >= 6 and all(b > a for a, b in zip(t, t[1:], strict=False)), t
        assert len(s["util_pct"]) == len(s["mem_bytes"]) == len(s["power_w"]) == len(t)
    assert series[0]["name"] != series[1]["name"], "each rank is bound to its own cores"

    summary = json.loads((tmp_path / "summary.json").read_text())
    utilisation = summary["utilisation"]
    assert utilisation["source"] == "proc" and utilisation["interval_s"] == 0.5
    busy, idle = utilisation["devices"]
    assert (busy["rank"], idle["rank"]) == (0, 1)
    assert busy["name"] == series[0]["name"] and idle["host"] == series[1]["host"]
    own = [r["cpu_pct"] for r in read_ranks(tmp_path, 2)]
    assert own[0] > 25, f"rank 0 did not get to compute ({own[0]:.0f}% of its core): the machine is overloaded"
    assert busy["util_mean"] == pytest.approx(own[0], abs=15), (utilisation, own)
    assert idle["util_mean"] < 20 and idle["util_mean"] == pytest.approx(own[1], abs=10), (utilisation, own)
    assert busy["util_mean"] > idle["util_mean"] + 20, utilisation
    assert busy["mem_peak_bytes"] > 0 and busy["power_mean_w"] is None
