"""The probe: measure a training script nobody changed (plain DDP, Accelerate, Lightning, the HF Trainer).

    gpuscale run --nproc-per-node 2 --summary runs/ddp train.py     # runs/ddp/summary.json, measured by the probe
    gpuscale study --nproc 1,2 --global-batch 64 --out runs/s -- train.py --batch-size {per_device_batch}

How it gets in: the launcher (`gpuscale run`, a study cell, a study's SLURM job) puts `SITE_DIR`
first on the workers' PYTHONPATH and names a records folder in GPUSCALE_PROBE_DIR. Python imports
``sitecustomize`` from there at start-up, in every rank, under torchrun and srun alike; once the
script imports torch, `recorder` hooks torch's optimizer steps and DataLoader iterators, and at
exit each rank writes ``rank-<RANK>.json`` (however it exits, with no collective). The launcher
then merges the records (`merge`) into ``summary.json`` and ``timeline.json``, in the format
`gpuscale.Meter` writes, marked ``"measured_by": "probe"``. A script that uses gpuscale.Meter
measures itself and is left to it. ``GPUSCALE_PROBE=0`` turns the probe off.

Who sets GPUSCALE_PROBE_DIR merges: `gpuscale run` when it sets it (a study cell sets it itself,
and merges after the cell, also after a SLURM job).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuscale.base.files import write_or_keep
from gpuscale.measure.probe.merge import merge_records

__all__ = ["SITE_DIR", "RECORDS", "SUMMARY", "INCOMPLETE_SUMMARY", "probe_enabled", "site_environ", "probe_environ", "read_records",
           "summary_name", "collect", "measured_by_meter", "describe"]

SITE_DIR = str(Path(__file__).resolve().parent / "site")
"""The folder holding the probe's sitecustomize.py: first on a worker's PYTHONPATH, it loads the probe."""
RECORDS = "probe"
"""The folder of rank records inside a run's or a study cell's folder (``probe/rank-<RANK>.json``)."""
SUMMARY = "summary.json"
"""A run's summary: a Meter's, or the probe's merge of a complete run."""
INCOMPLETE_SUMMARY = "summary-incomplete.json"
"""The probe's merge of a run that failed or lost a rank (never taken for a result)."""


def probe_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """False when GPUSCALE_PROBE=0; True when it is 1 or unset."""
    value = environ.get("GPUSCALE_PROBE", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"GPUSCALE_PROBE={value!r} is not 0 or 1; set GPUSCALE_PROBE=0 to turn the probe off")
    return value != "0"


def site_environ(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """PYTHONPATH with `SITE_DIR` first: gpuscale's start-up hook loads in every process started with it (it places
    a rank and ends its process group cleanly; it records only where GPUSCALE_PROBE_DIR names a folder)."""
    path = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    return {"PYTHONPATH": os.pathsep.join([SITE_DIR, *path])}


def probe_environ(records_dir: str | os.PathLike[str], environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables that load the probe in every worker started with them (PYTHONPATH, GPUSCALE_PROBE_DIR)."""
    return {**site_environ(environ), "GPUSCALE_PROBE_DIR": os.fspath(records_dir)}


def read_records(records_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rank records in `records_dir` (a damaged one is skipped: its rank counts as missing)."""
    records = []
    for path in sorted(Path(records_dir).glob("rank-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            records.append(record)
    return records


def summary_name(summary: Mapping[str, Any]) -> str:
    """The file a merged summary goes to: summary.json only when it is complete.

    Whatever reads a run's summary.json (a study's table, `gpuscale predict`) can then trust it; what a
    failed run measured is kept beside it in summary-incomplete.json, with `probe.why`.
    """
    return SUMMARY if summary.get("complete") else INCOMPLETE_SUMMARY


def collect(records_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None, *, world_size: int | None = None,
            scaling: str | None = None, failure: str | None = None, step_samples: int | None = None) -> dict[str, Any] | None:
    """Merge the records of one run; write timeline.json and the summary into `out_dir` (if given), as
    summary.json when the run is complete, else as summary-incomplete.json (the other one is removed), but for a run
    that took no optimizer step where `out_dir` holds the summary.json of a run that trained: that stands, and the
    summary returned (the one kept where it is of the same experiment, else this run's) carries ``kept``, the line
    that says so (`gpuscale.base.files.write_or_keep`).

    None when there is nothing to merge: no rank left a record (the probe was off, or the script
    never imported torch), or the script measured itself with gpuscale.Meter (its summary stays).
    """
    records = read_records(records_dir)
    if not records or any(r.get("meter") for r in records):
        return None
    summary, timeline = merge_records(records, world_size=world_size, scaling=scaling, failure=failure,
                                      step_samples=step_samples)
    if out_dir is not None:
        name = summary_name(summary)
        outcome = write_or_keep(out_dir, summary, timeline, name)
        if outcome.written:
            stale = INCOMPLETE_SUMMARY if name == SUMMARY else SUMMARY  # an earlier run's, in the same folder
            (Path(out_dir) / stale).unlink(missing_ok=True)
        else:
            return {**outcome.summary, "kept": outcome.line}
    return summary


def measured_by_meter(records_dir: str | os.PathLike[str]) -> bool:
    """Whether the script measured itself with a gpuscale.Meter (its summary is where the Meter writes it)."""
    return any(r.get("meter") for r in read_records(records_dir))


def _slow_rank(summary: dict[str, Any]) -> str:
    """The imbalance's persistent part, with the rank that is slower on average, and its jitter (`stepsplit`)."""
    per_step, slow = summary.get("step_breakdown_s") or {}, (summary.get("sync_probe") or {}).get("slow_rank")
    if not per_step.get("imbalance") or per_step.get("jitter") is None:
        return ""
    persistent = per_step["persistent_imbalance"] / per_step["imbalance"]
    if slow is None or round(100 * persistent) == 0:
        return ": all of it jitter, no rank slower on average"
    if round(100 * persistent) >= 100:
        return f": all of it rank {slow} slower on average, no jitter"
    return f": {100 * persistent:.0f}% of it rank {slow} slower on average, the rest jitter"


def describe(summary: dict[str, Any]) -> str:
    """What the probe measured, in a few lines for the end of `gpuscale run`."""
    world = summary["world_size"]
    head = f"{world} rank{'s' if world != 1 else ''}" + (f" ({summary['backend']})" if summary.get("backend") else "")
    counted = summary.get("samples_from")
    lines = [f"measured by the probe: {head}, {summary['steps']} optimizer steps"
             + (f", {summary['samples']} samples" if summary.get("samples") is not None else "")
             + (f" (counted from: {counted})" if counted and counted != "data loader" else "")]
    if summary.get("samples_per_s"):
        split = summary["time_split_s"]
        train = summary["samples"] / summary["samples_per_s"]

        def share(phase: str) -> str:
            return f"{100 * (split.get(phase) or 0.0) / train:.0f}%" if split.get(phase) is not None else "not measured"

        lines.append(f"  throughput {summary['samples_per_s']:.1f} samples/s over {train:.2f} s of training "
                     f"({1000 * summary['step_time_s']:.1f} ms per step: data wait {share('data_wait')}, exposed "
                     f"communication {share('exposed_comm')}, imbalance {share('imbalance')}{_slow_rank(summary)}); "
                     f"startup {split['startup']:.1f} s, evaluation {split['eval']:.1f} s, "
                     + (f"after training {split['after_training']:.1f} s, " if split.get("after_training") is not None else "")
                     + f"time to result {summary['time_to_result_s']:.1f} s")
    if world > 1 and (summary.get("probe") or {}).get("synchronised") is False:
        lines.append(f"  the {world} ranks trained independent copies of the model (none made a DDP model or joined a process "
                     f"group that communicates): the throughput is {world} copies', not one model's (docs/studies.md)")
    if not summary["complete"]:
        lines.append(f"  incomplete: {summary['probe']['why']}")
    return "\n".join(lines)
