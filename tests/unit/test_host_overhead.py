"""bench/host_overhead.py runs end to end: each path in a fresh process with its host milliseconds per step and the
device waits of its step path, and each of gpuscale's additions measured inside one process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import host_overhead  # noqa: E402

pytest.importorskip("transformers")


def test_the_bench_times_each_path_and_each_addition_and_finds_no_wait_in_gpuscale():
    record = host_overhead.run(repeat=1, steps=15, paths=("bare", "training"), additions=("training vs bare", "probe hooks"))
    for path in ("bare", "training"):
        p = record["paths"][path]
        assert 0 < p["median_ms"] < 1000 and p["spread_ms"][0] <= p["median_ms"] <= p["spread_ms"][1]
        assert p["device_waits"] == []
    training, probe = record["additions"]["training vs bare"], record["additions"]["probe hooks"]
    assert training["steps"] == 15 - sum(host_overhead.is_probe_step(i) for i in range(host_overhead.WARMUP, host_overhead.WARMUP + 15))
    assert training["waits_watched_in"] == "training" and training["gpuscale_device_waits"] == []
    # the probe's hooks are timed directly: pure host work, a positive few microseconds to a millisecond
    assert probe["steps"] == 15 and 0 < probe["median_ms"] < 5
    text = host_overhead.report(record)
    assert "training vs bare" in text and "probe hooks" in text and "0 in gpuscale" in text
