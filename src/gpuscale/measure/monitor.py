"""Watch the hardware: each rank samples its own device's utilisation, memory and power during a run.

`gpuscale.Meter` starts a `Monitor` when it is created and `Meter.write_summary` stops it, so a
training run measured by a Meter gets, next to ``summary.json``, a ``timeline.json`` and a
``"utilisation"`` entry in the summary (mean and peak per device). Each rank samples only its own
device, every ``interval_s`` (0.5 s) in a daemon thread, so this works the same on one node, on
many and under SLURM. What is sampled, and from where:

- NVIDIA GPU: NVML (the ``pynvml`` module of nvidia-ml-py). The torch device is matched to its
  NVML device by UUID, else PCI bus id, so CUDA_VISIBLE_DEVICES remapping cannot mix GPUs up.
  ``util_pct`` is NVML's GPU utilisation: the share of time at least one kernel was running, not
  how busy the SMs were. Memory is the device's used memory (all processes), power the board's
  draw. Without NVML: ``nvidia-smi --query-gpu=...`` once a second or slower.
- AMD GPU (a ROCm build of torch): the ``amdsmi`` module (GFX activity, VRAM used, socket power),
  else ``rocm-smi --json`` once a second or slower; the device is matched by PCI bus id.
  Both GPU kinds are read by `gpuscale.measure.gpu_samplers`; this module keeps the CPU reading and the thread.
- CPU: this process and its child processes (DataLoader workers; not their children): CPU time
  (user + system, all threads, from /proc) over wall time, in % of the cores the rank is bound to
  (``rt.cores``), so 100 means every one of its cores was busy. Memory is this process's resident
  set (/proc/self/statm); power is not known (None). A child that exits loses its last interval.

``util_pct`` is always a share in percent, clamped to [0, 100]: of the rank's cores (CPU time over
wall time times their number) or of the GPU's time (as its tool reports it). /proc counts CPU time
in clock ticks (1/100 s) and the sampling thread wakes a little late or early, so the raw ratio of
a fully busy rank reads a few percent over 100 (a 0.5 s interval is 50 ticks per core: one tick
more is 102%); those readings are 100, never more (`cpu_share_pct`, `share_pct`).

A sampler that fails (no driver, no command, a device it cannot find) never stops training: the
rank warns once and stops sampling; the series keeps what it had and its ``source``.

timeline.json (version 1), one series per rank, sorted by rank::

    {"version": 1, "interval_s": 0.5, "started": <unix time of the first sample>,
     "series": [{"rank": 0, "host": "h", "device": "cuda:0", "name": "NVIDIA H100 80GB HBM3",
                 "source": "nvml",            # "amdsmi", "rocm-smi", "nvidia-smi", "proc" or null
                 "t": [0.5, 1.0, ...],        # s since the rank's Meter started training (< 0 before)
                 "util_pct": [...], "mem_bytes": [...], "power_w": [... or null]}]}

The summary's entry, the same on every rank (None with the monitor off)::

    "utilisation": {"source": "nvml", "interval_s": 0.5, "devices": [{"rank": 0, "host": "h",
        "device": "cuda:0", "name": "...", "source": "nvml", "util_mean": 93.1, "util_max": 100.0,
        "mem_peak_bytes": 61203283968, "power_mean_w": 611.4}]}

Means and the utilisation maximum are over the samples taken while training (t >= 0), the memory
peak over the whole series; None where a value is unknown. A Meter that never trained counts t
from its creation. Wall-clock times: t is only as steady as the node's clock.

A series holds at most MAX_SAMPLES samples: when full, every second sample is dropped and the
interval doubles, so a long run keeps its whole span at a coarser step.

Turn it off with ``GPUSCALE_MONITOR=0`` in the environment or ``gpuscale.Meter(plan, monitor=False)``.
By hand: ``m = Monitor(rt).start(); ...; m.stop(); m.series(zero=t0)``.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from gpuscale.base.timeline import TIMELINE_VERSION, device_stats, make_timeline
from gpuscale.detect.log import get_logger
from gpuscale.detect.topology import format_cpulist

# re-exported: the GPU samplers were defined here, and callers and tests reach them through this module
from gpuscale.measure.gpu_samplers import (
    NVIDIA_SMI,
    ROCM_SMI,
    SMI_INTERVAL_S,
    AmdSmiSampler,
    CommandSampler,
    NvmlSampler,
    Sample,
    amd_sampler,
    as_number,
    gpu_sampler,
    nvidia_sampler,
    parse_nvidia_smi,
    parse_rocm_smi,
)

__all__ = ["Monitor", "open_sampler", "nvidia_sampler", "amd_sampler", "monitor_enabled", "device_stats", "make_timeline", "parse_nvidia_smi",
           "parse_rocm_smi", "ProcSampler", "share_pct", "cpu_share_pct", "NvmlSampler", "AmdSmiSampler", "CommandSampler",
           "TIMELINE_VERSION", "MAX_SAMPLES", "NVIDIA_SMI", "ROCM_SMI", "SMI_INTERVAL_S"]

MAX_SAMPLES = 10_000

log = get_logger("monitor")


def monitor_enabled() -> bool:
    """False when GPUSCALE_MONITOR=0; True when it is 1 or unset."""
    value = os.environ.get("GPUSCALE_MONITOR", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"GPUSCALE_MONITOR={value!r} is not 0 or 1; set GPUSCALE_MONITOR=0 to turn the monitor off")
    return value != "0"


def _proc_ticks(pid: str) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15), all threads


def share_pct(value: Any) -> float | None:
    """A utilisation reading in percent, clamped to [0, 100]; None where unknown (None, NaN, not a number)."""
    number = as_number(value)
    if number is None or math.isnan(number):
        return None
    return min(max(number, 0.0), 100.0)


def cpu_share_pct(cpu_s: float, wall_s: float, num_cores: int) -> float | None:
    """CPU seconds used over `wall_s` seconds, in % of `num_cores` cores, clamped to [0, 100]; None without wall time."""
    if not wall_s > 0:
        return None
    return share_pct(100.0 * cpu_s / wall_s / max(num_cores, 1))


class ProcSampler:
    """CPU time of this process and its children over wall time, in % of `cores` (0 to 100); RSS in bytes."""

    source, min_interval_s = "proc", 0.0

    def __init__(self, cores: tuple[int, ...]) -> None:
        self.num_cores = max(len(cores), 1)
        self._tick = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._last, self._wall = self._ticks(), time.monotonic()

    def _ticks(self) -> dict[str, int]:
        ticks = {"self": _proc_ticks("self")}
        for path in glob.glob("/proc/self/task/*/children"):  # absent without CONFIG_PROC_CHILDREN: self only
            try:
                with open(path) as f:
                    children = f.read().split()
            except OSError:  # the thread just ended
                continue
            for child in children:
                with contextlib.suppress(OSError, ValueError, IndexError):  # the child just exited
                    ticks[child] = _proc_ticks(child)
        return ticks

    def sample(self) -> Sample:
        ticks, now = self._ticks(), time.monotonic()
        used = sum(max(t - self._last.get(pid, 0), 0) for pid, t in ticks.items()) / self._tick
        wall, self._last, self._wall = now - self._wall, ticks, now
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * self._page
        return cpu_share_pct(used, wall, self.num_cores), rss, None

    def close(self) -> None:
        pass


class Placed(Protocol):
    """What the monitor needs to know of a rank: its device, cores, rank and host (a `gpuscale.Runtime` is
    one; the probe, which has no Runtime in a script that does not use gpuscale, passes a stand-in)."""

    @property
    def device(self) -> torch.device: ...
    @property
    def cores(self) -> Sequence[int]: ...
    @property
    def rank(self) -> int: ...
    @property
    def host(self) -> str: ...


def open_sampler(rt: Placed) -> Any:
    """The sampler of `rt.device`: NVML or nvidia-smi, amdsmi or rocm-smi (`gpuscale.measure.gpu_samplers`), or /proc for a CPU."""
    if rt.device.type != "cuda":
        return ProcSampler(tuple(rt.cores) or tuple(os.sched_getaffinity(0)))
    return gpu_sampler(torch.cuda.get_device_properties(rt.device))


class Monitor:
    """Samples `rt.device` every `interval_s` in a daemon thread between `start()` and `stop()`."""

    def __init__(self, rt: Placed, interval_s: float = 0.5) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s} must be a positive number of seconds")
        self.rt, self.interval_s = rt, float(interval_s)
        cuda = rt.device.type == "cuda"
        self.name = torch.cuda.get_device_name(rt.device) if cuda else f"cores {format_cpulist(rt.cores or sorted(os.sched_getaffinity(0)))}"
        self.source: str | None = None
        self.error: str | None = None
        self.times: list[float] = []  # unix time of each sample
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Monitor:
        """Start sampling (again, after `stop`, appending to the same series); returns self."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpuscale-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self, wait: bool = True) -> None:
        """Take a last sample and stop; ``wait=False`` only tells the thread to stop (for finalizers)."""
        self._stop.set()
        if wait and self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        try:
            sampler = open_sampler(self.rt)
        except Exception as exc:
            return self._fail(exc)
        self.source = sampler.source
        interval, last = max(self.interval_s, sampler.min_interval_s), time.time()
        try:
            while not self._stop.wait(interval):
                last = self._record(sampler.sample())
                if len(self.times) >= MAX_SAMPLES:  # keep the whole run at half the resolution
                    with self._lock:
                        self.times, self.samples = self.times[::2], self.samples[::2]
                    interval *= 2
            if time.time() - last >= interval / 2:  # a last sample, unless the previous one is that recent
                self._record(sampler.sample())
        except Exception as exc:
            self._fail(exc)
        finally:
            with contextlib.suppress(Exception):
                sampler.close()

    def _record(self, sample: Sample) -> float:
        now = time.time()
        sample = (share_pct(sample[0]), *sample[1:])  # a GPU tool's reading too: a share, 0 to 100
        with self._lock:
            self.times.append(now)
            self.samples.append(sample)
        return now

    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            log.warning("the utilisation monitor of %s stopped sampling (source %s): %s: %s; training goes on "
                        "(GPUSCALE_MONITOR=0 turns the monitor off)", self.rt.device, self.source, type(exc).__name__, exc)
        self.error = f"{type(exc).__name__}: {exc}"

    @property
    def started(self) -> float | None:
        """Unix time of the first sample, None before it."""
        return self.times[0] if self.times else None

    def series(self, zero: float | None = None) -> dict[str, Any]:
        """This rank's series in the timeline format, `t` in seconds since `zero` (default: the first sample)."""
        with self._lock:
            times, samples = list(self.times), list(self.samples)
        zero = zero if zero is not None else (times[0] if times else 0.0)
        columns = list(zip(*samples, strict=True)) or [(), (), ()]
        return {"rank": self.rt.rank, "host": self.rt.host, "device": str(self.rt.device), "name": self.name,
                "source": self.source, "t": [round(t - zero, 3) for t in times],
                "util_pct": list(columns[0]), "mem_bytes": list(columns[1]), "power_w": list(columns[2])}
