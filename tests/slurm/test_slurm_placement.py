"""Scripts that know nothing of gpuscale, placed all the same in gpuscale's batch scripts: in srun mode (one task
per GPU) and torchrun mode (one torchrun per node), each rank trains on cores of its own with as many threads.

What each rank saw is read from its probe record: its affinity and torch.get_num_threads() at its first batch or
step, as the rank itself reported them (the study jobs carry the probe)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuscale.detect.topology import parse_cpulist

from slurm_helpers import ROOT

pytestmark = pytest.mark.slurm

CLIENTS = ROOT / "tests" / "clients"
EXTRA = {"ddp_plain": [], "accelerate_script": [],
         "lightning_script": ["--devices", "{nproc_per_node}", "--num-nodes", "{nodes}"]}


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
@pytest.mark.parametrize("client", list(EXTRA))
def test_every_rank_of_an_unchanged_script_has_cores_of_its_own(cluster, tmp_path, client, mode):
    out = tmp_path / "study"
    result = cluster.gpuscale("study", "--launcher", "slurm", "--profile", "local", "--mode", mode, "--time", "5",
                              "--nproc", "2", "--nodes", "1", "--scaling", "weak", "--per-device-batch", "16",
                              "--no-predict", "--out", str(out), "--", str(CLIENTS / f"{client}.py"),
                              "--batch-size", "{per_device_batch}", "--epochs", "1", "--samples", "128",
                              *EXTRA[client], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(path.read_text()) for path in sorted(Path(out, "weak-1x2", "probe").glob("rank-*.json"))]
    assert [r["rank"] for r in records] == [0, 1]
    assert len({r["host"] for r in records}) == 1  # both on one node: they could have shared its cores
    cores = {r["rank"]: set(parse_cpulist(r["placement"]["cores"])) for r in records}
    assert not cores[0] & cores[1], cores
    for record in records:
        assert record["placement"]["threads"] == len(cores[record["rank"]]), record["placement"]
        assert record["launcher"] == ("slurm" if mode == "srun" else "torchrun")
