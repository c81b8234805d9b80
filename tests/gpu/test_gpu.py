"""On a machine with GPUs: one rank per GPU, NCCL, each rank on its own device. Skipped without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU; none is visible here"),
]
ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "multiproc" / "scripts" / "probe.py"


def test_one_rank_per_gpu_with_nccl(tmp_path):
    num_gpus = torch.cuda.device_count()
    result = subprocess.run(
        [sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", "gpu", str(PROBE), str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert len(ranks) == num_gpus
    placements = ranks[0]["placements"]
    assert [p["device"] for p in placements] == [f"cuda:{i}" for i in range(num_gpus)]
    if num_gpus > 1:
        assert {r["backend"] for r in ranks} == {"nccl"}
        mean = 4 * sum(r + 1 for r in range(num_gpus)) / num_gpus
        assert all(r["grad"] == pytest.approx([mean] * 8) for r in ranks)


ACCUMULATE = ROOT / "tests" / "multiproc" / "scripts" / "accumulate.py"


def _accumulate(out: Path, *args: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", "gpu", str(ACCUMULATE), str(out), *args],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_auto_precision_is_bf16_and_trains_close_to_fp32(tmp_path, strategy):
    """On a GPU with bf16, precision 'auto' picks it; the loss curve follows fp32 within bf16 rounding."""
    fp32 = _accumulate(tmp_path / "fp32", "--strategy", strategy, "--precision", "fp32", "--clip", "0.5")
    auto = _accumulate(tmp_path / "auto", "--strategy", strategy, "--precision", "auto", "--clip", "0.5")
    assert auto["precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    assert auto["losses"] == pytest.approx(fp32["losses"], rel=0.03)
    assert auto["eval_samples"] == 5


def test_fp16_with_loss_scaling_on_gpu(tmp_path):
    result = _accumulate(tmp_path, "--strategy", "ddp", "--precision", "fp16", "--clip", "0.5")
    assert result["precision"] == "fp16"
    assert result["losses"][-1] < result["losses"][0]


def test_gpu_defaults_fuse_the_optimizer_under_ddp_and_take_the_same_steps(tmp_path):
    """On a GPU gpuscale's defaults fuse SGD (ddp) and compile on request; the losses follow the plain fp32 run."""
    plain = _accumulate(tmp_path / "plain", "--strategy", "ddp", "--precision", "fp32", "--clip", "0.5", "--fused", "off")
    fused = _accumulate(tmp_path / "fused", "--strategy", "ddp", "--precision", "fp32", "--clip", "0.5", "--compile", "inductor")
    assert fused["fused"] and fused["compiled"] and not plain["fused"] and not plain["compiled"]
    assert fused["losses"] == pytest.approx(plain["losses"], rel=1e-4)


def test_doctor_reads_nccls_version_and_transport_from_its_own_log():
    """One rank per GPU (a one-rank NCCL group on a one-GPU machine): the network section is read from NCCL's own log,
    which went to a file, not to the terminal."""
    import os
    import socket

    num_gpus = torch.cuda.device_count()
    launch = ["run", "--nproc-per-node", "gpu", "-m", "gpuscale"] if num_gpus > 1 else []
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_DEBUG")}
    result = subprocess.run([sys.executable, "-m", "gpuscale", *launch, "doctor", "--json", "--max-size", "1M"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert result.returncode in (0, 1), result.stderr[-4000:]
    data = json.loads(result.stdout)
    library = "RCCL" if torch.version.hip else "NCCL"
    version = ".".join(map(str, torch.cuda.nccl.version()))
    nodes = data["network"]["nodes"]
    assert len(nodes) == 1 and nodes[0]["line"].startswith(f"{socket.gethostname()}: {library} {version} "), nodes
    rank0 = data["network"]["ranks"]["0"]
    assert rank0["error"] is None and rank0["init"]["library"] == library and rank0["init"]["version"] == version
    assert rank0["init"]["network"], rank0  # the network NCCL chose: IB, Socket, an OFI plugin's ...
    assert [f["level"] for f in data["findings"] if f["area"] == "network"] == ["info"]  # one node
    assert "NCCL INFO" not in result.stdout + result.stderr
