"""Predict throughput and efficiency on N devices from one single-device run and the interconnect.

The model (FACTS §7): data parallelism adds one all-reduce of the gradients per optimizer step.
A ring all-reduce of S bytes over N ranks takes

    T(N) = 2 (N - 1) * alpha * buckets  +  2 (N - 1) / N * S / B

with alpha the latency of one ring step and B the bandwidth of the slowest link in the ring
(between nodes once the job spans nodes). DDP sends gradients in buckets (25 MiB by default),
each paying the latency; FSDP and ZeRO-3 move about 1.5x DDP's bytes. Part of T hides behind
the backward pass: ``overlap`` is the share of the compute time that communication can run
alongside (0 = none: on CPUs gloo needs the cores the compute uses; about 0.5 on GPUs, where
the backward pass is about two thirds of a step and the first buckets are not ready at once).

    step(N) = compute(b) + max(0, T(N) - overlap * compute(b))

where compute(b) is the single-device step time scaled linearly to the per-device batch b: weak
scaling keeps b, strong scaling divides the global batch by N. The model is honest about what
it leaves out: fixed per-step costs that do not shrink with the batch (it predicts strong
scaling optimistically at tiny batches), data loading that does not keep up, stragglers.

Below a per-device batch of ``T / ((1 + overlap) * compute per sample)`` a step spends more time
communicating than computing: the batch-size sweet spot lies above it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from gpuscale.study.matrix import Cell

DDP_BUCKET_BYTES = 25 * 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
"""DDP sends the last layers' gradients early in a small first bucket, then 25 MiB buckets."""
SHARDED_TRAFFIC = 1.5
"""FSDP and ZeRO-3 gather parameters and reduce-scatter gradients: about 1.5x DDP's bytes."""


@dataclass(frozen=True, kw_only=True)
class Link:
    """Interconnect figures: bandwidth in bytes/s (per direction), latency of one ring step in seconds."""

    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float | None = None
    inter_latency: float | None = None
    source: str = ""
    """Where the figures come from: a profile's name, or 'measured (gloo, 2 processes)'."""

    def for_nodes(self, nodes: int) -> tuple[float, float]:
        """(bandwidth, latency) of the ring's slowest link for a job on `nodes` nodes."""
        if nodes <= 1:
            return self.intra_bandwidth, self.intra_latency
        if self.inter_bandwidth is None or self.inter_latency is None:
            raise ValueError(f"the interconnect figures ({self.source}) have no inter-node bandwidth and latency; "
                             "set inter_node_gbps and inter_node_latency_us in the profile (--set)")
        return min(self.inter_bandwidth, self.intra_bandwidth), max(self.inter_latency, self.intra_latency)

    @classmethod
    def from_measurement(cls, measured: dict[str, Any]) -> Link:
        """Figures from `linkbench` (one node: no inter-node figures)."""
        return cls(intra_bandwidth=measured["bandwidth_bytes_per_s"], intra_latency=measured["latency_s"],
                   source=f"measured ({measured['backend']}, {measured['world_size']} processes)")

    @classmethod
    def from_profile(cls, profile: Any) -> Link:
        if profile.intra_node_gbps is None or profile.intra_node_latency_us is None:
            raise ValueError(f"profile {profile.name} has no interconnect figures; add intra_node_gbps and "
                             "intra_node_latency_us (and inter_node_*) to it, or pass --set intra_node_gbps=...")
        inter_bw = profile.inter_node_gbps * 1e9 if profile.inter_node_gbps else None
        inter_lat = profile.inter_node_latency_us * 1e-6 if profile.inter_node_latency_us else None
        return cls(intra_bandwidth=profile.intra_node_gbps * 1e9, intra_latency=profile.intra_node_latency_us * 1e-6,
                   inter_bandwidth=inter_bw, inter_latency=inter_lat, source=f"profile {profile.name}")


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """What the model needs from a single-device run's summary."""

    step_time_s: float
    """Seconds per optimizer step (training time without evaluation and checkpoints, over steps)."""
    per_device_batch: int
    grad_accum_steps: int
    gradient_bytes: int
    sharded: bool = False

    @property
    def traffic_bytes(self) -> float:
        """Bytes one step synchronises: the gradients, 1.5x for FSDP (parameters gathered too)."""
        return self.gradient_bytes * (SHARDED_TRAFFIC if self.sharded else 1.0)

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> Baseline:
        if not isinstance(summary, dict):
            raise ValueError("the summary is not a JSON object; give the summary.json a gpuscale run wrote")
        if summary.get("world_size") != 1:
            raise ValueError(f"the prediction starts from a single-device run, but this summary is of {summary.get('world_size')} "
                             "devices; run the study with --nproc 1 in it (or predict from a 1-process summary.json)")
        missing = [k for k in ("step_time_s", "gradient_bytes", "per_device_batch", "global_batch") if not summary.get(k)]
        if missing:
            raise ValueError(f"the summary has no {missing[0]}: it was written by an older gpuscale, or the script built its "
                             "model without gpuscale.setup/wrap; run it again with this version")
        for key in ("step_time_s", "gradient_bytes", "per_device_batch", "global_batch", "grad_accum_steps"):
            value = summary.get(key, 1)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf):
                raise ValueError(f"the summary's {key} is {value!r}, not a positive number: the file is damaged; run it again")
        return cls(step_time_s=summary["step_time_s"], per_device_batch=summary["per_device_batch"],
                   grad_accum_steps=summary.get("grad_accum_steps") or 1, gradient_bytes=summary["gradient_bytes"],
                   sharded=summary.get("strategy") == "fsdp")


def allreduce_seconds(num_bytes: float, world_size: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce time of `num_bytes` over `world_size` ranks, sent in DDP's buckets (1 MiB, then 25 MiB)."""
    if world_size <= 1 or num_bytes <= 0:
        return 0.0
    buckets = 1 + math.ceil(max(0.0, num_bytes - DDP_FIRST_BUCKET_BYTES) / DDP_BUCKET_BYTES)
    return 2 * (world_size - 1) * latency * buckets + 2 * (world_size - 1) / world_size * num_bytes / bandwidth


def predict_cell(cell: Cell, base: Baseline, link: Link, overlap: float, base_global_batch: int) -> dict[str, Any]:
    """Predicted step time, throughput and efficiency of one cell."""
    world = cell.world_size
    # weak: each device keeps its batch; strong: the global batch is shared (micro-batches as in the baseline)
    batch = base.per_device_batch if cell.scaling == "weak" else base_global_batch / (world * base.grad_accum_steps)
    compute = base.step_time_s * batch / base.per_device_batch
    bandwidth, latency = link.for_nodes(cell.nodes)
    comm = allreduce_seconds(base.traffic_bytes, world, bandwidth, latency)  # once per optimizer step, not per micro-batch
    exposed = max(0.0, comm - overlap * compute)
    step = compute + exposed
    samples_per_step = batch * world * base.grad_accum_steps
    samples_per_s = samples_per_step / step
    base_rate = base.per_device_batch * base.grad_accum_steps / base.step_time_s
    return {
        "name": cell.name, "world_size": world, "nodes": cell.nodes, "per_device_batch": batch,
        "compute_s": compute, "comm_s": comm, "exposed_comm_s": exposed, "step_time_s": step,
        "samples_per_s": samples_per_s, "efficiency": samples_per_s / (base_rate * world),
    }


@dataclass(frozen=True)
class Prediction:
    """Predicted cells plus the batch-size sweet spot, as `results.json` carries it."""

    link: dict[str, Any]
    overlap: float
    gradient_bytes: int
    cells: list[dict[str, Any]]
    comm_dominates_below_batch: dict[str, float]
    """Per shape ('1x8', '2x8'): the per-device batch below which communication outlasts compute."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_overlap(overlap: float | None) -> None:
    """ValueError unless `overlap` is None (the default) or a share between 0 and 1."""
    if overlap is not None and not 0.0 <= overlap <= 1.0:  # NaN fails both comparisons
        raise ValueError(f"--overlap {overlap} must be between 0 (no overlap) and 1 (all of the compute time)")


def predict(cells: list[Cell], base: Baseline, link: Link, overlap: float, base_global_batch: int) -> Prediction:
    """Predict every cell; find where communication starts to dominate for each shape."""
    check_overlap(overlap)
    predicted = [predict_cell(c, base, link, overlap, base_global_batch) for c in cells]
    per_sample = base.step_time_s / base.per_device_batch
    dominates = {}
    for cell in sorted({(c.nodes, c.nproc_per_node) for c in cells if c.world_size > 1}):
        nodes, nproc = cell
        bandwidth, latency = link.for_nodes(nodes)
        comm = allreduce_seconds(base.traffic_bytes, nodes * nproc, bandwidth, latency)
        dominates[f"{nodes}x{nproc}"] = comm / ((1 + overlap) * per_sample)
    return Prediction(link=asdict(link), overlap=overlap, gradient_bytes=base.gradient_bytes, cells=predicted,
                      comm_dominates_below_batch=dominates)


def predict_study(cells: list[Cell], summaries: dict[str, dict[str, Any]], link: Link, overlap: float) -> dict[str, Any] | None:
    """The prediction for a study's cells from its single-device runs (one per scaling and variant), as a dict.

    None when no group has a single-device run. The batch sweet spot is the first group's.
    """
    combined: dict[str, Any] | None = None
    for group in dict.fromkeys((c.variant, c.scaling) for c in cells):
        members = [c for c in cells if (c.variant, c.scaling) == group]
        base_summary = next((summaries[c.name] for c in members if c.world_size == 1 and c.name in summaries), None)
        if base_summary is None:
            continue
        base = Baseline.from_summary(base_summary)
        part = predict(members, base, link, overlap, base_summary["global_batch"]).to_dict()
        if combined is None:
            combined = part
        else:
            combined["cells"].extend(part["cells"])
    return combined
