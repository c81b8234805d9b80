"""Scripts that know nothing of gpuscale, studied as SLURM jobs: the probe rides along in every rank of the job."""

from __future__ import annotations

import json
import re

import pytest

from slurm_helpers import ROOT

pytestmark = pytest.mark.slurm

CLIENTS = ROOT / "tests" / "clients"
CLIENT_LINE = re.compile(r"^CLIENT rank=(\d+) world_size=(\d+) steps=(\d+) samples=(\d+) train_s=(\d+\.\d+)$", re.M)
# Lightning reads the ranks of an srun step itself (its SLURM environment): one task per device;
# the others run under torchrun, one per node
CASES = {
    "ddp_plain": ("torchrun", []),
    "accelerate_script": ("torchrun", []),
    "lightning_script": ("srun", ["--devices", "{nproc_per_node}", "--num-nodes", "{nodes}"]),
    "hf_trainer_script": ("torchrun", ["--out", "{out}/hf"]),
}


@pytest.mark.parametrize("client", list(CASES))
def test_a_foreign_script_studied_as_slurm_jobs_across_nodes(cluster, tmp_path, client):
    mode, extra = CASES[client]
    out = tmp_path / "study"
    result = cluster.gpuscale("study", "--launcher", "slurm", "--profile", "local", "--mode", mode, "--time", "10",
                              "--nproc", "1", "--nodes", "2", "--scaling", "weak", "--per-device-batch", "16", "--no-predict",
                              "--out", str(out), "--", str(CLIENTS / f"{client}.py"), "--batch-size", "{per_device_batch}",
                              "--epochs", "1", "--samples", "512", *extra, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "weak-2x1" / "summary.json").read_text())
    said = {int(m[0]): (int(m[1]), int(m[2]), int(m[3]), float(m[4]))
            for m in CLIENT_LINE.findall((out / "weak-2x1" / "output.log").read_text())}
    assert sorted(said) == [0, 1] and all(world == 2 for world, _, _, _ in said.values())
    assert summary["measured_by"] == "probe" and summary["complete"], summary.get("probe")
    assert summary["world_size"] == 2 and summary["num_nodes"] == 2 and len(summary["hosts"]) == 2  # n1 and n2
    assert summary["steps"] == said[0][1] and summary["samples"] == sum(s for _, _, s, _ in said.values())
    assert summary["samples_per_s"] > 0 and summary["per_device_batch"] == 16
    # against the script's own clock (its library's hooks: first training batch .. last optimizer step, less
    # validation): samples over the slowest rank's time, and each rank's time (10%, or 50 ms in a short window)
    own = sum(s for _, _, s, _ in said.values()) / max(t for _, _, _, t in said.values())
    assert summary["samples_per_s"] == pytest.approx(own, rel=0.10), (summary["samples_per_s"], own)
    for account in summary["probe"]["ranks"]:
        assert account["train_s"] == pytest.approx(said[account["rank"]][3], rel=0.10, abs=0.05), (account, said)
    assert json.loads((out / "results.json").read_text())["rows"][0]["name"] == "weak-2x1"
