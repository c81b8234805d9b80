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


def test_a_link_whose_all_reduce_outlasts_the_runs_is_scaled_to_fit_them():
    """The model's all-reduce of 13.3 ms beside 4.5 ms of compute, where the run measured 4.3 ms exposed (a study on
    this VM whose link was measured in a busy minute): no overlap in [0, 1] meets it, since the all-reduce could
    have run 8.8 ms at most. The fit: 8.8 / 13.3 of the link's times (the median over the runs); a link that fits
    is left alone."""
    from gpuscale.study.calibrate import link_fit
    from gpuscale.study.predict import Link

    # 0.2 x 2 / 3000 s per sample x 32 samples = 4.2667 ms exposed per step
    prediction = {"cells": [{"name": "a-1x2", "comm_s": 0.0133, "compute_s": 0.0045, "run": True},
                            {"name": "b-1x2", "comm_s": 0.0133, "compute_s": 0.0045, "run": True},
                            {"name": "c-1x2", "comm_s": 0.0133, "compute_s": 0.0200, "run": True}]}
    rows = [_row("a-1x2", 0.2, samples_per_s=3000.0), _row("b-1x2", 0.2, samples_per_s=3000.0), _row("c-1x2", 0.1)]
    exposed = 0.2 * 2 / 3000 * 32
    assert link_fit(prediction, rows) == pytest.approx((0.0045 + exposed) / 0.0133)
    assert run_overlaps(prediction, rows)["a-1x2"] == 1.0  # as measured, clamped: the model cannot meet the run
    assert link_fit(prediction, [rows[2]]) is None  # 20 ms of compute hold 13.3 ms: the link fits
    link = Link(intra_bandwidth=1e9, intra_latency=1e-3, inter_bandwidth=1e8, inter_latency=1e-2, source="measured")
    scaled = link.scaled(0.5, "halved")
    assert (scaled.intra_bandwidth, scaled.intra_latency, scaled.inter_bandwidth, scaled.inter_latency) == (2e9, 5e-4, 2e8, 5e-3)
    assert scaled.source == "measured, halved"
