"""From the runs' summaries to the study's table: speed-up, efficiency, and why not more. Pure.

    results = analyse(study_dir)          # reads study.json and each cell's summary.json
    results["rows"][i]["speedup"], ...    # the schema is in gpuscale.study's docstring

Weak scaling keeps each device's batch, so more devices do more work per step: its speed-up is
throughput (samples/s) over the baseline's. Strong scaling keeps the global batch, so the work is
fixed: its speed-up is the baseline's time for the same number of epochs over this run's. The
baseline is the smallest run of the same scaling. Efficiency = speed-up / (devices / baseline devices).

Flags say why a run got less than it could: a loader that starves the device (time waiting for
data), a device idle while others work (utilisation from the monitor), a step that grew with the
devices (communication not hidden behind compute), an accuracy that moved with the global batch.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuscale.study.matrix import SCALINGS, Cell
from gpuscale.study.runner import STUDY_FILE, cell_from_entry, read_study, read_summary

STARVED_FRACTION = 0.2
"""Waiting for data longer than this share of training time flags a starving loader."""
UNDERUSED_RATIO = 0.5
"""A device busy less than this share of the busiest device's utilisation is flagged as under-used."""
BUSY_PCT = 30.0
"""...provided the busiest device is above this, so that a uniformly idle run is not misread."""
ACCURACY_DROP = 0.02
SPREAD = 0.1
"""Repeated runs whose throughput spreads over more than this share of the median are flagged."""


def _metric(summary: dict[str, Any]) -> tuple[str | None, float | None]:
    for name in ("accuracy", "perplexity"):
        if summary.get(name) is not None:
            return name, float(summary[name])
    return None, None


def median_runs(finished: list[tuple[Cell, dict[str, Any]]]) -> list[tuple[Cell, dict[str, Any], list[float]]]:
    """One entry per cell over its repeats: the run with the median throughput, and every run's throughput.

    The median run stands for the cell whole (its time split, accuracy and timeline belong to one
    real run); with an even count the slower of the two middle runs is taken.
    """
    groups: dict[str, list[tuple[Cell, dict[str, Any]]]] = {}
    for cell, summary in finished:
        groups.setdefault(cell.base_name, []).append((cell, summary))
    chosen = []
    for runs in groups.values():
        ordered = sorted(runs, key=lambda run: run[1]["samples_per_s"])
        cell, summary = ordered[(len(ordered) - 1) // 2]
        chosen.append((cell, summary, [run[1]["samples_per_s"] for run in ordered]))
    return chosen


def row_from_summary(cell: Cell, summary: dict[str, Any], study_dir: Path, runs: list[float] | None = None) -> dict[str, Any]:
    """One table row from a run's summary (speed-up and efficiency filled in later)."""
    metric, value = _metric(summary)
    timeline = Path(cell.name) / "timeline.json"
    return {
        "name": cell.base_name, "run": cell.name, "repeats": len(runs or [0]),
        "samples_per_s_runs": runs or [summary["samples_per_s"]], "variant": cell.variant, "scaling": cell.scaling, "nodes": cell.nodes, "nproc_per_node": cell.nproc_per_node,
        "world_size": summary["world_size"], "global_batch": summary.get("global_batch"),
        "per_device_batch": summary.get("per_device_batch"), "epochs": summary.get("epochs"),
        "steps": summary.get("steps"), "samples": summary.get("samples"),
        "samples_per_s": summary["samples_per_s"], "train_time_s": summary["train_time_s"],
        "step_time_s": summary.get("step_time_s"), "time_split_s": summary.get("time_split_s", {}),
        "gradient_bytes": summary.get("gradient_bytes"),
        "speedup": None, "efficiency": None, "metric": metric, "metric_value": value,
        "final_loss": summary.get("final_loss"), "predicted_samples_per_s": None, "predicted_efficiency": None,
        "utilisation": summary.get("utilisation"),
        "timeline": str(timeline) if (study_dir / timeline).is_file() else None,
        "flags": [],
    }


def _speedup(row: dict[str, Any], base: dict[str, Any]) -> float:
    if row["scaling"] == "weak":
        return row["samples_per_s"] / base["samples_per_s"]
    # strong: the same work, so time for the same epochs (per epoch when the epoch counts differ)
    base_time = base["train_time_s"] / max(base["epochs"] or 1, 1)
    time = row["train_time_s"] / max(row["epochs"] or 1, 1)
    return base_time / time


def _devices(n: int) -> str:
    return f"{n} device" if n == 1 else f"{n} devices"


def _flags(row: dict[str, Any], base: dict[str, Any], device: str) -> list[str]:
    flags = []
    split = row["time_split_s"] or {}
    training = split.get("data_wait", 0.0) + split.get("compute", 0.0)
    waited = split.get("data_wait", 0.0) / training if training > 0 else 0.0
    if waited > STARVED_FRACTION and device == "cpu":
        flags.append(f"spent {100 * waited:.0f}% of its training time loading data: on CPUs the loader shares the cores "
                     "with training; keep small data sets decoded in memory, or give loading cores of its own")
    elif waited > STARVED_FRACTION:
        flags.append(f"waited for data {100 * waited:.0f}% of its training time: the loader starves the GPU; give the "
                     "DataLoader more workers (num_workers, cores next to the GPU), pin memory, or read faster storage")
    runs = row.get("samples_per_s_runs") or []
    if len(runs) > 1 and (max(runs) - min(runs)) / row["samples_per_s"] > SPREAD:
        flags.append(f"its {len(runs)} runs spread over {100 * (max(runs) - min(runs)) / row['samples_per_s']:.0f}% of the median "
                     "throughput: the machine is noisy (shared nodes, frequency scaling); trust only larger differences")
    devices = [d for d in ((row.get("utilisation") or {}).get("devices") or []) if d.get("util_mean") is not None]
    if len(devices) > 1:
        busiest = max(devices, key=lambda d: d["util_mean"])
        if busiest["util_mean"] >= BUSY_PCT:
            for d in devices:
                if d["util_mean"] < UNDERUSED_RATIO * busiest["util_mean"]:
                    flags.append(f"rank {d['rank']} ({d.get('device')} on {d.get('host')}) was busy {d['util_mean']:.0f}% "
                                 f"while rank {busiest['rank']} was busy {busiest['util_mean']:.0f}%: an idle or under-used "
                                 "device (uneven shards, work on one rank only, or a rank waiting on the others)")
    elif len(devices) == 1 and device == "cuda" and devices[0]["util_mean"] < BUSY_PCT:
        flags.append(f"the GPU was busy only {devices[0]['util_mean']:.0f}% of the time: a larger batch, more loader "
                     "workers, or less host-side work per step")
    if row is base:
        return flags
    if row["scaling"] == "weak" and row.get("step_time_s") and base.get("step_time_s"):
        growth = row["step_time_s"] / base["step_time_s"] - 1
        if growth > 0.1:
            flags.append(f"a step took {100 * growth:.0f}% longer than on {_devices(base['world_size'])} for the same "
                         "per-device batch: synchronisation not hidden behind compute, or devices sharing memory "
                         "bandwidth (see the prediction)")
    if row["metric"] == "accuracy" and base["metric_value"] is not None and row["metric_value"] is not None \
            and base["metric_value"] - row["metric_value"] > ACCURACY_DROP:
        text = f"accuracy {row['metric_value']:.3f} against {base['metric_value']:.3f} on {_devices(base['world_size'])}"
        if row["global_batch"] != base["global_batch"]:
            text += (f": the global batch is {row['global_batch']} instead of {base['global_batch']}, so there are fewer "
                     "steps; scale the learning rate with the batch, train more epochs, or use strong scaling")
        flags.append(text)
    return flags


def analyse_rows(rows: list[dict[str, Any]], device: str = "cpu") -> dict[str, str]:
    """Fill in speed-up, efficiency and flags (in place); return the baseline run of each scaling (and variant).

    Baselines are keyed 'weak' / 'strong', or 'VARIANT/weak' when the study has variants.
    """
    baselines: dict[str, str] = {}
    for variant, scaling in sorted({(r.get("variant", ""), r["scaling"]) for r in rows}):
        group = sorted((r for r in rows if r["scaling"] == scaling and r.get("variant", "") == variant),
                       key=lambda r: (r["world_size"], r["nodes"]))
        base = group[0]
        baselines[f"{variant}/{scaling}" if variant else scaling] = base["name"]
        for row in group:
            row["speedup"] = _speedup(row, base)
            row["efficiency"] = row["speedup"] / (row["world_size"] / base["world_size"])
            row["flags"] = _flags(row, base, device)
    return baselines


def load_cells(study_dir: Path) -> tuple[dict[str, Any], list[tuple[Cell, dict[str, Any]]]]:
    """study.json and the finished cells with their summaries."""
    path = study_dir / STUDY_FILE
    if not path.is_file():
        raise ValueError(f"{study_dir} is not a study directory (no {STUDY_FILE}); run `gpuscale study --out {study_dir} -- SCRIPT` first")
    study = read_study(study_dir)
    finished = []
    for entry in study.get("cells", []):
        cell = cell_from_entry(entry)
        summary = read_summary(study_dir / cell.name, cell)
        if summary is not None:
            finished.append((cell, summary))
    return study, finished


def analyse(study_dir: Path, prediction: dict[str, Any] | None = None) -> dict[str, Any]:
    """The study's results (gpuscale.study's schema) from what is on disk."""
    study, finished = load_cells(study_dir)
    rows = [row_from_summary(cell, summary, study_dir, runs) for cell, summary, runs in median_runs(finished)]
    variants = list(dict.fromkeys(c.variant for c, _ in finished))  # in the order they were asked for
    rows.sort(key=lambda r: (variants.index(r["variant"]), SCALINGS.index(r["scaling"]), r["world_size"], r["nodes"]))
    first = finished[0][1] if finished else {}
    device = first.get("device", "cpu")
    baselines = analyse_rows(rows, device)
    if prediction is not None:
        by_name = {p["name"]: p for p in prediction.get("cells", [])}
        for row in rows:
            if row["name"] in by_name:
                row["predicted_samples_per_s"] = by_name[row["name"]]["samples_per_s"]
                row["predicted_efficiency"] = by_name[row["name"]]["efficiency"]
    return {
        "version": 1, "command": study.get("command", []), "launcher": study.get("launcher"),
        "device": device, "device_name": first.get("device_name"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "rows": rows, "baseline": baselines, "prediction": prediction,
    }
