"""`gpuscale doctor`'s output: a paste-ready text report, or one JSON object. Pure."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from gpuscale._version import __version__
from gpuscale.detect.log import format_table
from gpuscale.detect.topology import format_cpulist
from gpuscale.doctor.bandwidth import format_size
from gpuscale.doctor.checks import Finding, worst

__all__ = ["placement_table", "network_section", "format_text", "as_json", "exit_code"]

_MARK = {"fail": "FAIL", "warn": "warn", "ok": "ok", "info": "info"}


def _numa(value: Any) -> str:
    if value is None or value == []:
        return "-"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def placement_table(facts: Sequence[dict[str, Any]]) -> str:
    """One line per rank: host, rank, local rank, GPUs seen, device, GPU's NUMA node, cores, their NUMA nodes."""
    header = ("host", "rank", "local", "gpus seen", "device", "gpu", "gpu numa", "cores", "cores numa", "threads")
    rows = []
    for f in sorted(facts, key=lambda f: f["rank"]):
        seen = str(len(f["gpus_seen"])) + (f" ({f['visible_devices']})" if f.get("visible_devices") else "") if f["gpus_seen"] else "-"
        gpu = "-" if not f.get("gpu") else (str(f["gpu_index"]) if f.get("gpu_index") is not None else "?") + f" {f['device_name']}"
        rows.append((f["host"], str(f["rank"]), str(f["local_rank"]), seen, f["device"], gpu, _numa(f.get("gpu_numa")),
                     format_cpulist(f["cores"]), _numa(f.get("cores_numa")), str(f["threads"])))
    return format_table(header, rows)


def exit_code(findings: Sequence[Finding]) -> int:
    """1 if anything failed, else 0 (warnings are reported, not failed on)."""
    return 1 if worst(findings) == "fail" else 0


def network_section(network: Sequence[dict[str, Any]] | None) -> list[str]:
    """'network (...):' and one line per node, as `gpuscale.doctor.network.node_lines` wrote them ([] if none)."""
    if not network:
        return []
    source = "gloo's address by torch's rule" if all(n.get("transport") == "gloo" for n in network) else "NCCL/RCCL's own log"
    return ["", f"network ({source}, one line per node):", *(f"  {n['line']}" for n in network)]


def format_text(facts: Sequence[dict[str, Any]], findings: Sequence[Finding], sweep: list[dict[str, Any]] | None,
                backend: str | None, now: datetime.datetime | None = None,
                network: Sequence[dict[str, Any]] | None = None) -> str:
    """The whole report: header, placement table, checks, network lines, bandwidth table, environment, summary."""
    first = facts[0]
    hosts = sorted({f["host"] for f in facts})
    now = now or datetime.datetime.now(datetime.timezone.utc)
    lines = [
        f"gpuscale doctor {__version__}, {now:%Y-%m-%d %H:%M} UTC: {len(facts)} rank(s) on {len(hosts)} node(s) "
        f"({', '.join(hosts[:8])}{', ...' if len(hosts) > 8 else ''}), launcher {first['launcher']}, "
        f"backend {backend or 'none (one process)'}, rendezvous {first['master']}",
        "",
        "placement:",
        placement_table(facts),
        "",
        "checks:",
    ]
    for f in findings:
        lines.append(f"  {_MARK[f.level]:<4}  {f.area:<11}  {f.message}")
        if f.fix and f.level in ("fail", "warn"):
            lines.append(f"  {'':<4}  {'':<11}  fix: {f.fix}")
    lines += network_section(network)
    if sweep:
        lines += ["", f"all-reduce bandwidth ({backend}, {len(facts)} ranks, float32; busbw = algbw x 2(N-1)/N):"]
        lines.append(format_table(("size", "time", "repeats", "algbw GB/s", "busbw GB/s"), [
            (format_size(r["bytes"]), f"{r['seconds'] * 1e3:.3f} ms", str(r["repeats"]), f"{r['algbw_gbps']:.3g}",
             f"{r['busbw_gbps']:.3g}") for r in sweep]))
    shown = {k: v for k, v in (first.get("environ") or {}).items() if not k.startswith("SLURM_")}
    if shown:
        lines += ["", "environment of rank 0 (secrets masked; SLURM_* in --json):"]
        lines += [f"  {k}={v}" for k, v in shown.items()]
    counts = {level: sum(1 for f in findings if f.level == level) for level in ("fail", "warn", "ok")}
    verdict = "FAILED" if counts["fail"] else "passed with warnings" if counts["warn"] else "passed"
    lines += ["", f"doctor {verdict}: {counts['fail']} failed, {counts['warn']} warning(s), {counts['ok']} ok"]
    return "\n".join(lines)


def as_json(facts: Sequence[dict[str, Any]], findings: Sequence[Finding], sweep: list[dict[str, Any]] | None,
            backend: str | None, network: Sequence[dict[str, Any]] | None = None,
            nccl: dict[int, Any] | None = None) -> dict[str, Any]:
    """The report as one object; 'network' holds the node lines and, on GPUs, each rank's parsed NCCL log."""
    return {
        "gpuscale": __version__,
        "passed": exit_code(findings) == 0,
        "worst": worst(findings),
        "backend": backend,
        "ranks": sorted(facts, key=lambda f: f["rank"]),
        "findings": [f.as_dict() for f in findings],
        "bandwidth": sweep,
        "network": {"nodes": list(network or []), "ranks": {str(r): v for r, v in sorted((nccl or {}).items())} or None},
    }
