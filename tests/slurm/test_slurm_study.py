"""`gpuscale study --launcher slurm`: every cell a real SLURM job, across one and two nodes."""

from __future__ import annotations

import json
import re

import pytest

from slurm_helpers import ROOT

pytestmark = pytest.mark.slurm

MLP = str(ROOT / "tests" / "multiproc" / "scripts" / "mlp_scaling.py")


def test_study_runs_each_cell_as_a_job_on_its_nodes(cluster, tmp_path):
    out = tmp_path / "study"
    result = cluster.gpuscale("study", "--launcher", "slurm", "--profile", "local", "--mode", "srun", "--time", "10",
                              "--nproc", "1", "--nodes", "1,2", "--scaling", "weak,strong",
                              "--set", "intra_node_gbps=1", "--set", "intra_node_latency_us=100",
                              "--set", "inter_node_gbps=0.5", "--set", "inter_node_latency_us=200",
                              "--out", str(out), "--", MLP, "--steps", "5", "--hidden", "128", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # one node, one process: weak and strong train the same batches, so strong-1x1 takes weak-1x1's job
    assert (out / "strong-1x1" / "same-as").read_text().strip() == "weak-1x1"
    assert len(set(re.findall(r"job (\d+) COMPLETED", result.stdout))) == 3
    for name, nodes in [("weak-1x1", 1), ("weak-2x1", 2), ("strong-2x1", 2)]:
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["world_size"] == nodes and summary["num_nodes"] == nodes
        assert summary["launcher"] == "slurm"
        assert len(set(summary["hosts"])) == nodes  # n1 and n2 really took part
        assert (out / name / "output.log").stat().st_size > 0  # the job wrote its output into the cell
    assert "job " in result.stdout and "COMPLETED" in result.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["launcher"] == "slurm"
    assert results["prediction"]["link"]["source"] == "profile local"
    two = next(c for c in results["prediction"]["cells"] if c["name"] == "weak-2x1")
    assert two["comm_s"] > 0  # priced at the inter-node figures given with --set
    assert (out / "report.html").is_file()
