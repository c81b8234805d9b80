"""`gpuscale predict` knows what it projects: the run's device against the target's, the step time's source,
the whole batch from which a step computes at least as long as it communicates."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from gpuscale.cli.predict import format_prediction
from gpuscale.study import matrix, predict
from gpuscale.study.matrix import Cell

# lumi-g.toml: 50 GB/s and 10 us within a node, 100 GB/s and 20 us between nodes
LUMI_INTRA_B, LUMI_INTRA_A, LUMI_INTER_B, LUMI_INTER_A = 50e9, 10e-6, 100e9, 20e-6
GRADIENT_BYTES = 50_000_000  # 1 MiB first bucket, then two of up to 25 MiB: 3 buckets


def summary(**changes) -> dict:
    base = {"world_size": 1, "scaling": "weak", "step_time_s": 0.0127, "gradient_bytes": GRADIENT_BYTES,
            "per_device_batch": 32, "global_batch": 32, "grad_accum_steps": 1, "samples_per_s": 2520.0,
            "train_time_s": 10.0, "device": "cpu", "device_name": "cpu", "strategy": "ddp"}
    return {**base, **changes}


def gpuscale_predict(tmp_path, run_summary: dict, *args: str) -> subprocess.CompletedProcess:
    """`python -m gpuscale predict RUN ARGS` on `run_summary` written as tmp_path/weak-1x1/summary.json."""
    run_dir = tmp_path / "weak-1x1"
    run_dir.mkdir(exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(run_summary))
    return subprocess.run([sys.executable, "-m", "gpuscale", "predict", "weak-1x1", *args], check=False, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def refused_in_one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.startswith("gpuscale predict: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and not result.stdout
    return result.stderr


def table_row(stdout: str, name: str) -> list[str]:
    return next(line.split() for line in stdout.splitlines() if line.startswith(name + " "))


def test_a_cpu_run_onto_a_gpu_profile_is_refused_with_the_fix(tmp_path):
    err = refused_in_one_line(gpuscale_predict(tmp_path, summary(), "--profile", "lumi-g", "--nproc", "1,2,4,8", "--nodes", "1,2,4"))
    assert "weak-1x1 ran on a CPU, but profile lumi-g has AMD GPUs" in err
    assert "12.7 ms per step" in err and "at 32 samples per device with --step-time SECONDS" in err
    assert "or predict from a run made on lumi-g" in err


def test_with_step_time_the_prediction_uses_it_and_says_so(tmp_path):
    step = 0.05  # one GCD's step, as the user measured it on LUMI
    result = gpuscale_predict(tmp_path, summary(), "--profile", "lumi-g", "--nproc", "1,8", "--nodes", "1,2",
                              "--scaling", "weak", "--step-time", str(step), "--overlap", "0")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("baseline: weak-1x1, 1 CPU process (its gradients and batch); 50 ms per step on one target device "
                        "at 32 samples per device (given with --step-time; the run measured 12.7 ms)")
    assert lines[1].startswith("interconnect: profile lumi-g: 50 GB/s and 10 µs per ring step within a node, "
                               "100 GB/s and 20 µs between nodes")
    assert lines[2].startswith("overlap: communication hides behind 0% of the compute time (as given (--overlap)); ")
    # by hand: T = 2 (N-1) alpha buckets + 2 (N-1)/N S/B, 3 buckets, no overlap
    comm8 = 2 * 7 * LUMI_INTRA_A * 3 + 2 * 7 / 8 * GRADIENT_BYTES / LUMI_INTRA_B  # 2.17 ms
    comm16 = 2 * 15 * LUMI_INTER_A * 3 + 2 * 15 / 16 * GRADIENT_BYTES / LUMI_INTRA_B  # slowest link: 50 GB/s, 20 us
    assert comm8 == pytest.approx(2.17e-3) and comm16 == pytest.approx(3.675e-3)
    one, eight, sixteen = table_row(result.stdout, "weak-1x1"), table_row(result.stdout, "weak-1x8"), table_row(result.stdout, "weak-2x8")
    assert one[3] == "50.0" and float(one[6]) == pytest.approx(32 / step, abs=0.05)  # the given step, not the run's 12.7 ms
    assert float(eight[4]) == pytest.approx(1e3 * comm8, abs=0.05)
    assert float(eight[6]) == pytest.approx(8 * 32 / (step + comm8), abs=0.05)
    assert float(sixteen[6]) == pytest.approx(16 * 32 / (step + comm16), abs=0.05)
    assert eight[7] == f"{100 * step / (step + comm8):.0f}"
    # the whole batch from which compute covers communication: ceil(T / per-sample compute)
    assert f"2x8: below {math.ceil(comm16 / (step / 32))} samples per device" in result.stdout


def test_a_gpu_run_onto_a_profile_without_gpus_is_refused(tmp_path):
    gpu = summary(device="cuda", device_name="NVIDIA H100 80GB HBM3", step_time_s=0.0042)
    err = refused_in_one_line(gpuscale_predict(tmp_path, gpu, "--profile", "local", "--nproc", "1,2"))
    assert "weak-1x1 ran on an NVIDIA GPU (NVIDIA H100 80GB HBM3), but profile local has no GPUs" in err
    assert "4.2 ms per step" in err and "--step-time SECONDS" in err


@pytest.mark.parametrize("name, profile, has", [("NVIDIA H100 80GB HBM3", "lumi-g", "AMD GPUs"),
                                                ("AMD Instinct MI250X / MI250", "generic-nvidia", "NVIDIA GPUs")])
def test_a_gpu_of_the_other_vendor_is_refused(tmp_path, name, profile, has):
    err = refused_in_one_line(gpuscale_predict(tmp_path, summary(device="cuda", device_name=name), "--profile", profile))
    assert f"ran on an {name.split()[0]} GPU ({name}), but profile {profile} has {has}" in err


def test_a_gpu_of_the_profile_s_vendor_is_projected_as_measured(tmp_path):
    result = gpuscale_predict(tmp_path, summary(device="cuda", device_name="NVIDIA H100 80GB HBM3"), "--profile", "generic-nvidia",
                              "--nproc", "1,2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("baseline: weak-1x1, 1 GPU (NVIDIA H100 80GB HBM3), 12.7 ms per step at 32 samples per device "
                                    "(measured)\n")
    assert ("overlap: communication hides behind 50% of the compute time (the default on GPUs, assumed: one run cannot show "
            "it; a study calibrates it from its measured runs, so its prediction may differ)") in result.stdout  # GPUs: 0.5


def test_a_summary_that_names_no_device_needs_the_step_time(tmp_path):
    old = summary()
    del old["device"], old["device_name"]
    err = refused_in_one_line(gpuscale_predict(tmp_path, old, "--profile", "lumi-g"))
    assert "does not say which device it ran on" in err and "--step-time SECONDS" in err
    assert gpuscale_predict(tmp_path, old, "--profile", "lumi-g", "--step-time", "0.02").returncode == 0


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_a_step_time_that_is_no_step_time_is_refused(tmp_path, value):
    err = refused_in_one_line(gpuscale_predict(tmp_path, summary(), "--profile", "lumi-g", "--step-time", value))
    assert "is not the seconds of one optimizer step" in err


def test_measure_needs_a_run_of_this_machine_s_devices(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs: a GPU run's step holds here")
    err = refused_in_one_line(gpuscale_predict(tmp_path, summary(device="cuda", device_name="NVIDIA H100 80GB HBM3"), "--measure"))
    assert "but this machine (--measure) has no GPUs" in err and "give the step time of one device here" in err


def test_the_batch_threshold_is_the_smallest_whole_batch_where_compute_covers_communication():
    base = predict.Baseline(step_time_s=0.1, per_device_batch=32, grad_accum_steps=1, gradient_bytes=100_000_000)
    link = predict.Link(intra_bandwidth=10e9, intra_latency=0.0, source="test")
    cells = matrix.cells([1, 2, 4], [1], ["weak"])
    per_sample = 0.1 / 32
    comm2, comm4 = 2 * 1 / 2 * 1e8 / 10e9, 2 * 3 / 4 * 1e8 / 10e9  # 10 ms, 15 ms
    plain = predict.predict(cells, base, link, overlap=0.0, base_global_batch=32).comm_dominates_below_batch
    assert plain == {"1x2": 4, "1x4": 5}  # 10 / 3.125 = 3.2 -> 4; 15 / 3.125 = 4.8 -> 5
    assert plain["1x4"] * per_sample >= comm4 and (plain["1x4"] - 1) * per_sample < comm4
    hidden = predict.predict(cells, base, link, overlap=0.5, base_global_batch=32).comm_dominates_below_batch
    assert hidden == {"1x2": math.ceil(comm2 / (1.5 * per_sample)), "1x4": math.ceil(comm4 / (1.5 * per_sample))} == {"1x2": 3, "1x4": 4}
    assert all(isinstance(v, int) for v in (*plain.values(), *hidden.values()))
    # 0.07 / 0.01 is 7.000000000000001 in floating point: a batch of 7 computes exactly as long as it communicates
    assert predict.smallest_computing_batch(0.07, 0.01, 0.0) == 7
    assert predict.smallest_computing_batch(1e-6, 0.01, 0.0) == 1  # compute covers communication at any batch


def test_a_step_waiting_for_data_hides_no_communication():
    """A single-device step of 100 ms at 32 samples, 40 ms of it waiting for the loader (the summary's data_wait),
    strong-scaled to 2 devices (16 samples each): 30 ms of compute and 20 ms of waiting. An all-reduce of 10 ms at an
    overlap of 0.25 hides behind 7.5 ms of compute: 2.5 ms exposed. Had the wait counted as compute (50 ms), all 10 ms
    would hide. Computed by hand."""
    run = predict.Baseline.from_summary(summary(step_time_s=0.1, step_breakdown_s={"data_wait": 0.04}))
    assert run.data_wait_s == 0.04 and run.compute_time_s == pytest.approx(0.06)
    link = predict.Link(intra_bandwidth=10e9, intra_latency=0.0, source="test")
    cell = Cell("strong", 1, 2)
    base = {**summary(), "gradient_bytes": 100_000_000}
    run = predict.Baseline.from_summary({**base, "step_time_s": 0.1, "step_breakdown_s": {"data_wait": 0.04}})
    predicted = predict.predict_cell(cell, run, link, overlap=0.25, base_global_batch=32)
    assert predicted["compute_s"] == pytest.approx(0.03) and predicted["data_wait_s"] == pytest.approx(0.02)
    assert predicted["comm_s"] == pytest.approx(0.01) and predicted["exposed_comm_s"] == pytest.approx(0.0025)
    assert predicted["step_time_s"] == pytest.approx(0.0525)
    all_compute = predict.predict_cell(cell, predict.Baseline.from_summary({**base, "step_time_s": 0.1}), link, 0.25, 32)
    assert all_compute["exposed_comm_s"] == 0.0 and all_compute["step_time_s"] == pytest.approx(0.05)
    # a step time given for a target device is its whole step: no data wait carried over from the run
    assert run.with_step_time(0.2).data_wait_s == 0.0
    # a wait longer than half the step is capped there: the compute left is never a sliver the timers' noise decides
    assert predict.Baseline.from_summary({**base, "step_time_s": 0.1, "step_breakdown_s": {"data_wait": 0.09}}).data_wait_s == 0.05


def test_the_prediction_states_its_baseline_and_the_table_its_units():
    run = predict.Baseline.from_summary(summary(), run="weak-1x1")
    link = predict.Link(intra_bandwidth=1e9, intra_latency=1e-4, source="measured (gloo, 2 processes)")
    cells = [Cell("weak", 1, 1), Cell("weak", 1, 2)]
    measured = predict.predict(cells, run, link, 0.0, 32).to_dict()
    assert measured["baseline"] == {"run": "weak-1x1", "device": "cpu", "device_name": "cpu", "per_device_batch": 32,
                                    "grad_accum_steps": 1, "step_time_s": 0.0127, "step_time_source": "measured: weak-1x1",
                                    "measured_step_time_s": 0.0127}
    text = format_prediction(measured, cells)
    assert text.splitlines()[0] == "baseline: weak-1x1, 1 CPU process, 12.7 ms per step at 32 samples per device (measured)"
    header = next(line for line in text.splitlines() if line.startswith("run "))
    for unit in ("batch/device (samples)", "compute (ms)", "all-reduce (ms)", "exposed (ms)", "throughput (samples/s)",
                 "efficiency (%)"):
        assert unit in header
    given = predict.predict(cells, run.with_step_time(0.004), link, 0.0, 32).to_dict()["baseline"]
    assert (given["step_time_s"], given["step_time_source"], given["measured_step_time_s"]) == (0.004, "--step-time", 0.0127)


def test_a_study_s_prediction_names_the_runs_it_starts_from():
    summaries = {"weak-1x1": summary(), "strong-1x1": summary(scaling="strong", step_time_s=0.026)}
    cells = matrix.cells([1, 2], [1], ["weak", "strong"])
    link = predict.Link(intra_bandwidth=1e9, intra_latency=1e-4, source="measured (gloo, 2 processes)")
    result = predict.predict_study(cells, summaries, link, 0.0)
    assert result["baseline"]["step_time_source"] == "measured: weak-1x1" and result["baseline"]["device"] == "cpu"
    assert {c["name"] for c in result["cells"]} == {"weak-1x1", "weak-1x2", "strong-1x1", "strong-1x2"}
    # each cell's batch sweet spot is its own group's: strong's baseline steps at 26 ms, weak's at 12.7 ms, so at the same
    # 1x2 shape strong's compute per sample is longer and communication dominates below a smaller batch
    below = {c["name"]: c["comm_dominates_below_batch"] for c in result["cells"]}
    alone = {scaling: predict.predict([c for c in cells if c.scaling == scaling], predict.Baseline.from_summary(
        summaries[f"{scaling}-1x1"], run=f"{scaling}-1x1"), link, 0.0, 32).to_dict()["comm_dominates_below_batch"]["1x2"]
        for scaling in ("weak", "strong")}
    assert below["weak-1x2"] == alone["weak"] and below["strong-1x2"] == alone["strong"], (below, alone)
    assert alone["strong"] < alone["weak"]


@pytest.mark.parametrize("damage, message", [({"device": ["cuda"]}, r"device is \['cuda'\], not text"),
                                             ({"per_device_batch": 32.5}, "not a whole number"),
                                             ({"global_batch": 10**400}, "not a whole number"),
                                             ({"step_time_s": 5e-324}, "not a step time from 1e-09 to 1e[+]07 s")])
def test_a_damaged_summary_is_refused_in_one_line(damage, message):
    with pytest.raises(ValueError, match=message) as refused:
        predict.Baseline.from_summary(summary(**damage), run="weak-1x1")
    assert "\n" not in str(refused.value)


WALKTHROUGH_BYTES = round(32.05 * 2**20)  # the walkthrough's runs/big: 33.6 MB, 1 MiB first bucket then two: 3 buckets


def test_a_ring_of_one_gpu_per_node_has_only_inter_node_links():
    """lumi-g: 50 GB/s and 10 us within a node, 100 GB/s and 20 us between. By hand, 3 buckets, S = 33.6 MB:
    2x1 (every link between nodes): 2 * 1 * 20 us * 3 + 2 * 1/2 * S / 100 GB/s = 0.120 + 0.336 = 0.456 ms (it printed
    0.8 ms: S over the intra-node 50 GB/s); 1x2 (within the node): 2 * 10 us * 3 + S / 50 GB/s = 0.060 + 0.672 = 0.732 ms;
    2x2 (both: the slower of each): 2 * 3 * 20 us * 3 + 2 * 3/4 * S / 50 GB/s = 0.360 + 1.008 = 1.368 ms."""
    from gpuscale.slurm.profiles import load_profile

    link = predict.Link.from_profile(load_profile("lumi-g"))
    base = predict.Baseline(step_time_s=0.0045, per_device_batch=32, grad_accum_steps=1, gradient_bytes=WALKTHROUGH_BYTES)
    size = WALKTHROUGH_BYTES
    assert size == pytest.approx(33.6e6, rel=1e-3)
    comm = {name: predict.predict_cell(cell, base, link, 0.0, 32)["comm_s"]
            for name, cell in (("2x1", Cell("weak", 2, 1)), ("1x2", Cell("weak", 1, 2)), ("2x2", Cell("weak", 2, 2)))}
    assert comm["2x1"] == pytest.approx(2 * 1 * 20e-6 * 3 + size / 100e9) and round(1e3 * comm["2x1"], 3) == 0.456
    assert comm["1x2"] == pytest.approx(2 * 1 * 10e-6 * 3 + size / 50e9) and round(1e3 * comm["1x2"], 3) == 0.732
    assert comm["2x2"] == pytest.approx(2 * 3 * 20e-6 * 3 + 1.5 * size / 50e9) and round(1e3 * comm["2x2"], 3) == 1.368
    for shape, figures in (((2, 1), (100e9, 20e-6)), ((1, 8), (50e9, 10e-6)), ((4, 8), (50e9, 20e-6))):
        assert link.for_ring(*shape) == pytest.approx(figures), shape
    # the batch sweet spot of 2x1 is the inter-node ring's too: 0.456 ms over 4.5 ms / 32 per sample = 3.24 -> 4 (not 6)
    below = predict.predict([Cell("weak", 2, 1)], base, link, 0.0, 32).comm_dominates_below_batch
    assert below == {"2x1": math.ceil(comm["2x1"] / (0.0045 / 32))} == {"2x1": 4}


def test_gpuscale_predict_prints_the_inter_node_ring_for_one_gpu_per_node(tmp_path):
    """The walkthrough's command: `gpuscale predict runs/big --profile lumi-g --step-time 0.045 --nodes 1,2`; weak-2x1's
    all-reduce is 0.456 ms (above, by hand), printed to 0.1 ms: 0.5, where it printed 0.8."""
    result = gpuscale_predict(tmp_path, summary(gradient_bytes=WALKTHROUGH_BYTES), "--profile", "lumi-g", "--step-time", "0.045",
                              "--nproc", "1", "--nodes", "1,2", "--scaling", "weak")
    assert result.returncode == 0, result.stderr
    assert table_row(result.stdout, "weak-2x1")[4] == "0.5"


def test_a_strong_scaling_shape_the_study_refuses_is_not_predicted_as_a_fraction():
    """`gpuscale predict --nproc 3` of a run at global batch 32: 32 / 3 = 10.67 samples per device, a batch no study
    can run. The cell says so in plan_batch's words (what the study refuses it with) and has no figures but its
    all-reduce; 2 and 4 devices divide 32 (16 and 8 per device)."""
    from gpuscale.base.batchplan import plan_batch

    base = predict.Baseline.from_summary(summary(), run="weak-1x1")
    link = predict.Link(intra_bandwidth=1e9, intra_latency=1e-4, source="measured (gloo, 2 processes)")
    cells = matrix.cells([1, 2, 3, 4], [1], ["weak", "strong"])
    prediction = predict.predict(cells, base, link, 0.0, 32).to_dict()
    by = {c["name"]: c for c in prediction["cells"]}
    refused = by["strong-1x3"]
    with pytest.raises(ValueError) as study_says:
        plan_batch(32, 3, "strong")
    assert refused["refused"] == str(study_says.value) == (
        "global batch 32 does not divide among 3 ranks (32 // 3 = 10 would silently train with 30); use a global batch of "
        "30 or 33, or run on 1, 2, 4, 8 ranks")
    assert all(refused[k] is None for k in ("per_device_batch", "compute_s", "step_time_s", "samples_per_s", "efficiency"))
    assert refused["comm_s"] == pytest.approx(2 * 2 * 1e-4 * 3 + 2 * 2 / 3 * GRADIENT_BYTES / 1e9)  # the gradients' all-reduce stands
    assert (by["strong-1x2"]["per_device_batch"], by["strong-1x4"]["per_device_batch"], by["weak-1x3"]["per_device_batch"]) == (16, 8, 32)
    text = format_prediction(prediction, cells)
    assert "10.67" not in text and "10.7" not in text
    assert table_row(text, "strong-1x3")[2:] == ["—", "—", f"{1e3 * refused['comm_s']:.1f}", "—", "—", "—"]
    assert f"strong-1x3: not predicted: {study_says.value}" in text.splitlines()


def test_a_baseline_that_accumulated_keeps_whole_micro_batches_when_strong_scaled():
    """A run of 4 micro-batches of 16 per step (global batch 64), 100 ms per step, strong-scaled to 32 devices: 2 samples
    each. Keeping 4 micro-batches would make each 0.5 samples; as a study plans it (no device holding more per pass
    than the baseline's 16) each device runs one pass of 2: compute 100 ms x 2 / 64 = 3.125 ms, 64 samples a step."""
    base = predict.Baseline(step_time_s=0.1, per_device_batch=16, grad_accum_steps=4, gradient_bytes=1_000_000)
    link = predict.Link(intra_bandwidth=1e12, intra_latency=0.0, source="test")
    cell = predict.predict_cell(Cell("strong", 1, 32), base, link, 0.0, 64)
    assert (cell["per_device_batch"], cell["grad_accum_steps"]) == (2, 1)
    assert cell["compute_s"] == pytest.approx(0.003125)
    assert cell["samples_per_s"] == pytest.approx(64 / cell["step_time_s"])
    two = predict.predict_cell(Cell("strong", 1, 2), base, link, 0.0, 64)  # 32 each: 2 passes of 16
    assert (two["per_device_batch"], two["grad_accum_steps"]) == (16, 2) and two["compute_s"] == pytest.approx(0.05)


def test_a_refused_cell_is_shown_as_such_and_calibrates_nothing():
    """The study's report says "does not divide" in the predicted runs' batch column; calibration skips the cell."""
    from gpuscale.study.calibrate import link_fit, run_overlaps
    from gpuscale.study.explain import prediction_table

    cell = {"name": "strong-1x3", "world_size": 3, "nodes": 1, "per_device_batch": None, "compute_s": None, "comm_s": 0.01,
            "exposed_comm_s": None, "step_time_s": None, "samples_per_s": None, "efficiency": None, "run": True,
            "refused": "global batch 32 does not divide among 3 ranks"}
    _, [row] = prediction_table({"prediction": {"cells": [cell]}})
    assert row[3] == "does not divide" and row[-1] == "—"
    measured = {"name": "strong-1x3", "world_size": 3, "samples_per_s": 250.0, "per_device_batch": 10,
                "loss_breakdown": {"exposed_comm": 0.1}}
    assert run_overlaps({"cells": [cell]}, [measured]) == {} and link_fit({"cells": [cell]}, [measured]) is None
