"""bench/step_profile.py: a trace's GPU busy share, device-idle gaps (with the host work in them), device syncs per step
and the bound, against traces whose answers are worked out by hand; and a real profile of a CPU loop."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.step_profile import StepProfiler, load_trace, summarise  # noqa: E402

MS = 1000.0  # trace times are microseconds


def event(name: str, cat: str, start_ms: float, end_ms: float, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": start_ms * MS, "dur": (end_ms - start_ms) * MS, "pid": 1, "tid": tid}


def two_steps() -> list[dict]:
    """Two host steps of 10 ms. Device work: 0-3 and 2-5 (overlapping streams), 12-18. Host: the optimizer 5.5-9.5,
    a .item() 8.5-11.5 with its stream synchronisation 9-11 inside, the loader 18-20; the GPU's copy of the step
    annotations must not count as steps."""
    return [
        event("ProfilerStep#0", "user_annotation", 0, 10), event("ProfilerStep#1", "user_annotation", 10, 20),
        event("ProfilerStep#0", "gpu_user_annotation", 0, 12), event("ProfilerStep#1", "gpu_user_annotation", 12, 21),
        event("gemm", "kernel", 0, 3, tid=7), event("softmax", "kernel", 2, 5, tid=8), event("gemm", "kernel", 12, 18, tid=7),
        event("Optimizer.step#AdamW.step", "cpu_op", 5.5, 9.5),
        event("aten::_local_scalar_dense", "cpu_op", 8.5, 11.5), event("cudaStreamSynchronize", "cuda_runtime", 9, 11),
        event("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "user_annotation", 18, 20),
    ]


def test_busy_share_gaps_and_syncs_worked_out_by_hand():
    s = summarise(two_steps())
    assert s["steps"] == 2 and s["step_ms"] == pytest.approx(10.0)
    assert s["gpu_busy"] == pytest.approx(11 / 20)  # the union: 0-5 and 12-18
    assert [(g["at_ms"], g["ms"]) for g in s["gaps"]] == [(5.0, 7.0), (18.0, 2.0)]
    first = s["gaps"][0]
    assert [h["name"] for h in first["host"]] == ["Optimizer.step#AdamW.step", "aten::_local_scalar_dense", "cudaStreamSynchronize"]
    assert first["host"][0]["ms"] == pytest.approx(4.0) and first["host"][1]["ms"] == pytest.approx(3.0)
    assert first["untraced_ms"] == pytest.approx(1.0)  # 5-5.5 and 11.5-12: no traced operator
    assert s["syncs_per_step"] == 0.5 and s["syncs_made_by"] == {"aten::_local_scalar_dense": 1}
    assert s["sync_ms_per_step"] == pytest.approx(1.0)
    assert s["data_share_of_idle"] == pytest.approx(2 / 9)
    assert s["kernels_per_step"] == 1.5
    assert s["bound"].startswith("bound by the host: the GPU idled 4.5 ms of each 10.0 ms step (busy 55%); 0.5 device syncs")
    assert s["bound"].endswith("the longest gap ran Optimizer.step#AdamW.step")
    assert [k["name"] for k in s["top_kernels"]] == ["gemm", "softmax"] and s["top_kernels"][0]["ms_per_step"] == pytest.approx(4.5)


def test_attention_kernels_are_summed_by_kind_per_step():
    """Two 10 ms steps: flash 1 + 1 ms, an explicit softmax 3 ms, the loss's log-softmax 2 ms (not attention), and a
    softmax outside the profiled steps."""
    trace = [event("ProfilerStep#0", "user_annotation", 0, 10), event("ProfilerStep#1", "user_annotation", 10, 20),
             event("void pytorch_flash::flash_fwd_kernel<...>", "kernel", 0, 1),
             event("void pytorch_flash::flash_bwd_dq_dk_dv_loop_kernel<...>", "kernel", 11, 12),
             event("triton_red_fused__softmax__to_copy_add_prepare_softmax_online_3", "kernel", 2, 5),
             event("triton_per_fused__log_softmax_nll_loss_forward_0", "kernel", 5, 7),
             event("triton_red_fused__softmax_9", "kernel", 25, 30)]
    assert summarise(trace)["attention_ms_per_step"] == {"flash": pytest.approx(1.0), "math": pytest.approx(1.5)}
    assert summarise(trace[:2])["attention_ms_per_step"] == {}


def test_device_and_data_bounds():
    device = [event("ProfilerStep#0", "user_annotation", 0, 10), event("k", "kernel", 0.5, 10)]
    assert summarise(device)["bound"].startswith("bound by the device: the GPU was busy 95% of each 10.0 ms step; no device sync")
    data = [event("ProfilerStep#0", "user_annotation", 0, 10), event("k", "kernel", 0, 2),
            event("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 2, 9)]
    assert summarise(data)["bound"].startswith("bound by the data: the GPU idled 8.0 ms of each 10.0 ms step, 88% of it")
    with pytest.raises(ValueError, match="ProfilerStep"):
        summarise([event("k", "kernel", 0, 1)])


def test_a_real_profile_of_a_cpu_loop(tmp_path):
    """StepProfiler over steps 4-6 of a loop that sleeps 20 ms a step outside any operator: three steps, each at least
    20 ms, the sleep seen as untraced host time, the optimizer among the host's work; the file written."""
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.AdamW(model.parameters())
    profiler = StepProfiler(3, 3, tmp_path / "p.json")
    for _ in range(8):
        model(torch.randn(16, 32)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.02)
        profiler.after_step()
    s = json.loads((tmp_path / "p.json").read_text())
    assert s == profiler.summary and s["steps"] == 3 and s["profiled_steps"] == [4, 6]
    assert all(ms >= 20 for ms in s["step_ms_each"])
    assert s["host_untraced_ms_per_step"] >= 19
    assert "Optimizer.step#AdamW.step" in [h["name"] for h in s["top_host_ops"]]
    assert s["kernels_per_step"] == 0 and s["bound"].startswith("no device activity traced (a CPU run)")


class LaggingDevice:
    """A device that needs `step_s` for each step's work and starts it when the last step's work is done: the host
    issues a step in no time and runs ahead, as it does with CUDA graphs; `sync` waits until the work issued is done."""

    def __init__(self, step_s: float) -> None:
        self.step_s, self.done_at = step_s, time.perf_counter()

    def issue(self) -> None:
        self.done_at = max(self.done_at, time.perf_counter()) + self.step_s

    def sync(self) -> None:
        time.sleep(max(0.0, self.done_at - time.perf_counter()))


def test_the_step_time_between_synchronisations_is_the_devices_where_the_host_runs_ahead(tmp_path):
    """40 steps, steps 26-28 profiled: the host issues each step in ~1 ms to a device that needs 8 ms. The host's clock
    says ~1 ms a step; the windows between synchronisations (steps 11-24 and 29-40, 26 steps) say the device's 8 ms."""
    device = LaggingDevice(0.008)
    profiler = StepProfiler(25, 3, tmp_path / "p.json", sync=device.sync)
    for step in range(1, 41):
        device.issue()
        time.sleep(0.001)
        profiler.after_step(last=step == 40)
    profiler.close()
    s = json.loads((tmp_path / "p.json").read_text())
    assert s["synced_steps"] == (24 - 10) + (40 - 28)
    assert 0.008 <= s["synced_step_s"] < 0.012, s["synced_step_s"]
    assert s["median_step_s"] < 0.005, s["median_step_s"]  # the host's own pace: it never waited for the device


def test_the_synchronised_windows_hold_the_hosts_time_where_the_device_keeps_up(tmp_path):
    """The same loop with a device faster than the host (1 ms against the host's 6 ms): both clocks say ~6 ms."""
    device = LaggingDevice(0.001)
    profiler = StepProfiler(25, 3, tmp_path / "p.json", sync=device.sync)
    for _ in range(40):
        device.issue()
        time.sleep(0.006)
        profiler.after_step()
    profiler.close()  # no step was called the last: close ends the window
    s = json.loads((tmp_path / "p.json").read_text())
    assert s["synced_steps"] == 26 and 0.006 <= s["synced_step_s"] < 0.012, s
    assert s["median_step_s"] == pytest.approx(s["synced_step_s"], rel=0.3)


def test_load_trace_reads_what_torch_exports(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name"}, *two_steps()]}))
    assert len(load_trace(path)) == len(two_steps())
