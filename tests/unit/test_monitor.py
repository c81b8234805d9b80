"""The utilisation monitor: real /proc readings, real (fake) nvidia-smi and rocm-smi executables, the thread."""

from __future__ import annotations

import gc
import json
import logging
import os
import resource
import subprocess
import sys
import time
from itertools import pairwise
from types import SimpleNamespace

import pytest
import torch

import gpuscale
from gpuscale.measure import monitor
from gpuscale.measure.monitor import Monitor, ProcSampler

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "GROUP_RANK", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM",
                 "GPUSCALE_BIND", "GPUSCALE_TIMEOUT", "GPUSCALE_OMP_FROM_LAUNCHER", "GPUSCALE_LAUNCH_TIME", "GPUSCALE_MONITOR")
UUID0, UUID1 = "GPU-5d1c8a7e-0b2f-4c3d-9e8f-111111111111", "GPU-7a2b3c4d-5e6f-4a8b-9c0d-222222222222"




@pytest.fixture
def warnings_seen():
    """The monitor's warnings (gpuscale's logger does not propagate to pytest's caplog)."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("gpuscale.monitor")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


def fake_tool(tmp_path, monkeypatch, name: str, script: str) -> None:
    """An executable `name` on PATH running the shell `script`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def cpu_runtime(cores=None) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device("cpu"), cores=tuple(cores or sorted(os.sched_getaffinity(0))), rank=0, host="here")


def busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_cpu_sampler_sees_a_busy_core_and_an_idle_one():
    """A busy loop bound to one core reads as this process's own CPU share (about 100% on an idle
    machine, less where other processes share the core), and sleeping as nearly 0."""
    affinity = os.sched_getaffinity(0)
    core = min(affinity)
    os.sched_setaffinity(0, {core})
    try:
        sampler, of_two = ProcSampler((core,)), ProcSampler((core, core + 1))  # % of one core, of two
        wall, cpu = time.monotonic(), time.process_time()
        busy(1.0)
        util, rss, power = sampler.sample()
        own = 100 * (time.process_time() - cpu) / (time.monotonic() - wall)  # clock_gettime, not /proc
        assert util == pytest.approx(own, abs=15) and util > 25, f"busy loop: {util:.0f}%, the process's own clock: {own:.0f}%"
        assert of_two.sample()[0] == pytest.approx(util / 2, abs=8), "one busy core of two is half the rank's cores"
        assert rss > 10 * 2**20 and power is None  # this Python with torch loaded holds more than 10 MiB
        time.sleep(1.0)
        idle, _, _ = sampler.sample()
        assert idle < 20, f"sleeping read as {idle:.0f}%"
    finally:
        os.sched_setaffinity(0, affinity)


def test_cpu_sampler_counts_child_processes():
    """DataLoader workers are children: their CPU time is the rank's too."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler = ProcSampler((0,))
    wall = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 1.0\n"
                              "while time.monotonic() < end: pass\ntime.sleep(60)"])
    try:
        time.sleep(1.5)  # this process sleeps; only the child works, then idles
        util, _, _ = sampler.sample()
        wall = time.monotonic() - wall
    finally:
        child.kill()
        child.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert child_s > 0.25, f"the child was not busy ({child_s:.2f} s of CPU)"
    assert util * wall / 100 == pytest.approx(child_s, abs=0.2), f"{util:.0f}% of {wall:.1f} s, the child used {child_s:.2f} s"


def test_cpu_utilisation_is_a_share_of_the_rank_s_cores_never_over_100(monkeypatch):
    """/proc counts in clock ticks and the sampling thread wakes late or early, so the raw ratio of a
    busy rank can exceed its cores (the report once showed "busy (max) 102%"): it reads 100."""
    clock = {"now": 1000.0}
    monkeypatch.setattr(monitor, "time", SimpleNamespace(monotonic=lambda: clock["now"], time=time.time))
    sampler = ProcSampler((0, 1))  # two cores: 100% is 2 CPU seconds per wall second
    sampler._tick = 100  # ticks per second, as on Linux
    sampler._last, sampler._wall = {"self": 1000, "4242": 500}, 1000.0
    readings = iter([{"self": 1000 + 52, "4242": 500 + 51}, {"self": 1052 + 40, "4242": 551 + 35}])
    monkeypatch.setattr(sampler, "_ticks", lambda: next(readings))
    clock["now"] = 1000.5  # 103 ticks in 0.5 s on 2 cores: 103% raw
    assert sampler.sample()[0] == 100.0
    clock["now"] = 1001.0  # 75 ticks in 0.5 s on 2 cores
    assert sampler.sample()[0] == pytest.approx(75.0)
    assert monitor.cpu_share_pct(1.03, 0.5, 2) == 100.0 and monitor.cpu_share_pct(1.0, 0.0, 2) is None
    # a GPU tool's reading is a share of the GPU's time, 0 to 100, too
    m = Monitor(cpu_runtime([0]))
    for raw in (105.0, -3.0, float("nan"), "N/A"):
        m._record((raw, 1, None))
    assert [s[0] for s in m.samples] == [100.0, 0.0, None, None]


def test_nvidia_smi_fallback_parses_its_csv(tmp_path, monkeypatch):
    """With no NVML library (this machine), the sampler runs nvidia-smi and finds its GPU by UUID."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here: the nvidia-smi fallback is not taken")
    except Exception:
        pass
    fake_tool(tmp_path, monkeypatch, "nvidia-smi", f"""echo "$@" > {tmp_path}/args
cat <<'EOF'
{UUID0}, 87, 40960, 312.45
{UUID1}, 3, 1024, [N/A]
EOF
""")
    sampler = monitor.nvidia_sampler(UUID1[4:], None)  # torch's UUIDs lack the "GPU-" prefix
    assert sampler.source == "nvidia-smi" and sampler.min_interval_s >= 1.0
    assert sampler.sample() == (3.0, 1024 * 2**20, None)
    assert "--query-gpu=uuid,utilization.gpu,memory.used,power.draw" in (tmp_path / "args").read_text()
    assert monitor.nvidia_sampler(UUID0, None).sample() == (87.0, 40960 * 2**20, 312.45)
    with pytest.raises(RuntimeError, match="no GPU with UUID"):
        monitor.nvidia_sampler("00000000-0000-0000-0000-000000000000", None)


def test_rocm_smi_fallback_parses_its_json(tmp_path, monkeypatch):
    """Without amdsmi (this machine), rocm-smi's JSON is read; the GPU is found by PCI bus, whatever its card number."""
    cards = {
        "card0": {"GPU use (%)": "12", "VRAM Total Memory (B)": "68702699520", "VRAM Total Used Memory (B)": "11010048",
                  "Average Graphics Package Power (W)": "N/A (Secondary die)", "PCI Bus": "0000:C1:00.0"},
        "card1": {"GPU use (%)": "97", "VRAM Total Memory (B)": "68702699520", "VRAM Total Used Memory (B)": "52613349376",
                  "Current Socket Graphics Package Power (W)": "412.0", "PCI Bus": "0000:D1:00.0"},
        "system": {"Driver version": "6.8.5"},
    }
    fake_tool(tmp_path, monkeypatch, "rocm-smi", f"""echo "WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status"
cat <<'EOF'
{json.dumps(cards)}
EOF
""")
    sampler = monitor.amd_sampler((0, 0xD1, 0))
    assert sampler.source == "rocm-smi"
    assert sampler.sample() == (97.0, 52613349376, 412.0)
    assert monitor.amd_sampler((0, 0xC1, 0)).sample() == (12.0, 11010048, None)
    with pytest.raises(RuntimeError, match="no GPU with PCI bus id"):
        monitor.amd_sampler((0, 0x41, 0))


def test_a_failing_sampler_warns_once_and_training_goes_on(tmp_path, monkeypatch, warnings_seen):
    """nvidia-smi answers twice (opening, one sample), then fails as when the driver goes away."""
    fake_tool(tmp_path, monkeypatch, "nvidia-smi", f"""echo x >> {tmp_path}/calls
if [ "$(wc -l < {tmp_path}/calls)" -gt 2 ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2; exit 9
fi
echo "{UUID0}, 50, 100, 200.0"
""")
    monkeypatch.setattr(monitor, "open_sampler", lambda rt: monitor.CommandSampler("nvidia-smi", monitor.NVIDIA_SMI,
                                                                                  monitor.parse_nvidia_smi, UUID0))
    monkeypatch.setattr(monitor.CommandSampler, "min_interval_s", 0.05)
    m = Monitor(cpu_runtime(), interval_s=0.05)
    for _ in range(2):  # started again after it failed: still one warning
        m.start()
        time.sleep(0.5)
        m.stop()
    assert len(warnings_seen) == 1, warnings_seen
    assert "nvidia-smi exited with 9" in warnings_seen[0] and "couldn't communicate" in warnings_seen[0]
    series = m.series()
    assert series["source"] == "nvidia-smi" and series["util_pct"] == [50.0] and series["power_w"] == [200.0]
    assert series["mem_bytes"] == [100 * 2**20]


def test_a_sampler_that_cannot_open_warns_and_records_nothing(tmp_path, monkeypatch, warnings_seen):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    monkeypatch.setattr(monitor, "open_sampler", lambda rt: monitor.nvidia_sampler("abc", None))
    m = Monitor(cpu_runtime(), interval_s=0.05).start()
    time.sleep(0.3)
    m.stop()
    assert len(warnings_seen) == 1 and "nvidia-smi" in warnings_seen[0]
    assert m.series()["source"] is None and m.series()["t"] == [] and m.started is None


def test_monitor_series_have_increasing_times_and_the_timeline_format():
    m = Monitor(cpu_runtime([0]), interval_s=0.05).start()
    time.sleep(0.6)
    m.stop()
    assert not m._thread.is_alive()
    zero = m.started - 1.0
    series = m.series(zero)
    t = series["t"]
    assert len(t) >= 5 and all(b > a for a, b in pairwise(t)) and t[0] == pytest.approx(1.0, abs=0.01)
    assert len(series["util_pct"]) == len(series["mem_bytes"]) == len(series["power_w"]) == len(t)
    assert {k: series[k] for k in ("rank", "host", "device", "name", "source")} == {
        "rank": 0, "host": "here", "device": "cpu", "name": "cores 0", "source": "proc"}
    assert all(p is None for p in series["power_w"]) and all(b > 0 for b in series["mem_bytes"])
    timeline = monitor.make_timeline([series], 0.05, m.started)
    assert timeline["version"] == 1 and timeline["interval_s"] == 0.05 and timeline["started"] == m.started
    json.dumps(timeline, allow_nan=False)


def test_a_long_run_keeps_its_whole_span_at_half_the_resolution(monkeypatch):
    monkeypatch.setattr(monitor, "MAX_SAMPLES", 8)
    m = Monitor(cpu_runtime([0]), interval_s=0.02).start()
    time.sleep(1.0)
    m.stop()
    t = m.series()["t"]
    assert len(t) <= 8 and all(b > a for a, b in pairwise(t))
    assert t[-1] > 0.7, "the last part of the run is kept"
    assert t[-1] - t[-2] > 0.05, "later samples are further apart"


def test_device_stats_use_the_training_part_for_means():
    series = {"rank": 1, "host": "h", "device": "cuda:1", "name": "GPU", "source": "nvml", "t": [-1.0, 0.0, 1.0, 2.0],
              "util_pct": [100.0, 20.0, None, 60.0], "mem_bytes": [9, 5, 7, None], "power_w": [500.0, 100.0, 300.0, None]}
    stats = monitor.device_stats(series)
    assert stats == {"rank": 1, "host": "h", "device": "cuda:1", "name": "GPU", "source": "nvml", "util_mean": 40.0,
                     "util_max": 60.0, "mem_peak_bytes": 9, "power_mean_w": 200.0}


def test_meter_writes_the_timeline_and_the_utilisation(single_process, tmp_path):
    with gpuscale.init():
        meter = gpuscale.Meter(gpuscale.plan_batch(2, 1))
        assert meter.monitor is not None and meter.monitor._thread.is_alive()
        time.sleep(0.6)  # before training: samples with t < 0
        for _ in meter.iter([torch.zeros(2)] * 4):
            busy(0.3)
        interim = meter.summary()
        assert meter.monitor._thread.is_alive(), "summary() alone keeps sampling"
        assert interim["utilisation"]["devices"][0]["rank"] == 0
        summary = meter.write_summary(tmp_path, final_loss=1.0)
        assert not meter.monitor._thread.is_alive()
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    assert timeline["version"] == 1 and timeline["interval_s"] == 0.5 and len(timeline["series"]) == 1
    series = timeline["series"][0]
    assert series["rank"] == 0 and series["device"] == "cpu" and series["source"] == "proc"
    assert series["t"][0] < 0 < series["t"][-1]
    assert oct(os.stat(tmp_path / "timeline.json").st_mode & 0o777) == "0o644"
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["utilisation"] == summary["utilisation"]
    utilisation = summary["utilisation"]
    assert utilisation["source"] == "proc" and utilisation["interval_s"] == 0.5
    (device,) = utilisation["devices"]
    assert set(device) >= {"rank", "host", "device", "name", "util_mean", "util_max", "mem_peak_bytes", "power_mean_w"}
    assert device["util_mean"] > 0 and device["util_max"] >= device["util_mean"] and device["mem_peak_bytes"] > 0
    assert device["power_mean_w"] is None


def test_monitor_off(single_process, tmp_path, monkeypatch):
    (tmp_path / "timeline.json").write_text("{}")  # an earlier run's: it would pass for this one's
    monkeypatch.setenv("GPUSCALE_MONITOR", "0")
    with gpuscale.init():
        meter = gpuscale.Meter(gpuscale.plan_batch(2, 1))
        assert meter.monitor is None
        assert meter.write_summary(tmp_path)["utilisation"] is None
        monkeypatch.setenv("GPUSCALE_MONITOR", "1")
        assert gpuscale.Meter(gpuscale.plan_batch(2, 1), monitor=False).monitor is None
        monkeypatch.setenv("GPUSCALE_MONITOR", "off")
        with pytest.raises(ValueError, match="set GPUSCALE_MONITOR=0"):
            gpuscale.Meter(gpuscale.plan_batch(2, 1))
    assert (tmp_path / "summary.json").is_file() and not (tmp_path / "timeline.json").exists()


def test_a_forgotten_meter_stops_its_thread(single_process):
    with gpuscale.init():
        meter = gpuscale.Meter(gpuscale.plan_batch(2, 1))
        thread = meter.monitor._thread
        del meter
        gc.collect()
        thread.join(timeout=5)
        assert not thread.is_alive()


def test_a_process_that_never_writes_its_summary_exits_promptly(tmp_path):
    code = "import gpuscale, time\nwith gpuscale.init():\n    m = gpuscale.Meter(gpuscale.plan_batch(2, 1))\n    time.sleep(0.3)\nprint('done')\n"
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert time.monotonic() - start < 30
