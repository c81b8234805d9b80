"""The prediction's overlap calibrated on the runs a study measured, by hand."""

from __future__ import annotations

import pytest

from gpuscale.study.calibrate import calibration, run_overlaps


def _row(name: str, exposed_share: float | None, samples_per_s: float = 1000.0, world: int = 2) -> dict:
    return {"name": name, "world_size": world, "samples_per_s": samples_per_s, "per_device_batch": 32, "grad_accum_steps": 1,
            "loss_breakdown": None if exposed_share is None else {"exposed_comm": exposed_share}}


def test_each_run_gives_the_overlap_at_which_the_model_meets_its_measurement():
    # the model: an all-reduce of 10 ms beside 20 ms of compute per step
    prediction = {"cells": [{"name": "a-1x2", "comm_s": 0.010, "compute_s": 0.020, "run": True},
                            {"name": "b-1x2", "comm_s": 0.010, "compute_s": 0.020, "run": True},
                            {"name": "a-1x4", "comm_s": 0.015, "compute_s": 0.010, "run": False}]}
    # a-1x2 measured 10% of ideal: 0.1 x 2 / 1000 s per sample x 32 samples = 6.4 ms per step exposed
    rows = [_row("a-1x1", 0.0, world=1), _row("a-1x2", 0.10), _row("b-1x2", 0.30), _row("c-1x2", None)]
    overlaps = run_overlaps(prediction, rows)
    assert overlaps == pytest.approx({"a-1x2": (0.010 - 0.0064) / 0.020, "b-1x2": 0.0})  # 19.2 ms > 10 ms: nothing hid
    overlap, source = calibration(prediction, rows)
    assert overlap == pytest.approx(0.09)  # the median of 0.18 and 0
    assert "calibrated on the study's 2 measured runs" in source and "a-1x2 0.18" in source and "scales not run" in source


def test_no_measured_run_no_calibration():
    prediction = {"cells": [{"name": "a-1x2", "comm_s": 0.010, "compute_s": 0.020}]}
    assert calibration(prediction, [_row("a-1x2", None)]) is None
