"""The prediction's overlap, calibrated on what the study measured. Pure.

The model (`gpuscale.study.predict`) hides ``overlap x compute`` of a step's all-reduce behind its compute. What
share really hides depends on the device and the script: on GPUs NCCL runs beside the backward; on CPUs gloo's
threads share the rank's cores with it, and how much of the all-reduce's wall time the backward still covers
depends on how long those threads wait on the other ranks and the network rather than compute. A default cannot
know it, and on this project's 2-core machine the default for CPUs (0: nothing hides) predicted exposed
communication of 47-68% of ideal where the runs measured 10-18%.

Every multi-device run of a study measured its exposed communication (the sync probe's replays or DDP's timers,
with the backward the all-reduce slowed counted in; `gpuscale.study.analysis`). For such a run the model's
exposed communication equals the measurement at one overlap:

    exposed(run) = share x (devices / samples_per_s) x samples per device step       (seconds per step)
    overlap(run) = (all-reduce(run) - exposed(run)) / compute(run),  clamped to [0, 1]

with all-reduce and compute the model's for that run. The study's calibrated overlap is the median over its
measured runs; the prediction is then made again with it, and says so (``overlap_source``).

An overlap above 1 cannot be: the model's all-reduce would last longer than the run's compute and exposed
communication together, the whole time it could have run in. The link's figures are then slower than the runs
(measured in a busy minute: on this project's 2-core machine the benchmark gave 8 ms for one study's gradients and
13 ms for the same gradients a few minutes later). Where the median run says so, `link_fit` gives the factor that
shrinks the link's all-reduce times to fit it (compute + exposed over the all-reduce, the median over the runs),
and the prediction is made with the link so scaled before the overlap is calibrated. Beside the runs
themselves such a prediction shows how far each is from the study's common overlap; what it predicts are the
scales not run. ``--overlap`` (the user's own figure) is never replaced.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["run_overlaps", "calibration", "link_fit", "overlap_source"]


def _measured_exposed_s(row: dict[str, Any]) -> float | None:
    """A run's measured exposed communication in seconds per optimizer step (the baseline of one device has none)."""
    share = (row.get("loss_breakdown") or {}).get("exposed_comm")
    if share is None or not row.get("samples_per_s") or row.get("world_size", 1) < 2:
        return None
    samples_per_device_step = (row.get("per_device_batch") or 1) * (row.get("grad_accum_steps") or 1)
    return share * row["world_size"] / row["samples_per_s"] * samples_per_device_step


def _measured_cells(prediction: dict[str, Any], rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], float]]:
    """(run, its predicted cell, its measured exposed communication in seconds per step) for each multi-device run
    the prediction modelled and the run measured."""
    # a cell whose batch the study would refuse (`predict.cell_batch`) has no compute to calibrate against
    cells = {c["name"]: c for c in prediction.get("cells") or [] if c.get("run", True) and c.get("compute_s") is not None}
    found = []
    for row in rows:
        cell, exposed = cells.get(row["name"]), _measured_exposed_s(row)
        if cell is not None and exposed is not None:
            found.append((row["name"], cell, exposed))
    return found


def run_overlaps(prediction: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each measured multi-device run's overlap: the one at which the model's exposed communication is the run's."""
    return {name: min(max((cell["comm_s"] - exposed) / cell["compute_s"], 0.0), 1.0)
            for name, cell, exposed in _measured_cells(prediction, rows) if cell.get("compute_s")}


def link_fit(prediction: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
    """The factor (below 1) by which the link's all-reduce times must shrink to fit the measured runs, where the
    median run's all-reduce as modelled outlasts its compute and exposed communication together; else None."""
    fits = [(cell.get("compute_s", 0.0) + exposed) / cell["comm_s"]
            for _, cell, exposed in _measured_cells(prediction, rows) if cell.get("comm_s")]
    if not fits or statistics.median(fits) >= 1.0:
        return None
    return statistics.median(fits)


def calibration(prediction: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[float, str] | None:
    """The study's calibrated overlap (the median of `run_overlaps`) and where it came from, in words; None where
    no run measured its exposed communication."""
    overlaps = run_overlaps(prediction, rows)
    return (statistics.median(overlaps.values()), overlap_source(overlaps)) if overlaps else None


def overlap_source(overlaps: dict[str, float]) -> str:
    """Where a calibrated overlap came from, in words, for the report's prediction facts."""
    each = ", ".join(f"{name} {value:.2f}" for name, value in sorted(overlaps.items()))
    runs = "run" if len(overlaps) == 1 else "runs"
    return (f"calibrated on the study's {len(overlaps)} measured {runs} (the median of {each}): beside those runs the "
            "prediction shows how far each is from it; it predicts the scales not run")
