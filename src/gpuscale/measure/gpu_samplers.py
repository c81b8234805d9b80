"""Read one GPU's utilisation, memory and power, for `gpuscale.measure.monitor`: NVML or nvidia-smi on NVIDIA,
amdsmi or rocm-smi on AMD.

A sampler has a ``source`` (its tool's name), a ``min_interval_s``, ``sample()`` returning a
`Sample` (util %, memory bytes, power W; each None where unknown) and ``close()``. The GPU is
found by UUID, else PCI bus id, so CUDA_VISIBLE_DEVICES remapping cannot mix GPUs up. A library
that cannot open falls back to its command line tool, which starts a process per sample and so
runs at most once every `SMI_INTERVAL_S`; when both fail, the RuntimeError names both reasons.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import torch

__all__ = ["gpu_sampler", "nvidia_sampler", "amd_sampler", "NvmlSampler", "AmdSmiSampler", "CommandSampler",
           "parse_nvidia_smi", "parse_rocm_smi", "as_number", "Sample", "SMI_INTERVAL_S", "NVIDIA_SMI", "ROCM_SMI"]

SMI_INTERVAL_S = 1.0  # the *-smi commands start a process per sample: not more often than this
NVIDIA_SMI = ["nvidia-smi", "--query-gpu=uuid,utilization.gpu,memory.used,power.draw", "--format=csv,noheader,nounits"]
ROCM_SMI = ["rocm-smi", "--showuse", "--showmeminfo", "vram", "--showpower", "--showbus", "--json"]
Sample = tuple  # (util %, memory bytes, power W), each None where unknown


def as_number(value: Any) -> float | None:
    """A number from a tool's field; None for "N/A", "[N/A]", "[Not Supported]" and the like."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _uuid(text: Any) -> str:
    text = text.decode() if isinstance(text, bytes) else str(text)
    text = text.strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def _bus(text: Any) -> tuple[int, int, int]:
    """(domain, bus, device) from "0000:65:00.0" or NVML's "00000000:65:00.0"."""
    text = text.decode() if isinstance(text, bytes) else str(text)
    domain, bus, rest = text.strip().split(":")
    return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"{cmd[0]} exited with {done.returncode}: {lines[-1] if lines else 'no output'}")
    return done.stdout
class NvmlSampler:
    """An NVIDIA GPU through NVML, found by UUID or PCI bus id."""

    source, min_interval_s = "nvml", 0.0

    def __init__(self, uuid: str | None, bus: tuple[int, int, int] | None) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        try:
            self.handle = self._find(uuid, bus)
        except BaseException:
            pynvml.nvmlShutdown()
            raise

    def _find(self, uuid: str | None, bus: tuple[int, int, int] | None) -> Any:
        nvml = self.nvml
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                if uuid and _uuid(nvml.nvmlDeviceGetUUID(handle)) == uuid:
                    return handle
                if bus and _bus(nvml.nvmlDeviceGetPciInfo(handle).busId) == bus:
                    return handle
            except nvml.NVMLError:  # a GPU this job's cgroup hides from it
                continue
        raise RuntimeError(f"NVML lists no GPU with UUID {uuid} or PCI bus id {bus}")

    def _optional(self, read: Any) -> Any:
        try:
            return read(self.handle)
        except self.nvml.NVMLError_NotSupported:  # MIG slices have no utilisation; some boards no power
            return None

    def sample(self) -> Sample:
        util = self._optional(lambda h: self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        power = self._optional(self.nvml.nvmlDeviceGetPowerUsage)  # milliwatts
        mem = int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        return as_number(util), mem, (power / 1000.0 if power is not None else None)

    def close(self) -> None:
        self.nvml.nvmlShutdown()


def parse_nvidia_smi(text: str, uuid: str) -> Sample:
    """The sample of GPU `uuid` from ``nvidia-smi --query-gpu=uuid,utilization.gpu,memory.used,power.draw`` CSV."""
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 4 and _uuid(fields[0]) == _uuid(uuid):
            mem = as_number(fields[2])  # MiB (nounits)
            return as_number(fields[1]), (int(mem * 2**20) if mem is not None else None), as_number(fields[3])
    raise RuntimeError(f"nvidia-smi lists no GPU with UUID {uuid}")


class AmdSmiSampler:
    """An AMD GPU through the amdsmi module, found by PCI bus id."""

    source, min_interval_s = "amdsmi", 0.0

    def __init__(self, bus: tuple[int, int, int] | None) -> None:
        import amdsmi

        if bus is None:
            raise RuntimeError("torch gave no PCI bus id to find the GPU by in amdsmi")
        self.amdsmi = amdsmi
        amdsmi.amdsmi_init()
        self.handle = next((h for h in amdsmi.amdsmi_get_processor_handles()
                            if _bus(amdsmi.amdsmi_get_gpu_device_bdf(h)) == bus), None)
        if self.handle is None:
            amdsmi.amdsmi_shut_down()
            raise RuntimeError(f"amdsmi lists no GPU with PCI bus id {bus}")

    def sample(self) -> Sample:
        smi, h = self.amdsmi, self.handle
        vram = as_number(smi.amdsmi_get_gpu_vram_usage(h).get("vram_used"))  # MiB
        power = smi.amdsmi_get_power_info(h)  # W; MI300 fills current_socket_power, older boards the average
        watts = next((w for w in map(as_number, (power.get("current_socket_power"), power.get("average_socket_power")))
                      if w is not None), None)
        util = as_number(smi.amdsmi_get_gpu_activity(h).get("gfx_activity"))
        return util, (int(vram * 2**20) if vram is not None else None), watts

    def close(self) -> None:
        self.amdsmi.amdsmi_shut_down()


def parse_rocm_smi(text: str, bus: tuple[int, int, int]) -> Sample:
    """The sample of the GPU at PCI `bus` from ``rocm-smi --showuse --showmeminfo vram --showpower --showbus --json``.

    Key names vary between ROCm releases ("Average Graphics Package Power (W)", "Current Socket
    Graphics Package Power (W)"), so fields are found by their stable parts.
    """
    data = json.loads(text[text.index("{"): text.rindex("}") + 1])  # some releases print warnings around it
    for card, fields in data.items():
        if not (card.startswith("card") and isinstance(fields, dict)):
            continue
        try:
            if _bus(fields.get("PCI Bus", "")) != bus:
                continue
        except ValueError:
            continue
        util = next((as_number(v) for k, v in fields.items() if k.startswith("GPU use")), None)
        mem = next((as_number(v) for k, v in fields.items() if "Used Memory (B)" in k), None)
        power = next((p for p in (as_number(v) for k, v in fields.items() if k.endswith("Power (W)")) if p is not None), None)
        return util, (int(mem) if mem is not None else None), power
    raise RuntimeError(f"rocm-smi lists no GPU with PCI bus id {bus}")


class CommandSampler:
    """A GPU through a command line tool, run once per sample (so at most once a second)."""

    min_interval_s = SMI_INTERVAL_S

    def __init__(self, source: str, cmd: list[str], parse: Any, key: Any) -> None:
        self.source, self.cmd, self.parse, self.key = source, cmd, parse, key
        self.sample()  # fail now, not at the first interval, when the command or the GPU is missing

    def sample(self) -> Sample:
        return self.parse(_run(self.cmd), self.key)

    def close(self) -> None:
        pass


def _fallback(first: Any, second: Any) -> Any:
    try:
        return first()
    except Exception as exc:
        try:
            return second()
        except Exception as exc2:
            raise RuntimeError(f"{exc}; and then {exc2}") from None


def nvidia_sampler(uuid: str | None, bus: tuple[int, int, int] | None) -> Any:
    """NVML, else nvidia-smi (which needs the UUID)."""
    return _fallback(lambda: NvmlSampler(uuid, bus), lambda: CommandSampler("nvidia-smi", NVIDIA_SMI, parse_nvidia_smi, uuid))


def amd_sampler(bus: tuple[int, int, int] | None) -> Any:
    """amdsmi, else rocm-smi."""
    return _fallback(lambda: AmdSmiSampler(bus), lambda: CommandSampler("rocm-smi", ROCM_SMI, parse_rocm_smi, bus))


def gpu_sampler(props: Any) -> Any:
    """The sampler of the GPU whose torch device properties are `props`: amdsmi or rocm-smi on a ROCm build of
    torch, else NVML or nvidia-smi."""
    bus = (props.pci_domain_id, props.pci_bus_id, props.pci_device_id) if hasattr(props, "pci_bus_id") else None
    if torch.version.hip:
        return amd_sampler(bus)
    return nvidia_sampler(_uuid(getattr(props, "uuid", "") or "") or None, bus)
