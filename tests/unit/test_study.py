"""Scaling studies without processes: the matrix, resumability bookkeeping, the analysis and the cost model."""

import json
import math
import re

import pytest
import torch

from gpuscale.study import analysis, explain, matrix, missing, predict, runner
from gpuscale.study.command import StudyCommand
from gpuscale.study.linkmeasure import fit
from gpuscale.study.matrix import Cell


def test_counts_and_scalings_parse_or_say_what_is_wrong():
    assert matrix.parse_counts("4,1,2,2", "--nproc") == [1, 2, 4]
    with pytest.raises(ValueError, match=r"--nproc '1,x'.*comma-separated"):
        matrix.parse_counts("1,x", "--nproc")
    with pytest.raises(ValueError, match="at least 1"):
        matrix.parse_counts("0,2", "--nodes")
    assert matrix.parse_scalings("strong,weak") == ["weak", "strong"]
    with pytest.raises(ValueError, match="choose from weak, strong"):
        matrix.parse_scalings("weak,wide")


def test_default_process_counts_double_up_to_the_devices():
    assert matrix.default_nproc(8) == [1, 2, 4, 8]
    assert matrix.default_nproc(3) == [1, 2, 3]
    assert matrix.default_nproc(1) == [1]
    assert matrix.default_nproc(0) == [1]


def test_each_cell_gets_scaling_and_out_and_local_runs_refuse_many_nodes():
    cells = matrix.cells([1, 2], [1], ["weak", "strong"])
    assert [c.name for c in cells] == ["weak-1x1", "weak-1x2", "strong-1x1", "strong-1x2"]
    command = StudyCommand.for_script(["train.py", "--epochs", "2"], "import gpuscale\n")
    argv = matrix.local_argv(cells[1], command.argv_for(cells[1], "out/weak-1x2", 1), python="py")
    assert argv == ["py", "-m", "gpuscale", "run", "--nproc-per-node", "2", "train.py", "--epochs", "2",
                    "--scaling", "weak", "--out", "out/weak-1x2"]
    with pytest.raises(ValueError, match="--launcher slurm"):
        matrix.local_argv(Cell("weak", 2, 1), ["train.py"])


def test_cpu_cells_give_every_process_the_same_cores():
    cores = list(range(8))
    assert matrix.cpu_cores_for(Cell("weak", 1, 1), 4, cores) == [0, 1]
    assert matrix.cpu_cores_for(Cell("weak", 1, 4), 4, cores) == cores
    assert matrix.cpu_cores_for(Cell("weak", 1, 1), 2, [0, 1]) == [0]


def _summary(world, scaling, sps, time_s, epochs=2, batch=32, acc=0.9, data_wait=0.1, step=0.1, util=None):
    gb = batch * world if scaling == "weak" else batch
    return {"world_size": world, "scaling": scaling, "samples_per_s": sps, "train_time_s": time_s, "epochs": epochs,
            "global_batch": gb, "per_device_batch": gb // world, "steps": 10, "samples": 1000, "step_time_s": step,
            "accuracy": acc, "final_loss": 0.3, "gradient_bytes": 4_000_000, "grad_accum_steps": 1, "device": "cpu",
            "time_split_s": {"startup": 3.0, "data_wait": data_wait, "compute": time_s - data_wait, "eval": 0.0, "checkpoint": 0.0},
            "utilisation": util}


def _write_study(tmp_path, summaries):
    cells = [Cell(s["scaling"], 1, s["world_size"]) for s in summaries]
    runner.record_study(tmp_path, ["train.py"], "local", cells)
    for cell, summary in zip(cells, summaries, strict=True):
        (tmp_path / cell.name).mkdir()
        (tmp_path / cell.name / "summary.json").write_text(json.dumps(summary))


def test_speedup_and_efficiency_are_throughput_for_both_scalings_and_time_to_result_is_separate(tmp_path):
    weak2, strong2 = _summary(2, "weak", 180.0, 11.0, acc=0.8, step=0.111), _summary(2, "strong", 170.0, 6.25)
    base_strong = _summary(1, "strong", 100.0, 10.0)
    base_strong["time_to_result_s"], strong2["time_to_result_s"] = 20.0, 12.5
    _write_study(tmp_path, [_summary(1, "weak", 100.0, 10.0), weak2, base_strong, strong2])
    results = analysis.analyse(tmp_path)
    rows = {r["name"]: r for r in results["rows"]}
    assert results["version"] == 2 and results["baseline"] == {"weak": "weak-1x1", "strong": "strong-1x1"}
    assert rows["weak-1x2"]["speedup"] == pytest.approx(1.8) and rows["weak-1x2"]["efficiency"] == pytest.approx(0.9)
    # strong scaling: the same basis, throughput (170 / 100), not the time of the run
    assert rows["strong-1x2"]["speedup"] == pytest.approx(1.7) and rows["strong-1x2"]["efficiency"] == pytest.approx(0.85)
    assert rows["strong-1x2"]["ideal_samples_per_s"] == pytest.approx(200.0)
    # time to result is its own column: 20 s against 12.5 s for the same epochs
    assert rows["strong-1x2"]["time_speedup"] == pytest.approx(1.6)
    # a summary without time_to_result_s (gpuscale before 0.2): startup + train_time_s
    assert rows["weak-1x2"]["time_to_result_s"] == pytest.approx(3.0 + 11.0)
    assert rows["weak-1x2"]["time_speedup"] == pytest.approx(13.0 / 14.0)
    assert rows["weak-1x2"]["metric"] == "accuracy" and rows["weak-1x2"]["metric_value"] == 0.8
    # weak scaling doubled the global batch and lost accuracy: the row says so, and what to do
    flag = next(f for f in rows["weak-1x2"]["flags"] if f.startswith("accuracy"))
    assert "global batch is 64 instead of 32" in flag and "--lr-scaling linear" in flag and "no lr rule recorded" in flag
    assert not rows["strong-1x2"]["flags"]


def _split(step, data, compute, comm, imbalance):
    return {"step": step, "data_wait": data, "compute": compute, "exposed_comm": comm, "imbalance": imbalance,
            "other": step - data - compute - comm - imbalance}


def test_lost_efficiency_splits_into_measured_parts_computed_by_hand(tmp_path):
    """Each part is the growth of a per-sample time against the baseline, in % of ideal; they sum to 1 - efficiency."""
    base = _summary(1, "weak", 100.0, 10.0)  # 0.01 s per sample, 32 per step: 0.32 s per step
    base["step_breakdown_s"] = _split(0.32, data=0.032, compute=0.256, comm=0.0, imbalance=0.0)
    weak = _summary(2, "weak", 160.0, 10.0)  # 2 / 160 = 0.0125 s per sample on a device: 0.4 s per step of 32
    weak["step_breakdown_s"] = _split(0.4, data=0.048, compute=0.256, comm=0.048, imbalance=0.016)
    base_strong = _summary(1, "strong", 100.0, 10.0)
    base_strong["step_breakdown_s"] = _split(0.32, data=0.032, compute=0.256, comm=0.0, imbalance=0.0)
    strong = _summary(2, "strong", 150.0, 10.0)  # 16 per device: 2 / 150 * 16 = 0.21333 s per step
    strong["step_breakdown_s"] = _split(2 / 150 * 16, data=0.016, compute=0.136, comm=0.032, imbalance=0.008)
    _write_study(tmp_path, [base, weak, base_strong, strong])
    rows = {r["name"]: r for r in analysis.analyse(tmp_path)["rows"]}
    w = rows["weak-1x2"]
    assert w["efficiency"] == pytest.approx(0.8)
    assert w["loss_breakdown"] == pytest.approx({"data": 0.04, "exposed_comm": 0.12, "imbalance": 0.04, "jitter": None, "compute": 0.0,
                                               "rest": 0.0})
    s = rows["strong-1x2"]
    assert s["efficiency"] == pytest.approx(0.75)
    # per sample: data 0.001 vs 0.001; compute 0.0085 vs 0.008; comm 0.002; imbalance 0.0005; t = 0.013333
    assert s["loss_breakdown"] == pytest.approx({"data": 0.0, "exposed_comm": 0.15, "imbalance": 0.0375, "jitter": None,
                                                  "compute": 0.0375, "rest": 0.025})
    assert sum(v for v in s["loss_breakdown"].values() if v is not None) == pytest.approx(1 - s["efficiency"])
    assert rows["weak-1x1"]["loss_breakdown"] == {p: 0.0 for p in analysis.PARTS}
    assert any("lost 12% of ideal throughput to exposed communication" in f for f in w["flags"])
    assert any("lost 15% of ideal throughput to exposed communication" in f for f in s["flags"])


def test_a_one_process_baseline_without_ddp_has_no_communication_to_compare_against(tmp_path):
    """Accelerate, Lightning and the Trainer wrap no DDP model on one process: the baseline times no communication,
    imbalance or jitter, and has none of them. The 2-process run's measured parts are its loss, not "not measured"."""
    base = _summary(1, "weak", 100.0, 10.0)  # 0.01 s per sample: 0.32 s per step of 32
    base["step_breakdown_s"] = {"step": 0.32, "data_wait": 0.032, "compute": None, "exposed_comm": None, "imbalance": None,
                                "jitter": None, "persistent_imbalance": None, "other": None}
    weak = _summary(2, "weak", 160.0, 10.0)  # 0.0125 s per sample on a device: 0.4 s per step of 32
    weak["step_breakdown_s"] = {"step": 0.4, "data_wait": 0.032, "compute": 0.256, "exposed_comm": 0.048, "imbalance": 0.024,
                                "persistent_imbalance": 0.016, "jitter": 0.008, "other": 0.04}
    _write_study(tmp_path, [base, weak])
    row = {r["name"]: r for r in analysis.analyse(tmp_path)["rows"]}["weak-1x2"]
    # per sample on a device: comm 0.048 / 32 = 0.0015, imbalance 0.0005, jitter 0.00025, against t = 0.0125
    assert row["loss_breakdown"] == pytest.approx({"data": 0.0, "exposed_comm": 0.12, "imbalance": 0.04, "jitter": 0.02,
                                                   "compute": None, "rest": 0.02})


def _ddp_timed(split: dict, persistent: float, jitter: float, slowdown: float | None = None) -> dict:
    """A split as the probe's merge writes it from DDP's timers: imbalance in its two parts, the slowed backward."""
    return {**split, "imbalance": persistent + jitter, "persistent_imbalance": persistent, "jitter": jitter,
            "comm_slowdown": slowdown}


def test_a_slow_rank_jitter_and_the_backward_the_all_reduce_slowed_by_hand(tmp_path):
    """Strong scaling 1 -> 2 of a script the probe measured: its split (`stepsplit`) already counts 4 ms per step of
    backward slowed by the all-reduce as exposed communication (36 ms with it), and 30 of its 32 ms of imbalance
    are rank 1 lagging on average. The study shows each part, names rank 1 and says what the parts rest on."""
    base = _summary(1, "strong", 100.0, 10.0)
    base["step_breakdown_s"] = _ddp_timed(_split(0.32, data=0.032, compute=0.256, comm=0.0, imbalance=0.0), 0.0, 0.0, 0.0)
    two = _summary(2, "strong", 150.0, 10.0)
    two["step_breakdown_s"] = _ddp_timed(_split(2 / 150 * 16, data=0.016, compute=0.108, comm=0.036, imbalance=0.032),
                                         persistent=0.030, jitter=0.002, slowdown=0.004)
    for summary in (base, two):
        summary["measured_by"] = "probe"
        summary["sync_probe"] = {"status": "measured", "probes": 190, "of_steps": 200, "source": "ddp_timers",
                                 "slow_rank": 1 if summary is two else None}
    _write_study(tmp_path, [base, two])
    results = analysis.analyse(tmp_path)
    row = {r["name"]: r for r in results["rows"]}["strong-1x2"]
    assert row["comm_slowdown_s"] == pytest.approx(0.004)
    t = 2 / 150  # seconds per sample on a device
    assert row["loss_breakdown"]["exposed_comm"] == pytest.approx(0.036 / 16 / t)
    assert row["loss_breakdown"]["compute"] == pytest.approx((0.108 / 16 - 0.256 / 32) / t)
    assert row["loss_breakdown"]["imbalance"] == pytest.approx(0.030 / 16 / t)  # the persistent part
    assert row["loss_breakdown"]["jitter"] == pytest.approx(0.002 / 16 / t)
    assert sum(row["loss_breakdown"].values()) == pytest.approx(1 - row["efficiency"])
    flag = next(f for f in row["flags"] if "to imbalance" in f)
    assert "rank 1 is slower on average" in flag
    line = dict(explain.why_not_more(results))["strong-1x2"]
    assert "imbalance 14% (rank 1 slower on average)" in line
    assert "(with 4.0 ms per step of backward slowed by the all-reduce beside it)" in line
    assert "data rests on all 200 steps; communication, imbalance, jitter and compute on 190 of them (DDP's timers)" in line


def test_jitter_gets_its_own_flag_and_no_slow_rank_is_named(tmp_path):
    base = _summary(1, "strong", 100.0, 10.0)
    base["step_breakdown_s"] = _ddp_timed(_split(0.32, data=0.032, compute=0.256, comm=0.0, imbalance=0.0), 0.0, 0.0)
    two = _summary(2, "strong", 150.0, 10.0)
    two["step_breakdown_s"] = _ddp_timed(_split(2 / 150 * 16, data=0.016, compute=0.136, comm=0.016, imbalance=0.024),
                                         persistent=0.0, jitter=0.024)
    _write_study(tmp_path, [base, two])
    row = {r["name"]: r for r in analysis.analyse(tmp_path)["rows"]}["strong-1x2"]
    assert row["loss_breakdown"]["imbalance"] == pytest.approx(0.0) and row["loss_breakdown"]["jitter"] > 0.1
    assert not any("to imbalance" in f for f in row["flags"])
    jitter = next(f for f in row["flags"] if "to jitter" in f)
    assert "no rank is slower on average" in jitter and "cores of its own" in jitter


def test_unmeasured_parts_are_none_and_fall_into_the_rest(tmp_path):
    base, two = _summary(1, "weak", 100.0, 10.0), _summary(2, "weak", 150.0, 10.0)
    base["step_breakdown_s"] = _split(0.32, data=0.032, compute=0.256, comm=0.0, imbalance=0.0)
    two["step_breakdown_s"] = {"step": 2 / 150 * 32, "data_wait": 0.064, "compute": None, "exposed_comm": None,
                               "imbalance": None, "other": None}
    two["sync_probe"] = {"status": "not measured", "why": "fsdp: cannot"}
    _write_study(tmp_path, [base, two])
    row = analysis.analyse(tmp_path)["rows"][1]
    shares = row["loss_breakdown"]
    assert shares["data"] == pytest.approx((0.002 - 0.001) / (2 / 150))
    assert shares["exposed_comm"] is None and shares["imbalance"] is None and shares["compute"] is None
    assert shares["rest"] == pytest.approx(0.25 - shares["data"])


def test_prediction_stands_beside_each_row_part_by_part(tmp_path):
    _write_study(tmp_path, [_summary(1, "weak", 100.0, 10.0), _summary(2, "weak", 160.0, 10.0)])
    prediction = {"cells": [{"name": "weak-1x1", "samples_per_s": 100.0, "efficiency": 1.0, "step_time_s": 0.32, "exposed_comm_s": 0.0},
                            {"name": "weak-1x2", "samples_per_s": 170.0, "efficiency": 0.85, "step_time_s": 0.4, "exposed_comm_s": 0.06}]}
    rows = analysis.analyse(tmp_path, prediction)["rows"]
    assert rows[1]["predicted_efficiency"] == 0.85 and rows[1]["predicted_samples_per_s"] == 170.0
    assert rows[1]["predicted_breakdown"] == {"data": None, "exposed_comm": pytest.approx(0.15), "imbalance": None,
                                              "jitter": None, "compute": 0.0, "rest": None}
    assert rows[0]["predicted_breakdown"] is None


def test_accuracy_flag_names_the_rule_and_the_phase_that_lost_it(tmp_path):
    base, two = _summary(1, "weak", 100.0, 10.0, acc=0.906), _summary(2, "weak", 180.0, 10.0, acc=0.768)
    base["per_epoch"] = [{"epoch": 1, "phase": "head", "val_accuracy": 0.55}, {"epoch": 2, "phase": "head", "val_accuracy": 0.877},
                         {"epoch": 3, "phase": "fine-tune", "val_accuracy": 0.906}]
    two["per_epoch"] = [{"epoch": 1, "phase": "head", "val_accuracy": 0.91}, {"epoch": 2, "phase": "head", "val_accuracy": 0.909},
                        {"epoch": 3, "phase": "fine-tune", "val_accuracy": 0.768}]
    two["lr"] = {"rule": "none", "factor": 1.0, "base_lr": 0.003, "lr": 0.003, "base_batch": 64, "global_batch": 64, "warmup_steps": 0}
    _write_study(tmp_path, [base, two])
    row = analysis.analyse(tmp_path)["rows"][1]
    flag = next(f for f in row["flags"] if f.startswith("accuracy"))
    assert "lr rule 'none'" in flag and "in phase 'fine-tune' (epoch 3: validation 0.768 against 0.906)" in flag
    assert row["lr"]["rule"] == "none"


def test_strong_scaling_compares_time_per_epoch_when_epochs_differ(tmp_path):
    _write_study(tmp_path, [_summary(1, "strong", 100.0, 10.0, epochs=2), _summary(2, "strong", 190.0, 10.0, epochs=4)])
    rows = analysis.analyse(tmp_path)["rows"]
    assert rows[1]["time_speedup"] == pytest.approx(2.0)  # 10 s for 2 epochs against 10 s for 4
    assert rows[1]["speedup"] == pytest.approx(1.9)  # throughput needs no such care


def test_unfinished_or_mismatched_cells_are_not_rows(tmp_path):
    _write_study(tmp_path, [_summary(1, "weak", 100.0, 10.0), _summary(2, "weak", 180.0, 11.0)])
    (tmp_path / "weak-1x2" / "summary.json").write_text(json.dumps(_summary(4, "weak", 1.0, 1.0)))  # another shape
    assert [r["name"] for r in analysis.analyse(tmp_path)["rows"]] == ["weak-1x1"]
    (tmp_path / "weak-1x2" / "summary.json").write_text("{not json")
    assert [r["name"] for r in analysis.analyse(tmp_path)["rows"]] == ["weak-1x1"]


def test_a_study_directory_holds_one_command(tmp_path):
    runner.record_study(tmp_path, ["a.py"], "local", [Cell("weak", 1, 1)])
    runner.record_study(tmp_path, ["a.py"], "local", [Cell("weak", 1, 2)])  # more cells: fine
    assert [c["name"] for c in json.loads((tmp_path / "study.json").read_text())["cells"]] == ["weak-1x1", "weak-1x2"]
    with pytest.raises(ValueError, match="holds a study of `a.py`.*another --out"):
        runner.record_study(tmp_path, ["b.py"], "local", [Cell("weak", 1, 1)])
    with pytest.raises(ValueError, match="not a study directory"):
        analysis.analyse(tmp_path / "nowhere")


def test_flags_name_a_starving_loader_and_an_idle_device(tmp_path):
    util = {"devices": [{"rank": 0, "device": "cuda:0", "host": "n1", "util_mean": 95.0},
                        {"rank": 1, "device": "cuda:1", "host": "n1", "util_mean": 20.0}]}
    _write_study(tmp_path, [_summary(1, "weak", 100.0, 10.0, data_wait=4.0), _summary(2, "weak", 190.0, 10.0, util=util)])
    rows = analysis.analyse(tmp_path)["rows"]
    assert any("waited for data 40% of its training time (data wait / training time" in f for f in rows[0]["flags"])
    assert any(f.startswith("rank 1 (cuda:1 on n1) was busy 20% of the time (GPU)") for f in rows[1]["flags"])


def test_ring_allreduce_time_follows_the_formula():
    # 2 (N-1) alpha + 2 (N-1)/N S/B, one bucket
    assert predict.allreduce_seconds(1e6, 4, bandwidth=1e9, latency=1e-5) == pytest.approx(6e-5 + 1.5e-3)
    assert predict.allreduce_seconds(1e6, 1, 1e9, 1e-5) == 0.0
    # 100 MiB go in DDP's buckets: 1 MiB first, then 4 of up to 25 MiB, each paying the latency
    assert predict.allreduce_seconds(100 * 2**20, 2, 1e12, 1e-3) == pytest.approx(2 * 1e-3 * 5 + 100 * 2**20 / 1e12)


def test_prediction_weak_strong_and_the_batch_sweet_spot():
    base = predict.Baseline(step_time_s=0.1, per_device_batch=32, grad_accum_steps=1, gradient_bytes=100_000_000)
    link = predict.Link(intra_bandwidth=10e9, intra_latency=0.0, source="test")
    cells = matrix.cells([1, 2, 4], [1], ["weak", "strong"])
    p = predict.predict(cells, base, link, overlap=0.0, base_global_batch=32).to_dict()
    by = {c["name"]: c for c in p["cells"]}
    comm4 = 2 * 3 / 4 * 1e8 / 10e9  # 15 ms
    assert by["weak-1x1"]["samples_per_s"] == pytest.approx(320.0)
    assert by["weak-1x4"]["step_time_s"] == pytest.approx(0.1 + comm4)
    assert by["weak-1x4"]["efficiency"] == pytest.approx(0.1 / (0.1 + comm4))
    assert by["strong-1x4"]["per_device_batch"] == 8
    assert by["strong-1x4"]["step_time_s"] == pytest.approx(0.025 + comm4)
    # communication outlasts compute below comm / per-sample time, rounded up to a whole batch
    assert p["comm_dominates_below_batch"]["1x4"] == math.ceil(comm4 / (0.1 / 32))
    # overlap hides communication behind compute, never more than all of it
    hidden = predict.predict(cells, base, link, overlap=1.0, base_global_batch=32).to_dict()
    assert {c["name"]: c for c in hidden["cells"]}["weak-1x4"]["exposed_comm_s"] == 0.0
    with pytest.raises(ValueError, match="between 0"):
        predict.predict(cells, base, link, overlap=1.5, base_global_batch=32)


def test_prediction_across_nodes_needs_and_uses_the_inter_node_link():
    base = predict.Baseline(step_time_s=0.1, per_device_batch=32, grad_accum_steps=1, gradient_bytes=10**8)
    fast = predict.Link(intra_bandwidth=100e9, intra_latency=1e-5, source="p")
    with pytest.raises(ValueError, match="inter_node_gbps"):
        predict.predict([Cell("weak", 2, 4)], base, fast, 0.0, 32)
    link = predict.Link(intra_bandwidth=100e9, intra_latency=1e-5, inter_bandwidth=10e9, inter_latency=2e-5, source="p")
    two = predict.predict([Cell("weak", 1, 8), Cell("weak", 2, 4)], base, link, 0.0, 32).cells
    assert two[1]["comm_s"] > 5 * two[0]["comm_s"]  # the ring's slowest link is off the node


def test_baseline_must_be_a_single_device_run_with_gradient_bytes():
    summary = _summary(1, "weak", 100.0, 10.0)
    assert predict.Baseline.from_summary(summary).gradient_bytes == 4_000_000
    with pytest.raises(ValueError, match="single-device run"):
        predict.Baseline.from_summary({**summary, "world_size": 2})
    with pytest.raises(ValueError, match="no gradient_bytes"):
        predict.Baseline.from_summary({**summary, "gradient_bytes": None})


def test_profiles_carry_interconnect_figures():
    from gpuscale.slurm.profiles import load_profile

    link = predict.Link.from_profile(load_profile("lumi-g"))
    assert link.intra_bandwidth == 50e9 and link.inter_bandwidth == 100e9
    with pytest.raises(ValueError, match="no interconnect figures"):
        predict.Link.from_profile(load_profile("local"))
    with pytest.raises(ValueError, match="must be a positive number"):
        load_profile("lumi-g", {"inter_node_gbps": -1})


def test_link_fit_recovers_latency_and_bandwidth():
    alpha, bandwidth, n = 5e-5, 2e9, 4
    sizes = [8e3, 1e5, 1e6, 1e7]
    seconds = [2 * (n - 1) * alpha + 2 * (n - 1) / n * s / bandwidth for s in sizes]
    got_alpha, got_bw = fit(sizes, seconds, n)
    assert math.isclose(got_alpha, alpha, rel_tol=1e-6) and math.isclose(got_bw, bandwidth, rel_tol=1e-6)


def test_variants_get_their_own_cells_arguments_and_baselines(tmp_path):
    variants = [matrix.parse_variant("small="), matrix.parse_variant("large=--swap-train-test --lr '0.1'")]
    assert variants[1] == ("large", ("--swap-train-test", "--lr", "0.1"))
    cells = matrix.cells([1, 2], [1], ["weak"], variants)
    assert [c.name for c in cells] == ["small-weak-1x1", "small-weak-1x2", "large-weak-1x1", "large-weak-1x2"]
    command = StudyCommand.for_script(["dvc.py"], "from gpuscale import Meter\n")
    assert command.argv_for(cells[2], "d", 1) == ["dvc.py", "--swap-train-test", "--lr", "0.1", "--scaling", "weak", "--out", "d"]
    with pytest.raises(ValueError, match="NAME=ARGS"):
        matrix.parse_variant("large")
    with pytest.raises(ValueError, match="must differ"):
        matrix.cells([1], [1], ["weak"], [("a", ()), ("a", ("-x",))])
    runner.record_study(tmp_path, ["dvc.py"], "local", cells)
    for cell, sps in zip(cells, [100.0, 150.0, 50.0, 95.0], strict=True):
        (tmp_path / cell.name).mkdir()
        (tmp_path / cell.name / "summary.json").write_text(json.dumps(_summary(cell.world_size, "weak", sps, 10.0)))
    results = analysis.analyse(tmp_path)
    assert results["baseline"] == {"small/weak": "small-weak-1x1", "large/weak": "large-weak-1x1"}
    rows = {r["name"]: r for r in results["rows"]}
    assert [r["name"] for r in results["rows"]] == [c.name for c in cells]
    assert rows["small-weak-1x2"]["speedup"] == pytest.approx(1.5) and rows["large-weak-1x2"]["speedup"] == pytest.approx(1.9)


def test_repeats_run_in_rounds_and_the_row_is_the_median_run(tmp_path):
    cells = matrix.cells([1, 2], [1], ["weak"], repeats=3)
    assert [c.name for c in cells] == ["weak-1x1", "weak-1x2", "weak-1x1.r2", "weak-1x2.r2", "weak-1x1.r3", "weak-1x2.r3"]
    with pytest.raises(ValueError, match="--repeat 0"):
        matrix.cells([1], [1], ["weak"], repeats=0)
    runner.record_study(tmp_path, ["t.py"], "local", cells)
    throughput = {"weak-1x1": 100.0, "weak-1x1.r2": 104.0, "weak-1x1.r3": 98.0,
                  "weak-1x2": 150.0, "weak-1x2.r2": 190.0, "weak-1x2.r3": 170.0}
    for cell in cells:
        (tmp_path / cell.name).mkdir()
        summary = _summary(cell.world_size, "weak", throughput[cell.name], 10.0)
        summary["run_marker"] = cell.name
        (tmp_path / cell.name / "summary.json").write_text(json.dumps(summary))
    rows = {r["name"]: r for r in analysis.analyse(tmp_path)["rows"]}
    assert set(rows) == {"weak-1x1", "weak-1x2"}
    assert rows["weak-1x2"]["run"] == "weak-1x2.r3" and rows["weak-1x2"]["samples_per_s"] == 170.0
    assert rows["weak-1x2"]["repeats"] == 3 and rows["weak-1x2"]["samples_per_s_runs"] == [150.0, 170.0, 190.0]
    assert rows["weak-1x2"]["speedup"] == pytest.approx(1.7)
    assert any("3 runs spread over 24%" in f for f in rows["weak-1x2"]["flags"])
    assert not any("spread" in f for f in rows["weak-1x1"]["flags"])


def test_with_repeats_the_table_shows_the_range_of_throughput_and_efficiency(tmp_path):
    """weak-1x2's runs 150, 170, 190 samples/s against the baseline's median 100: efficiency 75%, 85%, 95% by hand."""
    from gpuscale.study.report_cells import cells as table_cells

    cells = matrix.cells([1, 2], [1], ["weak"], repeats=3)
    runner.record_study(tmp_path, ["t.py"], "local", cells)
    throughput = {"weak-1x1": 100.0, "weak-1x1.r2": 104.0, "weak-1x1.r3": 98.0,
                  "weak-1x2": 150.0, "weak-1x2.r2": 190.0, "weak-1x2.r3": 170.0}
    for cell in cells:
        (tmp_path / cell.name).mkdir()
        (tmp_path / cell.name / "summary.json").write_text(json.dumps(_summary(cell.world_size, "weak", throughput[cell.name], 10.0)))
    results = analysis.analyse(tmp_path)
    cols, lines = table_cells(results)
    table = {line[0]: dict(zip([c.key for c in cols], line, strict=True)) for line in lines}
    assert table["weak-1x2"]["samples_per_s"] == "170 (150-190)" and table["weak-1x2"]["efficiency"] == "85% (75-95%)"
    assert table["weak-1x1"]["samples_per_s"] == "100 (98.0-104)" and table["weak-1x1"]["efficiency"] == "100% (98-104%)"


def test_other_work_on_the_cores_before_a_run_is_measured_and_recommends_repeats(tmp_path, monkeypatch):
    """/proc/stat by hand: core 0 goes from 100 idle ticks to 130 user + 70 idle of 200 (+ 20 steal): (30 + 20) / 120 busy;
    core 1 stays idle and is not asked for."""
    from gpuscale.study import otherload

    stat = tmp_path / "stat"
    samples = iter(["cpu  1 2 3 4 5 6 7 8\ncpu0 0 0 0 100 0 0 0 0 0 0\ncpu1 0 0 0 100 0 0 0 0\n",
                    "cpu  1 2 3 4 5 6 7 8\ncpu0 30 0 0 170 0 0 0 20 0 0\ncpu1 0 0 0 300 0 0 0 0\n"])
    monkeypatch.setattr(otherload.time, "sleep", lambda s: stat.write_text(next(samples)))
    stat.write_text(next(samples))
    assert otherload.busy_share([0], 0.5, stat) == pytest.approx(50 / 120)
    assert otherload.busy_share([0], 0.5, tmp_path / "missing") is None
    rows = [{"name": "weak-1x1", "other_load": 0.02, "repeats": 1}, {"name": "weak-1x2", "other_load": 0.42, "repeats": 1}]
    line = otherload.warning(rows)
    assert line.startswith("Other work kept this machine's cores busy just before 1 of 2 runs (up to 42%")
    assert "weak-1x2 42%" in line and "--repeat 3" in line
    assert otherload.warning([{**r, "other_load": 0.05} for r in rows]) is None  # quiet cores
    assert otherload.warning([{**r, "repeats": 3} for r in rows]) is None  # the spread is shown already
    # a run's folder keeps what was measured before it, and the analysis adds the line to the study's notes
    _write_study(tmp_path / "study", [_summary(1, "weak", 100.0, 10.0), _summary(2, "weak", 180.0, 10.0)])
    (tmp_path / "study" / "weak-1x2" / otherload.OTHER_LOAD_FILE).write_text(json.dumps({"busy": 0.5}))
    results = analysis.analyse(tmp_path / "study")
    assert [r["other_load"] for r in results["rows"]] == [None, 0.5]
    assert any(n.startswith("Other work kept this machine's cores busy just before 1 of 1 runs") for n in results["notes"])


def test_what_took_the_cores_time_during_a_run_is_the_busy_time_less_the_runs_own_cpu_time():
    """/proc/stat by hand: over the run core 0 went 150 user + 30 idle + 20 steal ticks, core 1 100 user + 100 idle;
    the run's processes used 2 CPU seconds (200 ticks at 100 per second): others took (170 + 100 - 200) / 400."""
    from gpuscale.study import otherload

    before = {0: [0, 0, 0, 0, 0, 0, 0, 0], 1: [0, 0, 0, 0, 0, 0, 0, 0]}
    after = {0: [150, 0, 0, 30, 0, 0, 0, 20], 1: [100, 0, 0, 100, 0, 0, 0, 0]}
    measured = otherload.others_share(before, after, own_cpu_s=2.0, ticks_per_s=100)
    assert measured == {"others": pytest.approx(70 / 400), "steal": {0: pytest.approx(0.1), 1: 0.0}}
    assert otherload.others_share(before, after, own_cpu_s=5.0, ticks_per_s=100)["others"] == 0.0  # never below none
    assert otherload.others_share(before, before, own_cpu_s=0.0) is None  # no time passed


def test_during_a_run_its_own_childrens_cpu_time_is_not_counted_as_other_work(tmp_path):
    """A real child burns 0.3 s of CPU inside the block while the (fake) counters of core 0 go 1000 ticks busy of 2000:
    what others took is what the child's known CPU time leaves, written beside the sample taken before the run."""
    import subprocess
    import sys

    from gpuscale.study import otherload

    stat = tmp_path / "stat"
    stat.write_text("cpu  0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")
    (tmp_path / otherload.OTHER_LOAD_FILE).write_text(json.dumps({"busy": 0.02, "cores": [0], "seconds": 0.5}))
    with otherload.during(tmp_path, [0], stat):
        subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass"], check=True)
        stat.write_text("cpu  0 0 0 0 0 0 0 0\ncpu0 900 0 0 1000 0 0 0 100 0 0\n")
    kept = json.loads((tmp_path / otherload.OTHER_LOAD_FILE).read_text())
    assert kept["busy"] == 0.02  # the sample before the run is kept
    during = otherload.read_during(tmp_path)
    assert (1000 - 100 * 0.45) / 2000 < during["others"] < (1000 - 100 * 0.3) / 2000, during  # 0.3 s and start-up
    assert during["steal"] == {"0": 0.05} and during["seconds"] > 0
    # the line under the table names the runs, the core the hypervisor slowed, and what to do
    rows = [{"name": "clean-weak-1x2", "other_load_during": {"others": 0.05, "steal": {"0": 0.01}}},
            {"name": "data-weak-1x2", "other_load_during": {"others": 0.31, "steal": {"0": 0.30, "1": 0.01}}},
            {"name": "onerank-weak-1x2", "other_load_during": None}]
    line = otherload.during_warning(rows)
    assert line.startswith("Other work took time on the cores while a run ran: data-weak-1x2 31% (the hypervisor took 30% of core 0) "
                           "of its cores' time")
    assert "imbalance above all" in line and line.endswith("--repeat 3 would show how much the runs vary.")
    assert otherload.during_warning(rows[:1] + rows[2:]) is None
    assert "the table's ranges" in otherload.during_warning([{**row, "repeats": 3} for row in rows])
    both = otherload.during_warning([rows[1], {**rows[1], "name": "comm-weak-1x2"}])
    assert "while 2 runs ran: data-weak-1x2 31% (the hypervisor took 30% of core 0), comm-weak-1x2 31%" in both


def test_a_large_rest_names_the_sampled_steps_it_doubts():
    from gpuscale.study.explain import doubted_measurement

    row = {"loss_breakdown": {"data": 0.0, "exposed_comm": 0.05, "imbalance": 0.0, "compute": 0.02, "rest": 0.16},
           "noise": 0.03, "steps": 186, "sync_probe": {"probes": 11, "status": "measured"}}
    assert doubted_measurement(row).startswith("Its rest (16%) is beyond the noise: the study doubts exposed communication "
                                               "and imbalance, which rest on 11 of its 186 steps (the sync probe's replays)")
    probed = {**row, "measured_by": "probe", "sync_probe": {"probes": 10, "source": "ddp_timers"}}
    assert "10 of its 186 steps (DDP's timers)" in doubted_measurement(probed)
    assert doubted_measurement({**row, "noise": 0.2}) is None  # within the noise of --repeat
    assert doubted_measurement({**row, "loss_breakdown": {**row["loss_breakdown"], "rest": 0.04}}) is None


def test_a_negative_rest_beyond_the_noise_is_shown_so_that_the_parts_add_up_to_the_loss():
    """The demo's line that read "lost 3%: exposed communication 11%, per-device compute 9%, rest ~0%": the rest was
    -17%, the amount by which the sampled parts overshoot the loss; shown, the line adds up, and says what it doubts."""
    from gpuscale.study.explain import breakdown_cells, doubted_measurement, why_not_more

    shares = {"data": 0.0, "exposed_comm": 0.11, "imbalance": 0.0, "jitter": 0.0, "compute": 0.09, "rest": -0.17}
    row = {"name": "none-weak-1x2", "world_size": 2, "efficiency": 0.97, "ideal_samples_per_s": 1000.0, "loss_breakdown": shares,
           "noise": 0.03, "steps": 100, "sync_probe": {"probes": 11, "status": "measured"}}
    line = dict(why_not_more({"rows": [{**row, "name": "none-weak-1x1", "world_size": 1, "loss_breakdown": None}, row]}))[row["name"]]
    assert "lost 3%: " in line and "exposed communication 11%" in line and "per-device compute 9%" in line
    assert "rest (unexplained) -17%" in line  # 11 + 9 - 17 = 3
    assert "measured parts add up to 17% of ideal more than the run lost" in line
    assert breakdown_cells(row)[-2:] == ["-17%", "3%"]
    # within the noise, or a part other than the rest, still reads ~0%
    small = {**row, "loss_breakdown": {**shares, "rest": -0.02, "data": -0.05}}
    assert breakdown_cells(small)[0] == "~0% (±3%)" and breakdown_cells(small)[-2] == "~0% (±3%)"
    assert doubted_measurement(small) is None
    assert doubted_measurement({**row, "loss_breakdown": {**shares, "rest": -0.08}}) is None  # beyond the noise, under 10%


def test_strategies_that_gather_parameters_move_half_as_many_bytes_again():
    """FSDP and ZeRO-3 gather parameters besides reducing gradients (1.5x DDP's bytes); ZeRO-1/2 and DDP do not.
    The summary says which (gathers_parameters); older summaries without it are judged by the name, as before."""
    summary = _summary(1, "weak", 100.0, 10.0)
    ddp = predict.Baseline.from_summary({**summary, "strategy": "ddp", "gathers_parameters": False})
    zero3 = predict.Baseline.from_summary({**summary, "strategy": "deepspeed", "gathers_parameters": True})
    zero2 = predict.Baseline.from_summary({**summary, "strategy": "deepspeed", "gathers_parameters": False})
    assert zero3.traffic_bytes == pytest.approx(1.5 * ddp.traffic_bytes) and zero2.traffic_bytes == ddp.traffic_bytes
    older = {k: v for k, v in summary.items() if k != "gathers_parameters"}
    assert predict.Baseline.from_summary({**older, "strategy": "fsdp"}).sharded
    assert not predict.Baseline.from_summary({**older, "strategy": "deepspeed"}).sharded


def test_a_wrapped_model_says_whether_its_strategy_gathers_parameters():
    import gpuscale
    from gpuscale.base import wrapped
    with gpuscale.init():
        gpuscale.wrap(torch.nn.Linear(2, 2), strategy="fsdp")  # one process: unsharded, but FSDP would gather on more
        facts = wrapped.latest()
        assert facts.gathers_parameters and not facts.collective_forward
        gpuscale.wrap(torch.nn.Linear(2, 2), strategy="ddp")
        assert not wrapped.latest().gathers_parameters


def test_a_scaling_whose_baseline_failed_has_no_speedup_and_says_why(tmp_path):
    """weak-1x1 failed: weak-1x2 must not become the baseline (it would read 1.00x, 100%); strong scaling is unaffected."""
    from gpuscale.study.report import format_markdown, format_table

    _write_study(tmp_path, [_summary(1, "weak", 100.0, 10.0), _summary(2, "weak", 150.0, 10.0), _summary(4, "weak", 260.0, 10.0),
                            _summary(1, "strong", 100.0, 10.0), _summary(2, "strong", 170.0, 10.0)])
    (tmp_path / "weak-1x1" / "summary.json").unlink()  # the failed run left no summary
    results = analysis.analyse(tmp_path)
    weak = [r for r in results["rows"] if r["scaling"] == "weak"]
    assert [r["name"] for r in weak] == ["weak-1x2", "weak-1x4"]
    assert all(r["speedup"] is None and r["efficiency"] is None and r["loss_breakdown"] is None for r in weak)
    assert [r["samples_per_s"] for r in weak] == [150.0, 260.0]  # their own throughput is still shown
    assert results["baseline"] == {"strong": "strong-1x1"} and results["missing_baseline"] == {"weak": "weak-1x1"}
    strong = [r for r in results["rows"] if r["scaling"] == "strong"]
    assert strong[1]["speedup"] == pytest.approx(1.7)
    [note] = results["notes"]
    assert note.startswith("weak scaling has no speed-up or efficiency: its baseline weak-1x1 did not finish")
    table = format_table(results)
    line = next(text for text in table.splitlines() if text.startswith("weak-1x2"))
    assert "1.00x" not in line and "100%" not in line and "—" in line
    assert "weak scaling has no speed-up" in table and "weak scaling has no speed-up" in format_markdown(results, plots=[])


def _write_batch_study(tmp_path, trained, probe=None, passes=None):
    """A study of a script with a batch template and --global-batch 64, whose runs trained `trained` per rank per
    pass, in `passes(cell)` passes per optimizer step (1 by default)."""
    cells = [Cell("weak", 1, 1), Cell("weak", 1, 2), Cell("strong", 1, 1), Cell("strong", 1, 2)]
    runner.record_study(tmp_path, ["train.py", "--batch-size", "{per_device_batch}"], "local", cells, batch={"global_batch": 64})
    for cell, sps in zip(cells, (100.0, 190.0, 101.0, 180.0), strict=True):
        accum = passes(cell) if passes else 1
        summary = {**_summary(cell.world_size, cell.scaling, sps, 10.0), "per_device_batch": trained,
                   "grad_accum_steps": accum, "global_batch": trained * accum * cell.world_size, "measured_by": "probe",
                   "samples_from": "data loader", "probe": probe or {"synchronised": True}}
        (tmp_path / cell.name).mkdir()
        (tmp_path / cell.name / "summary.json").write_text(json.dumps(summary))


def test_a_script_that_ignores_the_batch_template_is_told_with_the_batch_it_trained(tmp_path):
    """Planned per device: weak 64 (64 on the baseline's one device), strong 64 then 32. The script trained 32 each."""
    _write_batch_study(tmp_path, trained=32)
    results = analysis.analyse(tmp_path)
    by_name = {r["name"]: r for r in results["rows"]}
    assert by_name["weak-1x2"]["planned_per_device_batch"] == 64 and by_name["strong-1x2"]["planned_per_device_batch"] == 32
    assert by_name["weak-1x2"]["per_device_batch"] == 32  # the table shows what was trained
    ignored, *same = results["notes"]
    assert ignored.startswith("The script ignored the batch the study planned") and "weak-1x1 (32, not 64)" in ignored
    assert "weak-1x2 (32, not 64)" in ignored and "strong-1x1 (32, not 64)" in ignored and "strong-1x2" not in ignored
    assert same == ["weak-1x1 and strong-1x1 ran the same experiment (the same batches on the same devices): their difference is noise",
                    "weak-1x2 and strong-1x2 ran the same experiment (the same batches on the same devices): their difference is noise"]
    # the answer does not judge a scaling its runs did not do: no speed-up, no recommendation
    # (weak scaling at the script's own batch, 32 on every device, is still weak scaling: the note names the batch)
    assert results["answer"][0].startswith("Weak scaling to 2 processes: 1.90x the samples/s (95% of ideal)")
    assert results["answer"][1].startswith("Strong scaling to 2 processes: not measured, the script ignored the batch the study "
                                           "planned in strong-1x1 (below), so these runs are no strong scaling; pass the batch "
                                           "template to the option the script reads and run the study again.")


def test_only_the_runs_that_trained_another_batch_are_named(tmp_path):
    _write_batch_study(tmp_path, trained=64)  # right for weak and strong-1x1; strong-1x2 planned 32
    ignored, shared, same = analysis.analyse(tmp_path)["notes"]
    assert ignored.endswith("in strong-1x2 (64, not 32). Pass the batch template to the option the script reads "
                            "(e.g. --batch-size {per_device_batch}).")
    assert shared.startswith("weak-1x1 and strong-1x1 ran the same experiment") and same.startswith("weak-1x2 and strong-1x2")


def test_a_script_that_splits_the_planned_batch_into_passes_of_its_own_trained_the_plan(tmp_path):
    """Accelerate's nlp_example way: above 16 samples a pass, the script accumulates (64 = 16 x 4 on one device; the
    strong 2-device cells' 32 = 16 x 2). Per optimizer step each rank trained what was planned: no note, and the
    table shows the passes ("16 x 4"), not a per-device batch of 16 beside a global one of 64."""
    from gpuscale.study.report import format_table

    _write_batch_study(tmp_path, trained=16, passes=lambda cell: 4 if cell.scaling == "weak" or cell.world_size == 1 else 2)
    results = analysis.analyse(tmp_path)
    assert not [n for n in results["notes"] if "ignored the batch" in n]
    table = format_table(results)
    assert next(line for line in table.splitlines() if line.startswith("strong-1x2")).split()[4:7] == ["64", "16", "x"]
    assert "per-device batch: samples on each device per pass" in table
    (tmp_path / "b").mkdir()
    _write_batch_study(tmp_path / "b", trained=16, passes=lambda cell: 2)
    ignored = next(n for n in analysis.analyse(tmp_path / "b")["notes"] if "ignored the batch" in n)
    assert "weak-1x1 (32 (16 x 2), not 64)" in ignored  # 2 passes of 16 where 64 were planned


@pytest.mark.parametrize("libraries, cause", [(["accelerate", "transformers"], "ACCELERATE_USE_CPU=1"),
                                               (["lightning"], "--devices {nproc_per_node} --num-nodes {nodes}"),
                                               ([], "never calls torch.distributed.init_process_group")])
def test_ranks_that_trained_independent_copies_show_no_speedup(tmp_path, libraries, cause):
    """The likely cause follows the libraries the ranks had loaded (the probe's record)."""
    _write_batch_study(tmp_path, trained=64, probe={"synchronised": False, "libraries": libraries})
    results = analysis.analyse(tmp_path)
    rows = {r["name"]: r for r in results["rows"]}
    assert rows["weak-1x2"]["speedup"] is None and rows["weak-1x2"]["efficiency"] is None and rows["strong-1x1"]["speedup"] == 1.0
    [why] = [n for n in results["notes"] if n.startswith("weak-1x2: its 2 ranks trained independent copies of the model")]
    assert cause in why


def test_the_probe_tells_synchronised_ranks_from_independent_copies():
    from gpuscale.measure.probe.merge import synchronised

    ddp = {"world": {"world_size": 2}, "ddp": {"parameters": 10}}
    alone = {"world": None, "ddp": None}
    assert synchronised([ddp, ddp]) is True
    assert synchronised([alone, alone]) is False  # no process group, no DDP: two copies
    assert synchronised([{"world": {"world_size": 2}, "ddp": None}] * 2) is None  # a group but no DDP: FSDP, own all-reduces
    assert synchronised([alone]) is None and synchronised([{"ddp": None}, {"ddp": None}]) is None  # one rank; old records
    # Accelerate 1.15 on CPUs, not told to distribute: a group of the launcher's world with no backend, no DDP model
    assert synchronised([{"world": {"world_size": 2, "backend": "undefined"}, "ddp": None}] * 2) is False


def test_a_part_within_the_noise_reads_about_zero_and_never_negative(tmp_path):
    """strong-1x2 by hand: compute -3.75% (the baseline's compute per sample was larger), imbalance 3.75%, exposed
    communication 15%. Single runs: noise 3%. With repeats spreading 20% the comparison's noise is 20%: the
    parts that differ from the baseline's (data, compute, rest) read ~0% (±20%); communication and imbalance, which the
    one-process baseline has none of, are measured within the run and keep the 3% floor, so the 15% still flags."""
    from gpuscale.study.explain import breakdown_cells, why_not_more

    base = _summary(1, "strong", 100.0, 10.0)
    base["step_breakdown_s"] = _split(0.32, data=0.032, compute=0.272, comm=0.0, imbalance=0.0)
    strong = _summary(2, "strong", 150.0, 10.0)  # t = 0.013333 s per sample; compute 0.0085 vs 0.0085 + 0.0005 ...
    strong["step_breakdown_s"] = _split(2 / 150 * 16, data=0.016, compute=0.128, comm=0.032, imbalance=0.008)
    _write_study(tmp_path, [base, strong])
    results = analysis.analyse(tmp_path)
    row = results["rows"][1]
    assert row["loss_breakdown"]["compute"] == pytest.approx((0.008 - 0.0085) / (2 / 150))  # -3.75%: really negative
    assert row["noise"] == analysis.NOISE_FLOOR
    cells = breakdown_cells(row)
    assert cells[4] == "~0% (±3%)" and cells[1] == "15%" and cells[2] == "4%"  # compute, communication, imbalance
    line = why_not_more(results)[0][1]
    parts, _, after = line.partition(" (the parts that read ~0% measured ")
    assert "per-device compute ~0% (±3%)" in parts and not re.search(r"-\d", parts)  # no negative share
    hidden = row["loss_breakdown"]["compute"] + row["loss_breakdown"]["data"]  # the parts read ~0%: the rest makes them up
    assert after.startswith(f"{100 * hidden:.0f}% together; counted at that, the parts add up to the 25% lost)")
    shown = [row["loss_breakdown"][p] for p in ("exposed_comm", "imbalance", "rest")]
    assert 100 * (sum(shown) + hidden) == pytest.approx(25)  # the arithmetic the clause states
    assert any("to exposed communication" in f for f in row["flags"])

    row["samples_per_s_runs"] = [130.0, 150.0, 160.0]  # --repeat 3 spreading 20% of the median
    analysis.analyse_rows(results["rows"])
    assert row["noise"] == pytest.approx(0.2)
    assert row["part_noise"] == {"data": pytest.approx(0.2), "exposed_comm": analysis.NOISE_FLOOR,
                                 "imbalance": analysis.NOISE_FLOOR, "jitter": analysis.NOISE_FLOOR,  # one device: none
                                 "compute": pytest.approx(0.2), "rest": pytest.approx(0.2)}
    cells = breakdown_cells(row)
    assert cells[0] == "~0% (±20%)" and cells[4] == "~0% (±20%)"  # data and compute: differences against the baseline
    assert cells[1] == "15%" and cells[2] == "4%"  # communication and imbalance: the baseline has none
    assert any("to exposed communication" in f for f in row["flags"])

    row.pop("part_noise")  # a results.json from before the parts had a noise each: one noise for all
    assert breakdown_cells(row)[1] == "~0% (±20%)"


def test_a_part_the_baseline_has_too_takes_the_comparisons_noise():
    """A study from 2 to 4 processes: its baseline communicates and waits too, so those parts are differences between
    two runs like data and compute, and every part takes the repeats' spread (here 20%)."""
    row = {"samples_per_s_runs": [130.0, 150.0, 160.0], "samples_per_s": 150.0, "per_device_batch": 16, "grad_accum_steps": 1}
    base = {"samples_per_s_runs": [100.0], "samples_per_s": 100.0, "per_device_batch": 16, "grad_accum_steps": 1,
            "step_breakdown_s": _split(0.32, data=0.032, compute=0.25, comm=0.03, imbalance=0.008)}
    assert analysis.part_noises(row, base) == {part: pytest.approx(0.2) for part in analysis.PARTS}
    base["step_breakdown_s"].update(exposed_comm=0.0, imbalance=0.0, jitter=0.0)  # one device: none of the three
    assert analysis.part_noises(row, base) == {"data": pytest.approx(0.2), "exposed_comm": 0.03, "imbalance": 0.03,
                                               "jitter": 0.03, "compute": pytest.approx(0.2), "rest": pytest.approx(0.2)}


def _write_repeats(tmp_path, summaries_per_cell):
    """A study whose cells ran several times: [[run 1, run 2, ...] per cell], each run's summary."""
    cells = [Cell(runs[0]["scaling"], 1, runs[0]["world_size"], repeat=i + 1) for runs in summaries_per_cell
             for i in range(len(runs))]
    runner.record_study(tmp_path, ["train.py"], "local", cells)
    for cell, summary in zip(cells, [s for runs in summaries_per_cell for s in runs], strict=True):
        (tmp_path / cell.name).mkdir()
        (tmp_path / cell.name / "summary.json").write_text(json.dumps(summary))


def test_a_part_that_ranges_over_the_repeats_takes_that_range_as_its_noise(tmp_path):
    """Three runs of 2 processes at the same throughput (their spread: 0) whose jitter differs: 0.016, 0.024 and 0.048
    s per step of 16 samples, over 2 / 150 s per sample = 7.5%, 11.25% and 22.5% of ideal. Jitter, measured within the
    run, ranged 15 points, and the rest (the loss less the parts) with it, the other way: both have a noise of 15%,
    not the 3% floor the throughput's spread alone gives. The median run (the second) is shown: jitter 11%, within
    its noise."""
    from gpuscale.study.explain import breakdown_cells

    base = _summary(1, "strong", 100.0, 10.0)
    base["step_breakdown_s"] = _split(0.32, data=0.032, compute=0.272, comm=0.0, imbalance=0.0) | {"jitter": 0.0}
    runs = []
    for jitter in (0.016, 0.024, 0.048):
        run = _summary(2, "strong", 150.0, 10.0)
        run["step_breakdown_s"] = _split(2 / 150 * 16, data=0.016, compute=0.136, comm=0.032, imbalance=0.0) | {"jitter": jitter}
        runs.append(run)
    _write_repeats(tmp_path, [[base], runs])
    row = analysis.analyse(tmp_path)["rows"][1]
    assert row["noise"] == analysis.NOISE_FLOOR  # the runs' throughput did not spread
    assert row["loss_breakdown"]["jitter"] == pytest.approx(0.1125)
    assert row["part_noise"]["jitter"] == pytest.approx(0.15) and row["part_noise"]["rest"] == pytest.approx(0.15)
    assert row["part_noise"]["exposed_comm"] == analysis.NOISE_FLOOR  # the same in every run: the floor
    assert row["part_noise"]["data"] == analysis.NOISE_FLOOR
    assert breakdown_cells(row)[3] == "~0% (±15%)"
    assert not any("to jitter" in f for f in row["flags"])  # within its noise: no flag

    # the baseline's two runs, alike in throughput and step, waited 0.032 and 0.064 s per step of 32 for data and
    # computed the rest of it: 0.001 s per sample apart, over the row's t, the row's data and compute move 7.5 points
    # with the run taken for baseline, the other way; the rest, the loss less both, does not move
    slow_loader = {**base, "step_breakdown_s": base["step_breakdown_s"] | {"data_wait": 0.064, "compute": 0.24}}
    (tmp_path / "b").mkdir()
    _write_repeats(tmp_path / "b", [[base, slow_loader], [runs[1]]])
    row = analysis.analyse(tmp_path / "b")["rows"][1]
    assert row["part_noise"]["data"] == pytest.approx(0.001 / (2 / 150))
    assert row["part_noise"]["compute"] == pytest.approx(0.001 / (2 / 150))
    assert row["part_noise"]["rest"] == analysis.NOISE_FLOOR
    assert row["part_noise"]["jitter"] == analysis.NOISE_FLOOR  # one run of 2 processes: nothing ranged


def test_a_repeat_that_measured_fewer_parts_does_not_widen_the_rests_noise(tmp_path):
    """Three runs alike in throughput and in every part they measured: one whose sync probe did not measure
    communication, one whose step was not split at all. Those put the missing parts in their rest; counted, the
    rest's noise would be 20 points for nothing. Only runs that measured what the median run measured count."""
    base = _summary(1, "strong", 100.0, 10.0)
    base["step_breakdown_s"] = _split(0.32, data=0.032, compute=0.272, comm=0.0, imbalance=0.0) | {"jitter": 0.0}
    runs = []
    for _ in range(3):
        run = _summary(2, "strong", 150.0, 10.0)
        run["step_breakdown_s"] = _split(2 / 150 * 16, data=0.016, compute=0.136, comm=0.032, imbalance=0.0) | {"jitter": 0.01}
        runs.append(run)
    runs[2]["step_breakdown_s"]["exposed_comm"] = None
    runs[0]["step_breakdown_s"] = None
    _write_repeats(tmp_path, [[base], runs])
    row = analysis.analyse(tmp_path)["rows"][1]
    assert row["loss_breakdown"]["exposed_comm"] == pytest.approx(0.15)  # the median run measured it
    assert row["part_noise"]["rest"] == analysis.NOISE_FLOOR


def test_one_flag_per_cause_lists_its_runs_and_the_advice_fits_the_scaling(tmp_path):
    """Three runs starving for data: one flag naming all three; per-device compute grew under both scalings: the
    weak row's advice does not blame a shrinking per-device batch."""
    from gpuscale.study.report_cells import flags

    runs = []
    for world, scaling in ((1, "weak"), (2, "weak"), (1, "strong"), (2, "strong")):
        summary = _summary(world, scaling, 100.0 * world * 0.8 if world > 1 else 100.0, 10.0, data_wait=4.0)
        per_device = 32 if scaling == "weak" or world == 1 else 16  # 0.32 s per step of 32 on the baselines
        compute = 0.256 if world == 1 else (0.36 if scaling == "weak" else 0.18)  # grew: 8 -> 11.25 ms per sample
        summary["step_breakdown_s"] = _split(world / summary["samples_per_s"] * per_device, data=0.032 * per_device / 32,
                                             compute=compute, comm=0.0, imbalance=0.0)
        runs.append(summary)
    _write_study(tmp_path, runs)
    results = analysis.analyse(tmp_path)
    grouped = flags(results)
    [(names, data)] = [(n, t) for n, t in grouped if t.startswith("waited for data")]
    assert names == "all runs" and data.count("waited for data") == 1
    compute = [(n, t) for n, t in grouped if "per-device compute" in t]
    assert [n for n, _ in compute] == ["weak-1x2", "strong-1x2"]
    assert "each device's batch per pass shrank" in compute[1][1]
    assert "shrank" not in compute[0][1] and "with the same batch per pass" in compute[0][1]
    assert all("see the prediction" not in t for _, t in grouped)
    # strong scaling from a baseline that accumulated 4 passes of 16 to 2 ranks of 2 passes of 16: no pass shrank
    from gpuscale.study.flags import row_flags

    strong = {**results["rows"][3], "per_device_batch": 16, "grad_accum_steps": 2}
    base = {**results["rows"][2], "per_device_batch": 16, "grad_accum_steps": 4}
    [advice] = [f["advice"] for f in row_flags(strong, base, "cpu") if f["cause"] == "compute"]
    assert "shrank" not in advice and "with the same batch per pass" in advice


def test_the_answer_says_what_the_table_shows_and_recommends_the_largest_run_on_target(tmp_path):
    weak = [_summary(1, "weak", 100.0, 10.0, acc=0.9), _summary(2, "weak", 180.0, 10.0, acc=0.9), _summary(4, "weak", 280.0, 10.0, acc=0.85)]
    strong = [_summary(1, "strong", 100.0, 10.0), _summary(2, "strong", 150.0, 10.0)]
    _write_study(tmp_path, weak + strong)
    assert analysis.analyse(tmp_path)["answer"] == [  # in the table's order: weak's runs come first there
        "Weak scaling to 4 processes: 2.80x the samples/s (70% of ideal) for 1.43x the device-hours per sample; ask for 2 processes "
        "(weak-1x2, 90% of ideal, 180 samples/s), the largest run at or above the 75% target; accuracy falls to 0.850, from 0.900.",
        "Strong scaling to 2 processes: 1.50x faster (75% of ideal) for 1.33x the device-hours per sample; ask for 2 processes, "
        "the largest run at or above the 75% target.",
    ]
    assert [r["scaling"] for r in analysis.analyse(tmp_path)["rows"]][:1] == ["weak"]
    strict = analysis.analyse(tmp_path, target_efficiency=0.95)["answer"]
    assert strict[1] == ("Strong scaling to 2 processes: 1.50x faster (75% of ideal) for 1.33x the device-hours per sample; no run "
                         "beyond 1 process keeps the 95% target.")


def test_the_answer_names_the_biggest_measured_loss_and_its_cure(tmp_path):
    base = _summary(1, "strong", 100.0, 10.0)
    base["step_breakdown_s"] = _split(0.32, data=0.032, compute=0.256, comm=0.0, imbalance=0.0)
    two = _summary(2, "strong", 150.0, 10.0)  # exposed communication 15% of ideal (test above, by hand)
    two["step_breakdown_s"] = _split(2 / 150 * 16, data=0.016, compute=0.136, comm=0.032, imbalance=0.008)
    _write_study(tmp_path, [base, two])
    [said] = analysis.analyse(tmp_path, target_efficiency=0.8)["answer"]
    assert said == ("Strong scaling to 2 processes: 1.50x faster (75% of ideal) for 1.33x the device-hours per sample; no run beyond "
                    "1 process keeps the 80% target; the biggest loss is exposed communication (15% of ideal): a larger per-device "
                    "batch or gradient accumulation would hide more of the synchronisation.")
    [met] = analysis.analyse(tmp_path)["answer"]  # 75% target met: no cure offered
    assert met.endswith("the largest run at or above the 75% target; the biggest loss is exposed communication (15% of ideal).")


def test_the_cost_of_scaling_in_device_hours_and_energy_per_sample_computed_by_hand(tmp_path):
    gpus = {"devices": [{"rank": r, "device": f"cuda:{r}", "source": "nvml", "util_mean": 90.0, "power_mean_w": 200.0} for r in range(2)]}
    _write_study(tmp_path, [_summary(1, "weak", 100.0, 10.0), _summary(2, "weak", 160.0, 10.0, util=gpus)])
    base, two = analysis.analyse(tmp_path)["rows"]
    assert base["device_hours_per_m_samples"] == pytest.approx(1e6 / 100 / 3600)  # 2.78 device-hours per million samples
    assert two["device_hours_per_m_samples"] == pytest.approx(2 * 1e6 / 160 / 3600)
    assert two["cost_ratio"] == pytest.approx(1.25) and two["cost_ratio"] == pytest.approx(1 / two["efficiency"])
    assert two["device_hours_per_epoch"] == pytest.approx(2 * (3.0 + 10.0) / 2 / 3600)  # 2 devices, 13 s for 2 epochs
    assert two["joules_per_sample"] == pytest.approx(400 / 160) and two["energy_source"] == "nvml"
    assert base["joules_per_sample"] is None  # no power sampled (a CPU run)


def test_a_cell_that_is_the_same_experiment_as_an_earlier_one_runs_once_and_stands_for_both(tmp_path):
    """--global-batch 64 with --batch-size {per_device_batch}: weak-1x1 and strong-1x1 both run `t.py --batch-size 64` on one
    device, so strong-1x1 takes weak-1x1's run; at 2 devices the batches differ (64 vs 32) and both run."""
    from gpuscale.study.spec import shared_runs

    command = StudyCommand(argv=("t.py", "--batch-size", "{per_device_batch}", "--out", "{out}"), appends_cell_options=False,
                           global_batch=64)
    cells = matrix.cells([1, 2], [1], ["weak", "strong"])
    shared = shared_runs(cells, command, lambda c: command.argv_for(c, str(tmp_path / c.name), 1), tmp_path)
    assert shared == {"strong-1x1": "weak-1x1"}
    # a gpuscale script gets --scaling appended: on one device weak and strong train the same batches, on two they differ
    gpuscale_script = StudyCommand(argv=("t.py", "--scaling-note", "weak"), appends_cell_options=True)
    assert gpuscale_script.argv_for(cells[0], str(tmp_path / "weak-1x1"), 1)[-4:-2] == ["--scaling", "weak"]
    assert shared_runs(cells, gpuscale_script, lambda c: gpuscale_script.argv_for(c, str(tmp_path / c.name), 1),
                       tmp_path) == {"strong-1x1": "weak-1x1"}

    ran = []

    class Runner:  # writes the summary a run would, and notes what ran
        def run(self, cell, cell_dir):
            ran.append(cell.name)
            (cell_dir / "summary.json").write_text(json.dumps(_summary(cell.world_size, cell.scaling, 100.0 * cell.world_size, 10.0)))

    runner.record_study(tmp_path, list(command.argv), "local", cells, command.as_record())
    outcomes = runner.run_cells(tmp_path, cells, Runner(), progress=lambda line: None, shared=shared)
    assert ran == ["weak-1x1", "weak-1x2", "strong-1x2"] and [o.status for o in outcomes] == ["done", "done", "shared", "done"]
    results = analysis.analyse(tmp_path)
    rows = {r["name"]: r for r in results["rows"]}
    assert rows["strong-1x1"]["same_as"] == "weak-1x1" and rows["strong-1x1"]["scaling"] == "strong"
    assert rows["strong-1x1"]["samples_per_s"] == rows["weak-1x1"]["samples_per_s"]
    assert ("weak-1x1 and strong-1x1 are one run (the same command on the same devices): it ran once, as weak-1x1, and stands "
            "for both") in results["notes"]
    again = runner.run_cells(tmp_path, cells, Runner(), progress=lambda line: None, shared=shared)  # a rerun runs nothing
    assert ran == ["weak-1x1", "weak-1x2", "strong-1x2"] and [o.status for o in again] == ["skipped", "skipped", "shared", "skipped"]


def test_a_cause_found_in_several_runs_is_said_once_with_each_runs_value():
    from gpuscale.study.flags import group_flags, row_flags, set_flags

    rows = []
    for name, wait in (("weak-1x1", 4.8), ("weak-1x2", 3.3)):
        row = {"name": name, "scaling": "weak", "time_split_s": {"data_wait": wait, "compute": 10.0 - wait}, "samples_per_s_runs": [1.0],
               "samples_per_s": 1.0}
        set_flags(row, row_flags(row, row, "cpu"))
        rows.append(row)
    [(runs, text)] = group_flags(rows)
    assert runs == "weak-1x1, weak-1x2"
    assert text.startswith("waited for data 48% in weak-1x1, 33% in weak-1x2 of its training time (data wait / training time, both "
                           "in the time split): on CPUs the loader shares the cores")
    assert group_flags([{"name": "old", "flags": ["a flag of an older results.json"]}]) == [("old", "a flag of an older results.json")]


def test_runs_that_trained_different_amounts_of_work_are_said_not_comparable_in_time(tmp_path):
    fixed_steps = [{**_summary(1, "weak", 100.0, 10.0), "samples": 1000}, {**_summary(2, "weak", 180.0, 10.0), "samples": 2000},
                   {**_summary(1, "strong", 100.0, 10.0), "samples": 1000}, {**_summary(2, "strong", 150.0, 10.0), "samples": 992}]
    _write_study(tmp_path, fixed_steps)
    notes = [n for n in analysis.analyse(tmp_path)["notes"] if "amounts of work" in n]
    assert notes == ["The runs of weak scaling trained different amounts of work (weak-1x1: 1000 samples, weak-1x2: 2000 samples): "
                     "compare their throughput, not their times to result (the script stops after a number of steps, not epochs?)"]
    # the same 2 epochs, 24 samples more on 2 ranks of 8: padded shares (Accelerate's even batches), not fixed steps
    padded = [{**_summary(1, "strong", 100.0, 10.0, batch=16), "samples": 200}, {**_summary(2, "strong", 150.0, 10.0, batch=16), "samples": 224}]
    _write_study(tmp_path / "padded", padded)
    [note] = [n for n in analysis.analyse(tmp_path / "padded")["notes"] if "numbers of samples" in n]
    assert note == ("The runs of strong scaling trained the same epochs but slightly different numbers of samples (strong-1x1: 200 "
                    "samples, strong-1x2: 224 samples): the loader pads every rank's share to the same length, repeating a few "
                    "samples (DistributedSampler, Accelerate's even batches), more of them on more devices; throughput counts them too")


def test_a_node_without_a_gpu_driver_has_no_gpus_and_torch_is_not_asked(monkeypatch):
    """No GPU on the PCI bus, no trace of a GPU driver and no GPU selected: 0 GPUs without importing torch (1-2 s a
    study); a driver's file, a selection variable or a PCI GPU, and torch counts (here made to count 3)."""
    import glob
    import sys

    from gpuscale.runtime import pinning
    from gpuscale.study import spec as study_spec

    for variable in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(pinning, "pci_gpus", lambda: [])
    asked: list[str] = []
    monkeypatch.setattr(glob, "glob", lambda pattern: asked.append(pattern) or [])
    with monkeypatch.context() as no_torch:
        no_torch.setitem(sys.modules, "torch", None)  # importing torch would now raise
        gpus, cores = study_spec._node_devices()
    assert gpus == 0 and cores and set(asked) == set(pinning.GPU_DRIVER_FILES)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(glob, "glob", lambda pattern: ["/proc/driver/nvidia/gpus/0000:3b:00.0"] if "proc" in pattern else [])
    assert study_spec._node_devices()[0] == 3
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert study_spec._node_devices()[0] == 3
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(pinning, "pci_gpus", lambda: ["0000:3b:00.0"])
    assert study_spec._node_devices()[0] == 3


def test_a_self_measured_summary_that_does_not_stand_for_its_cell_says_why(tmp_path):
    """The ranks' probe records say gpuscale.Meter ran: a summary missing from the cell, of another scaling or of
    another number of ranks is the script's doing (each cell would show it; a script that plans one scaling whatever
    it is told spares that scaling's cells); a script the probe measured is not judged."""
    cell = Cell("weak", 1, 2)
    records = tmp_path / "probe"
    records.mkdir()
    for rank in range(2):
        (records / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "meter": True}))
    missing_file = missing.self_measured_problem(tmp_path, cell)
    assert "wrote no" in missing_file.message and "--out" in missing_file.message
    assert missing_file.stops(Cell("strong", 1, 2)) and missing_file.stops(Cell("weak", 1, 1))
    (tmp_path / "summary.json").write_text(json.dumps(_summary(2, "strong", 200.0, 10.0)))
    planned_strong = missing.self_measured_problem(tmp_path, cell)
    assert planned_strong.message == (
        "the script's summary says strong scaling, and this cell is weak: the script must plan its batch from the --scaling "
        "the study passes (gpuscale.plan_batch(..., scaling=args.scaling))")
    assert planned_strong.stops(Cell("weak", 1, 1)) and not planned_strong.stops(Cell("strong", 1, 2))
    (tmp_path / "summary.json").write_text(json.dumps(_summary(1, "weak", 200.0, 10.0)))
    assert "counts 1 rank(s), and this cell has 2" in missing.self_measured_problem(tmp_path, cell).message
    (tmp_path / "summary.json").write_text(json.dumps(_summary(2, "weak", 200.0, 10.0)))
    assert missing.self_measured_problem(tmp_path, cell) is None
    for rank in range(2):
        (records / f"rank-{rank}.json").write_text(json.dumps({"rank": rank}))  # the probe measured it: not the script's summary
    (tmp_path / "summary.json").unlink()
    assert missing.self_measured_problem(tmp_path, cell) is None


def test_a_study_stopped_by_its_script_keeps_finished_cells_and_runs_the_scaling_it_spares(tmp_path):
    """A script that plans strong scaling whatever it is told: weak-1x1 fails and shows it; weak-1x2 is not run;
    strong-1x2, finished before, stays finished; strong-1x1 still runs. The truth: which cells the runner ran."""
    cells = matrix.cells([1, 2], [1], ["weak", "strong"])
    runner.record_study(tmp_path, ["t.py"], "local", cells)
    (tmp_path / "strong-1x2").mkdir()
    (tmp_path / "strong-1x2" / "summary.json").write_text(json.dumps(_summary(2, "strong", 150.0, 10.0)))
    ran = []

    class Runner:  # a self-measuring script that writes a strong-scaling summary in every cell
        def run(self, cell, cell_dir):
            ran.append(cell.name)
            (cell_dir / "probe").mkdir()
            (cell_dir / "probe" / "rank-0.json").write_text(json.dumps({"rank": 0, "meter": True}))
            (cell_dir / "summary.json").write_text(json.dumps(_summary(cell.world_size, "strong", 100.0 * cell.world_size, 10.0)))

    said = []
    outcomes = runner.run_cells(tmp_path, cells, Runner(), progress=said.append)
    assert ran == ["weak-1x1", "strong-1x1"]
    assert [(o.cell.name, o.status) for o in outcomes] == [("weak-1x1", "failed"), ("weak-1x2", "failed"),
                                                          ("strong-1x1", "done"), ("strong-1x2", "skipped")]
    assert outcomes[1].error.startswith("not run: weak-1x1 showed that the script's summary says strong scaling")
    assert "the study runs no more cells that would fail the same way (the strong scaling cells still run)" in said


def test_a_summary_left_unusable_is_named_not_taken_for_missing_records(tmp_path):
    """A run that left a summary.json with no throughput in it: the cell says so, not "no rank left a probe record"."""
    cells = [Cell("weak", 1, 1)]
    runner.record_study(tmp_path, ["t.py"], "local", cells)

    class Runner:
        def run(self, cell, cell_dir):
            (cell_dir / "summary.json").write_text(json.dumps({**_summary(1, "weak", 100.0, 10.0), "samples_per_s": 0}))

    [outcome] = runner.run_cells(tmp_path, cells, Runner(), progress=lambda line: None)
    assert outcome.status == "failed" and outcome.error == (
        f"the run left {tmp_path / 'weak-1x1' / 'summary.json'}, which is unusable: samples_per_s is 0, not a positive number")


def test_a_prediction_beyond_a_run_that_missed_it_carries_the_losses_the_model_left_out():
    """The model knows communication only. It predicted 88% for the 2-process run, which measured 68%: its 76% for 4
    processes, beside that run, would read as advice to ask for 4. The answer carries the left-out losses (0.68 / 0.88
    of each step's worth) to 4 and 8 processes: 76% x 0.68 / 0.88 = 58.7%, 60% x 0.68 / 0.88 = 46.4%, by hand."""
    from gpuscale.study.answer import answer

    base = {"name": "strong-1x1", "scaling": "strong", "world_size": 1, "samples_per_s": 100.0}
    top = {"name": "strong-1x2", "scaling": "strong", "world_size": 2, "samples_per_s": 136.0, "speedup": 1.36,
           "efficiency": 0.68, "noise": 0.05}
    cells = [{"name": "strong-1x1", "world_size": 1, "nodes": 1, "efficiency": 1.0, "run": True},
             {"name": "strong-1x2", "world_size": 2, "nodes": 1, "efficiency": 0.88, "run": True},
             {"name": "strong-1x4", "world_size": 4, "nodes": 1, "efficiency": 0.76, "run": False},
             {"name": "strong-1x8", "world_size": 8, "nodes": 1, "efficiency": 0.60, "run": False}]
    results = {"device": "cpu", "rows": [base, top], "baseline": {"strong": "strong-1x1"}, "prediction": {"cells": cells}}
    [said] = answer(results)
    assert said.endswith("Predicted, not run (the model: report.md's Prediction): 4 processes 3.0x (76% of ideal), 8 processes "
                         "4.8x (60% of ideal). It predicted 88% for 2 processes, which measured 68%; if the losses it leaves "
                         "out keep their share of each step: 4 processes 2.3x (59% of ideal), 8 processes 3.7x (46% of "
                         "ideal).")
    # the model met the run within its noise (0.05): the prediction stands as it is
    met = {**results, "rows": [base, {**top, "efficiency": 0.84, "speedup": 1.68, "samples_per_s": 168.0}]}
    assert answer(met)[0].endswith("8 processes 4.8x (60% of ideal).")
    # a run that beat the model: nothing left out to carry
    beat = {**results, "rows": [base, {**top, "efficiency": 0.95, "speedup": 1.9, "samples_per_s": 190.0}]}
    assert answer(beat)[0].endswith("8 processes 4.8x (60% of ideal).")


def test_a_cells_progress_line_says_where_its_time_to_result_ends_within_the_launchers_time():
    """The launcher took 7.5 s; the table's time to result (launch to the last rank's record) is 5.5 s: the line says
    both, and that the other 2.0 s were the exit. A time to result it cannot place says nothing."""
    from gpuscale.study.runner import _exit_words

    assert _exit_words(7.5, {"time_to_result_s": 5.5}) == ", its result at 5.5 s, then 2.0 s to exit"
    assert _exit_words(7.5, {"time_to_result_s": None}) == "" and _exit_words(7.5, {"time_to_result_s": 9.0}) == ""


def test_a_command_line_the_script_refuses_stops_the_study_but_a_value_it_refuses_does_not():
    """argparse's "unrecognized arguments" (or a required option missing) is the command's shape, the same in every
    cell: the other cells are not run. A value one cell's template gave (its own check, exit 2) may pass in others."""
    from gpuscale.study.missing import usage_problem

    log = "exit code 2; last lines of out/strong-1x1/output.log:\n    usage: train.py [-h]\n    train.py: error: {}\n"
    problem = usage_problem(log.format("unrecognized arguments: --no-such-flag"))
    assert problem is not None and problem.stops(Cell("weak", 1, 2))
    assert problem.message == ("the script refused the study's command line (train.py: error: unrecognized arguments: "
                               "--no-such-flag); every cell passes it the same options: fix the command after --")
    assert usage_problem(log.format("the following arguments are required: --data")) is not None
    # one variant's arguments refused: the other variants' cells still run
    swapped = Cell("strong", 1, 1, variant="swap", variant_args=("--swap-train-test",))
    only = usage_problem(log.format("unrecognized arguments: --swap-train-test"), swapped)
    assert only.stops(Cell("strong", 1, 2, variant="swap", variant_args=("--swap-train-test",)))
    assert not only.stops(Cell("strong", 1, 2, variant="clean")) and "every cell of variant swap" in only.message
    assert usage_problem(log.format("--batch-size 48 must be a power of two")) is None  # one cell's value
    assert usage_problem(log.format("unrecognized arguments: --x").replace("exit code 2", "exit code 1")) is None
    assert usage_problem(None) is None
