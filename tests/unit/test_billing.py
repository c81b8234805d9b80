"""Billing units from a profile's rule, checked against the worked examples on LUMI's billing policy page
(https://docs.lumi-supercomputer.eu/runjobs/lumi_env/billing/, as quoted in docs/billing.md)."""

from __future__ import annotations

import json

import pytest

from gpuscale.slurm import billing
from gpuscale.slurm.cluster import ClusterOptions, cluster_job
from gpuscale.slurm.profiles import load_profile, profile_from_dict
from gpuscale.slurm.validate import validate_job
from gpuscale.study import analysis, matrix, runner


@pytest.fixture(scope="module")
def lumi():
    return load_profile("lumi-g")


def _hours(profile, alloc, hours):
    return billing.units_per_hour(profile, alloc) * hours


def test_lumis_worked_examples(lumi):
    # "allocating 4 nodes in the standard-g partition and your job runs for 24 hours: 4 * 4 * 24 = 384 GPU-hours"
    assert _hours(lumi, billing.default_allocation(lumi, 4, 8), 24) == 384
    # "a job allocating 2 GCDs and running for 24 hours consumes: 2 GCD's * 24 hours * 0.5 = 24 GPU-hours"
    two = billing.Allocation(partition="small-g", nodes=1, gpus_per_node=2, cores_per_node=14, mem_gb_per_node=120,
                             whole_nodes=False)
    assert _hours(lumi, two, 24) == 24
    # "1 GCD for 24 hours but 128 GB of memory: (128 GB / 64 GB) * 24 hours * 0.5 = 24 GPU-hours"
    memory = billing.Allocation(partition="small-g", nodes=1, gpus_per_node=1, cores_per_node=7, mem_gb_per_node=128,
                                whole_nodes=False)
    assert _hours(lumi, memory, 24) == 24
    # more than 8 cores per GCD are billed by the slice of 8: 1 GCD and 20 cores is ceil(20 / 8) = 3 slices
    cores = billing.Allocation(partition="small-g", nodes=1, gpus_per_node=1, cores_per_node=20, mem_gb_per_node=60,
                               whole_nodes=False)
    assert billing.units_per_hour(lumi, cores) == 1.5
    # dev-g, LUMI's debugging partition, is billed as small-g: the same 2 GCDs for the 3 hours it allows = 3 GPU-hours
    debug = billing.Allocation(partition="dev-g", nodes=1, gpus_per_node=2, cores_per_node=14, mem_gb_per_node=120,
                               whole_nodes=False)
    assert _hours(lumi, debug, 3) == 3
    # a standard-g node is 4 GPU-hours an hour whatever the job uses of it
    assert billing.units_per_hour(lumi, billing.Allocation(partition="standard-g", nodes=1, gpus_per_node=1,
                                                           cores_per_node=7, mem_gb_per_node=60, whole_nodes=True)) == 4


def test_what_gpuscales_own_batch_scripts_ask_for_is_billed(lumi, tmp_path):
    """The JobPlan of a rendered job: 1 GCD (7 cores, 60G) on small-g is half a GPU-hour an hour; all 8 GCDs of a node
    go to standard-g (4 an hour); a job that owns a small-g node (--exclusive) holds all its slices."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    options = ClusterOptions(profile="lumi-g", account="project_465000", container="/appl/x/lumi-pytorch-rocm.sif")
    cases = [(1, 1, False, 0.5), (1, 2, False, 1.0), (1, 8, False, 4.0), (2, 8, False, 8.0), (1, 2, True, 4.0)]
    for nodes, gpus, exclusive, rate in cases:
        opts = ClusterOptions(**{**options.__dict__, "exclusive": exclusive})
        profile, job = cluster_job(opts, [str(script)], nodes=nodes, gpus_per_node=gpus, output=str(tmp_path / "log"))
        alloc = billing.allocation_of_plan(profile, validate_job(profile, job), nodes)
        assert billing.units_per_hour(profile, alloc) == rate, (nodes, gpus, exclusive)


def test_a_billing_rule_is_checked_in_one_line():
    base = {"description": "x", "gpu_vendor": "nvidia", "gpus_per_node": 4, "cpus_per_node": 32,
            "full_node_partition": "gpu", "partial_node_partition": "gpu"}
    part = {"whole_node": False, "max_time": "1:00:00"}
    with pytest.raises(ValueError, match=r"\[partitions.gpu\]: give one of node_hour"):
        profile_from_dict("p", {**base, "billing_unit": "GPU-hours", "partitions": {"gpu": {**part, "billing": {}}}})
    with pytest.raises(ValueError, match=r"slice_hour=-1 must be a positive number"):
        profile_from_dict("p", {**base, "billing_unit": "GPU-hours", "partitions": {"gpu": {**part, "billing": {"slice_hour": -1}}}})
    with pytest.raises(ValueError, match=r"\[partitions.gpu\] billing: unknown key 'per_gpu'; valid keys are: node_hour"):
        profile_from_dict("p", {**base, "billing_unit": "GPU-hours", "partitions": {"gpu": {**part, "billing": {"per_gpu": 1}}}})
    with pytest.raises(ValueError, match=r"has a billing rule but the profile names no billing_unit"):
        profile_from_dict("p", {**base, "partitions": {"gpu": {**part, "billing": {"node_hour": 4}}}})
    plain = profile_from_dict("p", {**base, "partitions": {"gpu": part}})
    assert billing.units_per_hour(plain, billing.default_allocation(plain, 1, 2)) is None  # no rule: no bill


def test_a_slurm_study_keeps_each_jobs_rate_and_the_table_prices_a_million_samples(lumi, tmp_path, monkeypatch):
    """SlurmRunner writes what one hour of the cell's job costs; the analysis prices the run's samples with it:
    weak-1x2 at 200 samples/s on 2 GCDs of small-g: 1.0 GPU-hour an hour x 1e6 / 200 / 3600 = 1.389 GPU-hours per 1M."""
    from gpuscale.study.report_cells import basis
    from gpuscale.study.report_cells import cells as table_cells

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    options = ClusterOptions(profile="lumi-g", account="project_465000", container="/appl/x/lumi-pytorch-rocm.sif")
    monkeypatch.setattr(runner.jobs, "submit", lambda text, chdir=None: "42")
    monkeypatch.setattr(runner.jobs, "wait", lambda *a, **k: type("Info", (), {"succeeded": True})())
    slurm = runner.SlurmRunner(lambda cell, output: cluster_job(options, [str(script)], nodes=cell.nodes,
                                                                gpus_per_node=cell.nproc_per_node, output=output))
    cells = matrix.cells([1, 2], [1], ["weak"])
    runner.record_study(tmp_path, [str(script)], "slurm", cells)
    for cell, sps in zip(cells, (110.0, 200.0), strict=True):
        (tmp_path / cell.name).mkdir()
        assert slurm.run(cell, tmp_path / cell.name) is None
        (tmp_path / cell.name / "summary.json").write_text(json.dumps({
            "world_size": cell.world_size, "scaling": "weak", "samples_per_s": sps, "train_time_s": 10.0, "epochs": 1,
            "global_batch": 32 * cell.world_size, "per_device_batch": 32, "time_to_result_s": 36.0}))
    assert json.loads((tmp_path / "weak-1x2" / runner.BILLING_FILE).read_text())["per_hour"] == 1.0
    results = analysis.analyse(tmp_path)
    two = results["rows"][1]
    assert two["billed_per_m_samples"] == pytest.approx(1e6 / 200 / 3600)
    assert two["billed_per_epoch"] == pytest.approx(36.0 / 3600)  # SLURM bills the elapsed time, start-up included
    cols, lines = table_cells(results)
    assert [c.header for c in cols if c.key == "billed_per_m_samples"] == ["GPU-hours/1M samples"]
    assert lines[1][[c.key for c in cols].index("billed_per_m_samples")] == "1.39"
    said = basis(results)
    assert "GPU-hours/1M samples: what the cluster bills for a million samples" in said
    assert "small-g: 0.5 GPU-hours per hour for each slice of 1 GPU, 8 cores or 64 GB of memory" in said
    assert "https://docs.lumi-supercomputer.eu/runjobs/lumi_env/billing/" in said


def test_predict_prices_each_shape_in_the_profiles_billing_units(tmp_path, capsys):
    """8 GCDs of one node at the predicted throughput T: standard-g bills 4 GPU-hours an hour, 4 x 1e6 / T / 3600 per
    million samples; 1 GCD on small-g bills 0.5 an hour."""
    from gpuscale.cli import main

    summary = {"world_size": 1, "step_time_s": 0.05, "gradient_bytes": 500_000_000, "per_device_batch": 32,
               "global_batch": 32, "grad_accum_steps": 1, "device": "cuda", "device_name": "AMD Instinct MI250X"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert main(["predict", str(tmp_path), "--profile", "lumi-g", "--nproc", "1,8", "--scaling", "weak"]) == 0
    out = capsys.readouterr().out
    header, _, *lines = [line for line in out.splitlines() if line.startswith(("run ", "weak-", "---"))]
    assert header.split()[-1] == "GPU-hours/1M" or header.endswith("GPU-hours/1M samples")
    rows = {line.split()[0]: line.split() for line in lines}
    for name, rate in (("weak-1x1", 0.5), ("weak-1x8", 4.0)):
        throughput = float(rows[name][-3])
        assert float(rows[name][-1]) == pytest.approx(rate * 1e6 / throughput / 3600, rel=6e-3), name
    assert "standard-g: 4 GPU-hours per node-hour" in out and "lumi_env/billing" in out


def test_the_answer_gives_the_bill_beside_the_device_hours():
    from gpuscale.study.answer import answer

    bill = {"unit": "GPU-hours", "per_hour": 1.0}
    base = {"name": "weak-1x1", "scaling": "weak", "variant": "", "world_size": 1, "samples_per_s": 110.0, "speedup": 1.0,
            "efficiency": 1.0, "cost_ratio": 1.0, "billed_per_m_samples": 1.26, "billing": bill}
    two = {**base, "name": "weak-1x2", "world_size": 2, "samples_per_s": 200.0, "speedup": 200 / 110,
           "efficiency": 100 / 110, "cost_ratio": 1.1, "billed_per_m_samples": 1.39}
    said = answer({"rows": [base, two], "baseline": {"weak": "weak-1x1"}, "device": "cuda"})[0]
    assert "for 1.10x the device-hours per sample (1.39 GPU-hours per million samples against 1.26)" in said
