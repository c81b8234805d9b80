"""bench/sdpa.py: the attention kernels named by kind, the dispatcher asked for each of GPT-neo's three SDPA calls,
and a real layer's kernels profiled eager and compiled (on this CPU: torch's fused CPU kernel is flash)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import sdpa  # noqa: E402
from bench.step_profile import attention_kind  # noqa: E402

pytest.importorskip("transformers")


@pytest.mark.parametrize("name, kind", [
    # seen on an H200 (BENCHMARKS.md, "Issue 27"): transformers' eager attention with its packing mask, by Inductor
    ("triton_red_fused__softmax__to_copy_add_arange_bitwise_and_eq_exp_expand_index_le_lift_fresh_new_ones_prepare_s", "math"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>>", "flash"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "efficient"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1", "cudnn"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "flash"),
    ("aten::_softmax", "math"),
    ("triton_per_fused__log_softmax__log_softmax_backward_data_nll_loss_backward_nll_loss_forward_0", None),  # the loss
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
     "namespace)::LogSoftMaxForwardEpilogue>", None),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", None),
    ("aten::copy_", None),
])
def test_kernels_are_sorted_by_their_names(name, kind):
    assert attention_kind(name) == kind


def test_the_profile_tells_a_fused_kernel_from_an_explicit_softmax():
    q = torch.randn(1, 2, 64, 16)

    def fused():
        F.scaled_dot_product_attention(q, q, q, is_causal=True)

    def explicit():
        torch.softmax(q @ q.transpose(-1, -2), dim=-1) @ q

    assert set(sdpa.profiled_kinds(fused, torch.device("cpu"))) == {"flash"}
    assert set(sdpa.profiled_kinds(explicit, torch.device("cpu"))) == {"math"}


def test_a_point_names_the_dispatchers_choices_and_each_layers_kernels():
    record = sdpa.run(points=((1, 512),))
    (point,) = record["points"]
    assert "error" not in point, point
    assert set(point["choice"]) == {"global causal", "local first chunk (causal)", "local band chunks (mask)"}
    assert all(c["choice"] == "FLASH_ATTENTION" for c in point["choice"].values()), point["choice"]  # torch's CPU kernel
    for c in point["choice"].values():  # a CPU has flash and nothing else fused: the others say why not
        assert c["backends"]["FLASH_ATTENTION"] == "runs"
        assert "No viable backend" in c["backends"]["EFFICIENT_ATTENTION"], c["backends"]
    for kind in ("global", "local"):
        ran = point["layers"][kind]
        assert ran["eager"].get("flash", 0) > 0 and "math" not in ran["eager"], ran  # the example's SDPA, not eager's softmax
        assert "math" not in ran["compiled"], ran
    model = point["model"]  # the whole model as the Trainer trains it reaches SDPA in every layer, waiting for nothing
    assert (model["sdpa_calls"], model["expected_sdpa_calls"], model["explicit_softmax"]) == (3, 3, 0), model
    assert model["device_waits"] == [] and model["graphs"] == 1, model
    text = sdpa.report(record)
    assert "1 x 512" in text and "global causal FLASH_ATTENTION" in text and "switches: flash on" in text
    assert "compiled: SDPA 3 of 3 calls, explicit softmax 0, 1 graph(s); device waits uncompiled: none" in text
    assert "global causal, not run: EFFICIENT_ATTENTION: " in text


def test_the_model_path_names_a_model_that_left_the_fast_path(monkeypatch):
    """Layers sent back to transformers' eager attention (as the packing search sent them on the H200) show up as
    missing SDPA calls and explicit softmaxes, and the search's read of a device value as a device wait."""
    sdpa.examples_on_path()
    import gptneo_attention as ga

    monkeypatch.setattr(ga, "mark_unpadded", lambda *args: None)  # the model hook that keeps transformers from searching
    model = sdpa.model_path(1, 512, torch.device("cpu"))
    assert model["sdpa_calls"] == 0 and model["explicit_softmax"] == 2, model
    assert [w for w in model["device_waits"] if "masking_utils" in w], model


def test_the_switches_say_what_the_dispatcher_obeys():
    torch.backends.cuda.enable_flash_sdp(False)
    torch.use_deterministic_algorithms(True)
    try:
        switches = sdpa.sdpa_switches()
    finally:
        torch.backends.cuda.enable_flash_sdp(True)
        torch.use_deterministic_algorithms(False)
    assert switches["flash"] is False and switches["deterministic_algorithms"] is True
    assert switches["efficient"] is True and switches["math"] is True
    assert sdpa.sdpa_switches()["flash"] is True


def test_hf_sdpa_measures_both_variants_and_the_switched_one_runs_causal_without_a_mask():
    """`python -m bench hf_sdpa` on this CPU (2 layers, aot_eager): transformers' own SDPA compiled has a mask in each
    of its 2 SDPA calls; after use_causal_sdpa none, both causal; each ran torch's fused CPU kernel; two rounds each."""
    from bench import hf_sdpa

    record = hf_sdpa.run(repeat=2, points=((1, 64), (2, 64)))
    assert [(p["per_device_batch"], p["block_size"]) for p in record["points"]] == [(1, 64), (2, 64)]
    for point in record["points"]:
        assert "error" not in point, point
        plain, switched = point["transformers"], point["use_causal_sdpa"]
        assert plain["graph"] == {"sdpa_calls": 2, "with_mask": 2, "causal_without_mask": 0}, plain
        assert switched["graph"] == {"sdpa_calls": 2, "with_mask": 0, "causal_without_mask": 2}, switched
        for variant in (plain, switched):  # torch's fused CPU kernel ran in both (it takes a mask too), two rounds timed
            assert variant["kernels"].get("flash", 0) > 0 and len(variant["step_ms"]) == 2 and min(variant["step_ms"]) > 0, variant
    assert "1 x 64" in hf_sdpa.report(record) and "2 x 64" in hf_sdpa.report(record)
