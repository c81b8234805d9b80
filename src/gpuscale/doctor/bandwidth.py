"""All-reduce bandwidth over message sizes, reported the way nccl-tests does (docs/measuring.md, the prediction).

For each size S (float32, on the rank's device: NCCL/RCCL on GPUs, gloo on CPU) every rank runs
the same number of all-reduces between barriers; the time of one is the slowest rank's mean.

    algbw = S / t                    what one rank's buffer moves per second
    busbw = algbw * 2 (N - 1) / N    what each link carries in a ring all-reduce: comparable
                                     across rank counts and to the hardware's link bandwidth

The result is checked too (every element must equal the sum of the ranks' values): bytes that
really synced. `verdict` compares the best busbw with the profile's expected link bandwidth.
"""

from __future__ import annotations

import re
import time
from typing import Any

import torch
import torch.distributed as dist

from gpuscale.doctor.checks import Finding

__all__ = ["DEFAULT_MAX_BYTES", "parse_size", "format_size", "message_sizes", "bus_bandwidth", "sweep", "verdict"]

DEFAULT_MAX_BYTES = 256 * 2**20
MIN_BYTES = 4 * 2**10
TARGET_S = 0.25  # time per size to aim at (after warm-up), so small sizes get many repeats
MAX_REPEATS = 200

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMG]?)(i?B)?\s*\Z", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'256M', '64MiB', '4096' -> bytes (powers of 1024)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"size {text!r} is not a number of bytes like 4096, 64K, 256M or 1G")
    value = float(match.group(1)) * 1024 ** " KMG".index((match.group(2) or " ").upper())
    if not MIN_BYTES <= value <= 16 * 2**30:
        raise ValueError(f"size {text!r} must be between 4K and 16G")
    return int(value)


def format_size(num_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:g} {unit}"
    return f"{num_bytes} B"


def message_sizes(max_bytes: int = DEFAULT_MAX_BYTES) -> list[int]:
    """4 KiB, 16 KiB, ... (x4) up to `max_bytes` (included, even off the x4 ladder)."""
    sizes, size = [], MIN_BYTES
    while size < max_bytes:
        sizes.append(size)
        size *= 4
    return [*sizes, max_bytes]


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algbw * 2 (N - 1) / N."""
    return algbw * 2 * (world_size - 1) / world_size


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sweep(device: torch.device, sizes: list[int], group: Any = None) -> list[dict[str, Any]]:
    """Every rank of `group` (default: the world) calls this with the same sizes; one row per size, alike on every rank."""
    world = dist.get_world_size(group)
    rows = []
    for size in sizes:
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        dist.all_reduce(buf, group=group)  # warm-up: connections, buffers, the kernel's first launch
        _sync(device)
        ok = bool(buf[0].item() == world and buf[-1].item() == world)
        # one timed call decides the repeat count; rank 0's choice is everyone's, so the calls match up
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(buf, group=group)
        _sync(device)
        once = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.broadcast(once, 0, group=group)
        repeats = int(min(MAX_REPEATS, max(3, TARGET_S / max(once.item(), 1e-6))))
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(buf, group=group)
        _sync(device)
        elapsed = torch.tensor([(time.perf_counter() - start) / repeats], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        seconds = float(elapsed.item())
        algbw = size / seconds / 1e9
        rows.append({"bytes": size, "seconds": seconds, "repeats": repeats, "algbw_gbps": algbw,
                     "busbw_gbps": bus_bandwidth(algbw, world), "correct": ok})
        del buf
    return rows


def verdict(rows: list[dict[str, Any]], expected_gbps: float | None, backend: str | None) -> list[Finding]:
    """Findings on a sweep: wrong sums fail; the best busbw against the expected link bandwidth."""
    wrong = [format_size(r["bytes"]) for r in rows if not r["correct"]]
    if wrong:
        return [Finding("fail", "bandwidth", f"all-reduce returned wrong sums at {', '.join(wrong)}",
                        "a broken collective library or driver: report it with this output")]
    best = max(rows, key=lambda r: r["busbw_gbps"])
    where = f"busbw peak {best['busbw_gbps']:.3g} GB/s (algbw {best['algbw_gbps']:.3g} GB/s) at {format_size(best['bytes'])}, {backend}"
    if expected_gbps is None:
        return [Finding("info", "bandwidth", f"{where}; no expected figure to compare with (--profile or --expect-busbw)")]
    share = best["busbw_gbps"] / expected_gbps
    text = f"{where}: {share:.0%} of the {expected_gbps:g} GB/s expected"
    if share < 0.25:
        return [Finding("fail", "bandwidth", text, "far below the link: check NCCL_SOCKET_IFNAME / the NIC, GPU peer access "
                        "(NCCL_P2P_DISABLE), and that the ranks are on the GPUs and nodes you think (placement above)")]
    if share < 0.6:
        return [Finding("warn", "bandwidth", text, "below what the links should give: compare with nccl-tests; check the "
                        "interface and placement above")]
    return [Finding("ok", "bandwidth", text)]
