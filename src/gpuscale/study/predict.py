"""Predict throughput and efficiency on N devices from one single-device run and the interconnect.

The model (docs/measuring.md, the prediction): data parallelism adds one all-reduce of the gradients per optimizer step.
A ring all-reduce of S bytes over N ranks takes

    T(N) = 2 (N - 1) * alpha * buckets  +  2 (N - 1) / N * S / B

with alpha the latency of one ring step and B the bandwidth of the slowest link in the ring: within
a node for a job on one node, between nodes for one device per node, the slower of the two for
several devices on each of several nodes (`Link.for_ring`). DDP sends gradients in buckets (25 MiB
by default), each paying the latency; FSDP and ZeRO-3 move about 1.5x DDP's bytes. Part of T hides
behind the backward pass: ``overlap`` is the share of the compute time that communication can run
alongside (0 = none: on CPUs gloo needs the cores the compute uses; about 0.5 on GPUs, where
the backward pass is about two thirds of a step and the first buckets are not ready at once).

    step(N) = data(b) + compute(b) + max(0, T(N) - overlap * compute(b))

where data(b) + compute(b) is the single-device step time scaled linearly to the per-device batch b
(weak scaling keeps b, strong scaling divides the global batch by N exactly, as the study plans it:
`cell_batch`; a global batch that does not divide gets no figures, with the study's refusal),
data(b) the part of it the run waited for its loader. A step waiting for data is not computing: no gradient is being made, and
the all-reduce of the step before has ended, so only compute hides communication. The model is honest
about what it leaves out: fixed per-step costs that do not shrink with the batch (it predicts strong
scaling optimistically at tiny batches; a loader's wait per batch is one), stragglers.

A step's compute is at least its exposed communication from a per-device batch of
``ceil(T / ((1 + overlap) * compute per sample))`` samples up; below it a step spends more time
communicating than computing: the batch-size sweet spot lies above it.

The step time is one device's, so the prediction holds for the kind of device the run was made
on: a step measured on a CPU says nothing about a GPU's, nor an NVIDIA GPU's about an AMD GPU's.
`check_target` refuses to project a run onto interconnect figures of another kind of device
(a profile's ``gpu_vendor``, or this machine's devices for a measured link); the step time of one
target device (`Baseline.with_step_time`, ``gpuscale predict --step-time``) lifts the refusal.
Every prediction says what it projects: its ``baseline`` names the run, its device and where
the step time came from.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from gpuscale.base.batchplan import plan_batch
from gpuscale.study.baseline import Baseline as Baseline  # re-exported: predict.Baseline is how callers name it
from gpuscale.study.baseline import check_step_time as check_step_time
from gpuscale.study.matrix import Cell

DDP_BUCKET_BYTES = 25 * 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
"""DDP sends the last layers' gradients early in a small first bucket, then 25 MiB buckets."""


@dataclass(frozen=True, kw_only=True)
class Link:
    """Interconnect figures: bandwidth in bytes/s (per direction), latency of one ring step in seconds."""

    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float | None = None
    inter_latency: float | None = None
    source: str = ""
    """Where the figures come from: a profile's name, or 'measured (gloo, 2 processes)'."""
    measured: bool = False
    """Benchmarked here (`linkbench`), not a profile's figures: a study may scale it to fit its runs."""

    def for_ring(self, nodes: int, nproc_per_node: int) -> tuple[float, float]:
        """(bandwidth, latency) of the slowest link in the ring of a job of `nodes` nodes x `nproc_per_node` devices.

        The ring has the links its shape has: on one node only links within it; with one device per node only links
        between nodes (no two neighbours share a node); otherwise both, and the slower of each figure sets the pace."""
        if nodes <= 1:
            return self.intra_bandwidth, self.intra_latency
        if self.inter_bandwidth is None or self.inter_latency is None:
            raise ValueError(f"the interconnect figures ({self.source}) have no inter-node bandwidth and latency; "
                             "set inter_node_gbps and inter_node_latency_us in the profile (--set)")
        if nproc_per_node <= 1:
            return self.inter_bandwidth, self.inter_latency
        return min(self.inter_bandwidth, self.intra_bandwidth), max(self.inter_latency, self.intra_latency)

    def scaled(self, factor: float, why: str) -> Link:
        """These figures with every all-reduce `factor` times as long (latencies times it, bandwidths over it)."""
        inter_bandwidth = None if self.inter_bandwidth is None else self.inter_bandwidth / factor
        inter_latency = None if self.inter_latency is None else self.inter_latency * factor
        return Link(intra_bandwidth=self.intra_bandwidth / factor, intra_latency=self.intra_latency * factor,
                    inter_bandwidth=inter_bandwidth, inter_latency=inter_latency, source=f"{self.source}, {why}",
                    measured=self.measured)

    @classmethod
    def from_measurement(cls, measured: dict[str, Any]) -> Link:
        """Figures from `linkbench` (one node: no inter-node figures)."""
        return cls(intra_bandwidth=measured["bandwidth_bytes_per_s"], intra_latency=measured["latency_s"],
                   source=f"measured ({measured['backend']}, {measured['world_size']} processes)", measured=True)

    @classmethod
    def from_profile(cls, profile: Any) -> Link:
        if profile.intra_node_gbps is None or profile.intra_node_latency_us is None:
            raise ValueError(f"profile {profile.name} has no interconnect figures; add intra_node_gbps and "
                             "intra_node_latency_us (and inter_node_*) to it, or pass --set intra_node_gbps=...")
        inter_bw = profile.inter_node_gbps * 1e9 if profile.inter_node_gbps else None
        inter_lat = profile.inter_node_latency_us * 1e-6 if profile.inter_node_latency_us else None
        return cls(intra_bandwidth=profile.intra_node_gbps * 1e9, intra_latency=profile.intra_node_latency_us * 1e-6,
                   inter_bandwidth=inter_bw, inter_latency=inter_lat, source=f"profile {profile.name}")


VENDOR_NAMES = {"amd": "AMD", "nvidia": "NVIDIA"}
"""GPU vendors as a profile's ``gpu_vendor`` names them, and as messages write them."""
_VENDOR_WORDS = {"nvidia": ("nvidia", "tesla", "geforce", "quadro", "rtx"), "amd": ("amd", "instinct", "radeon", "gfx")}
def gpu_vendor_of(device_name: Any) -> str | None:
    """"nvidia" or "amd" from a GPU's name as torch gives it ("NVIDIA H100 80GB HBM3", "AMD Instinct MI250X");
    None when the name says neither (or both)."""
    if not isinstance(device_name, str):
        return None
    name = device_name.lower()
    found = [vendor for vendor, words in _VENDOR_WORDS.items() if any(w in name for w in words)]
    return found[0] if len(found) == 1 else None


def device_words(device: str | None, device_name: str | None) -> str:
    """The run's device for a sentence: "a CPU", "an NVIDIA GPU (NVIDIA H100 80GB HBM3)", "a GPU (gfx-x)"."""
    if device == "cpu":
        return "a CPU"
    if device == "cuda":
        vendor = gpu_vendor_of(device_name)
        what = f"an {VENDOR_NAMES[vendor]} GPU" if vendor else "a GPU"
        return f"{what} ({device_name})" if device_name else what
    return f"a device of kind {device!r}" if device else "a device the summary does not name"


def duration_words(seconds: float) -> str:
    """12.7 ms, 1.25 s: a step time for a sentence."""
    return f"{seconds:.4g} s" if seconds >= 1 else f"{1e3 * seconds:.3g} ms"


def check_target(base: Baseline, vendor: str, target: str, where: str) -> None:
    """ValueError, in one line, unless the run's step time holds for `target`'s devices.

    vendor: the GPUs the target has, as a profile's ``gpu_vendor`` says ("amd", "nvidia", or "none":
    CPUs only). target: the target in words ("profile lumi-g"); where: the place in words ("on lumi-g",
    "here"). A CPU run holds only for a target without GPUs, a GPU run only for one with GPUs (of its
    vendor, where its name says which); a step time given for the target (`with_step_time`) holds anywhere.
    """
    if base.step_time_given:
        return
    if vendor not in (*VENDOR_NAMES, "none"):
        raise ValueError(f"{target} has gpu_vendor {vendor!r}; it must be one of amd, nvidia, none")
    run, step = base.run or "the run", duration_words(base.step_time_s)
    has = f"{VENDOR_NAMES[vendor]} GPUs" if vendor in VENDOR_NAMES else "no GPUs"
    mismatch = (f"{run} ran on {device_words(base.device, base.device_name)}, but {target} has {has}: "
                f"its {step} per step says nothing about a step {where}")
    problem = None
    if base.device is None:
        problem = (f"{run}'s summary does not say which device it ran on (no \"device\": an older gpuscale wrote it), "
                   f"so its {step} per step cannot be matched to the devices {where}")
    elif base.device not in ("cpu", "cuda"):
        problem = f"{run} ran on a device of kind {base.device!r}: its {step} per step cannot be matched to the devices {where}"
    elif base.device == "cpu" and vendor != "none":
        problem = mismatch
    elif base.device == "cuda":
        named = gpu_vendor_of(base.device_name)
        if vendor == "none" or (named is not None and named != vendor):
            problem = mismatch
    if problem is not None:
        accum = f" ({base.grad_accum_steps} micro-batches per step)" if base.grad_accum_steps > 1 else ""
        raise ValueError(f"{problem}; give the step time of one device {where} at {base.per_device_batch} samples per "
                         f"device{accum} with --step-time SECONDS, or predict from a run made {where}")


def allreduce_seconds(num_bytes: float, world_size: int, bandwidth: float, latency: float) -> float:
    """Ring all-reduce time of `num_bytes` over `world_size` ranks, sent in DDP's buckets (1 MiB, then 25 MiB)."""
    if world_size <= 1 or num_bytes <= 0:
        return 0.0
    buckets = 1 + math.ceil(max(0.0, num_bytes - DDP_FIRST_BUCKET_BYTES) / DDP_BUCKET_BYTES)
    return 2 * (world_size - 1) * latency * buckets + 2 * (world_size - 1) / world_size * num_bytes / bandwidth


def cell_batch(cell: Cell, base: Baseline, base_global_batch: int) -> tuple[int, int]:
    """(per-device batch, micro-batches per step) of a cell, exact as the study plans it (`gpuscale.plan_batch`).

    Weak scaling keeps the baseline's; strong scaling shares its global batch among the cell's devices. A baseline
    that accumulated micro-batches held no more per pass than its per-device batch: no device of the cell holds
    more, as with --max-device-batch (fewer micro-batches where a device's share is smaller). ValueError in
    plan_batch's words (the study's refusal) where the global batch does not divide among the cell's devices."""
    if cell.scaling == "weak":
        return base.per_device_batch, base.grad_accum_steps
    most = base.per_device_batch if base.grad_accum_steps > 1 else None
    plan = plan_batch(int(base_global_batch), cell.world_size, "strong", max_per_device=most)
    return plan.per_device_batch, plan.grad_accum_steps


def predict_cell(cell: Cell, base: Baseline, link: Link, overlap: float, base_global_batch: int) -> dict[str, Any]:
    """Predicted step time, throughput and efficiency of one cell; a cell whose batch the study would refuse
    (`cell_batch`) has no figures but its all-reduce, and says why in ``refused``."""
    world = cell.world_size
    bandwidth, latency = link.for_ring(cell.nodes, cell.nproc_per_node)
    comm = allreduce_seconds(base.traffic_bytes, world, bandwidth, latency)  # once per optimizer step, not per micro-batch
    shape = {"name": cell.name, "world_size": world, "nodes": cell.nodes}
    try:
        batch, accum = cell_batch(cell, base, base_global_batch)
    except ValueError as exc:  # a fractional batch would predict a run that no study can make
        return {**shape, "per_device_batch": None, "grad_accum_steps": None, "compute_s": None, "data_wait_s": None,
                "comm_s": comm, "exposed_comm_s": None, "step_time_s": None, "samples_per_s": None, "efficiency": None,
                "refused": str(exc)}
    share = batch * accum / (base.per_device_batch * base.grad_accum_steps)  # of the baseline's samples per device step
    compute = base.compute_time_s * share
    data = base.data_wait_s * share
    exposed = max(0.0, comm - overlap * compute)  # only compute hides it: a step waiting for data makes no gradient
    step = data + compute + exposed
    samples_per_s = batch * accum * world / step
    base_rate = base.per_device_batch * base.grad_accum_steps / base.step_time_s
    return {
        **shape, "per_device_batch": batch, "grad_accum_steps": accum,
        "compute_s": compute, "data_wait_s": data, "comm_s": comm, "exposed_comm_s": exposed, "step_time_s": step,
        "samples_per_s": samples_per_s, "efficiency": samples_per_s / (base_rate * world),
    }


@dataclass(frozen=True)
class Prediction:
    """Predicted cells plus the batch-size sweet spot, as `results.json` carries it."""

    link: dict[str, Any]
    overlap: float
    gradient_bytes: int
    cells: list[dict[str, Any]]
    comm_dominates_below_batch: dict[str, int]
    """Per shape ('1x8', '2x8'): the smallest whole per-device batch at which a step's compute is at least
    its exposed communication; below it a step communicates longer than it computes."""
    baseline: dict[str, Any]
    """What is projected (`Baseline.describe`): run, device, device_name, per_device_batch, grad_accum_steps,
    step_time_s (the one used), step_time_source ("measured: RUN" or "--step-time"), measured_step_time_s."""

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
    per_sample = base.compute_time_s / base.per_device_batch
    dominates = {}
    for cell in sorted({(c.nodes, c.nproc_per_node) for c in cells if c.world_size > 1}):
        nodes, nproc = cell
        bandwidth, latency = link.for_ring(nodes, nproc)
        comm = allreduce_seconds(base.traffic_bytes, nodes * nproc, bandwidth, latency)
        dominates[f"{nodes}x{nproc}"] = smallest_computing_batch(comm, per_sample, overlap)
    return Prediction(link=asdict(link), overlap=overlap, gradient_bytes=base.gradient_bytes, cells=predicted,
                      comm_dominates_below_batch=dominates, baseline=base.describe())


def smallest_computing_batch(comm_s: float, per_sample_s: float, overlap: float) -> int:
    """The smallest whole per-device batch b whose compute b * per_sample_s is at least the exposed
    communication comm_s - overlap * b * per_sample_s: ceil(comm_s / ((1 + overlap) * per_sample_s)), at least 1."""
    exact = comm_s / ((1 + overlap) * per_sample_s) if per_sample_s > 0 else math.inf
    if not math.isfinite(exact):
        raise ValueError(f"a step of {per_sample_s!r} s per sample cannot be weighed against {comm_s!r} s of communication; "
                         "give the step time in seconds (e.g. 0.0127)")
    batch = max(1, math.ceil(exact))
    if batch > 1 and (batch - 1) * (1 + overlap) * per_sample_s >= comm_s * (1 - 1e-12):  # 32.000000000001 is 32
        batch -= 1
    return batch


NEXT_SCALES = 3
"""How many scales beyond the largest run a study predicts for each scaling."""


def next_scales(members: list[Cell], devices_per_node: int, inter_node: bool, count: int = NEXT_SCALES) -> list[Cell]:
    """The scales a study did not run, after its largest: the devices of a node doubled up to `devices_per_node`, then
    (where the interconnect between nodes is known, `inter_node`) twice the nodes, full ones, and so on: `count` at most."""
    largest = max(members, key=lambda c: (c.world_size, c.nodes))
    nodes, nproc = largest.nodes, largest.nproc_per_node
    ran = {(c.nodes, c.nproc_per_node) for c in members}
    out: list[Cell] = []
    while len(out) < count:
        if nodes == 1 and nproc < devices_per_node:
            nproc = min(2 * nproc, devices_per_node)
        elif inter_node:
            nodes, nproc = 2 * nodes, devices_per_node if nodes == 1 else nproc
        else:
            break
        if (nodes, nproc) not in ran:
            out.append(Cell(largest.scaling, nodes, nproc, largest.variant, largest.variant_args))
    return out


def predict_study(cells: list[Cell], summaries: dict[str, dict[str, Any]], link: Link, overlap: float,
                  devices_per_node: int | None = None) -> dict[str, Any] | None:
    """The prediction for a study's cells from its single-device runs (one per scaling and variant), as a dict.

    The runs were made where the study ran, on the devices the link's figures are for, so each
    step time is its own run's ("measured: weak-1x1"). None when no group has a single-device run.
    The batch sweet spot and the ``baseline`` are the first group's; each cell carries its own group's sweet spot
    (``comm_dominates_below_batch``: its variant's baseline may step faster or slower). With `devices_per_node`, each group's
    `next_scales` are predicted too, marked ``"run": False`` (the study's own cells: ``"run": True``).
    """
    combined: dict[str, Any] | None = None
    for group in dict.fromkeys((c.variant, c.scaling) for c in cells):
        members = [c for c in cells if (c.variant, c.scaling) == group]
        first = next((c for c in members if c.world_size == 1 and c.name in summaries), None)
        if first is None:
            continue
        base = Baseline.from_summary(summaries[first.name], run=first.name)
        extra = next_scales(members, devices_per_node, link.inter_bandwidth is not None) if devices_per_node else []
        part = predict(members + extra, base, link, overlap, summaries[first.name]["global_batch"]).to_dict()
        for predicted in part["cells"]:
            predicted["run"] = predicted["name"] in {c.name for c in members}
            shape = f"{predicted['nodes']}x{predicted['world_size'] // max(1, predicted['nodes'])}"
            predicted["comm_dominates_below_batch"] = part["comm_dominates_below_batch"].get(shape)  # its own group's
        if combined is None:
            combined = part
        else:
            combined["cells"].extend(part["cells"])
            for shape, batch in part["comm_dominates_below_batch"].items():
                combined["comm_dominates_below_batch"].setdefault(shape, batch)
    return combined
