"""From the runs' summaries to the study's table: speed-up, efficiency, and why not more. Pure.

    results = analyse(study_dir)          # reads study.json and each cell's summary.json
    results["rows"][i]["speedup"], ...    # the schema is in gpuscale.study's docstring

One basis for both scalings: training throughput, samples per second of optimizer steps (data
waits included; evaluation, checkpoints and the sync probe's replays excluded), the quantity the
prediction models too. Speed-up = throughput / the baseline's (the smallest run of the same
scaling and variant); efficiency = speed-up / (devices / the baseline's devices), i.e. throughput
over ideal, ideal being the baseline's throughput per device times the devices. Weak and strong
scaling differ in what they keep (the per-device batch, or the global batch), not in the formula.

Time to result is a second, separately labelled basis: the whole run (startup, training,
evaluation, checkpoints, probes) for the same epochs; its speed-up is the baseline's time over
this run's (per epoch when the epoch counts differ).

Why not more: `breakdown` splits each run's lost efficiency (1 - efficiency, in % of ideal) into
measured parts, each the growth against the baseline of a per-sample time (seconds per sample on
one device; `gpuscale.stepsplit` gives the per-step parts):

    data          more loader wait per sample than the baseline (the reference rank's)
    exposed_comm  synchronisation that compute did not hide (sync probe)
    imbalance     the fastest rank waiting for the slowest (sync probe)
    compute       forward and backward per sample grew (smaller per-device batches, shared caches)
    rest          what no measurement explains (optimizer step, the loop's host work, noise)

    share(part) = (part per sample - the baseline's) / this run's time per sample

so the shares add up to 1 - efficiency exactly ("rest" takes what the others leave). A part that
was not measured (the probe off, or a strategy it cannot measure) is None and falls into "rest".

Flags say why a run got less than it could, each with its unit and denominator.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuscale.study.experiments import check_experiments, group_key, missing_baseline_note, planned_baselines
from gpuscale.study.matrix import SCALINGS, Cell
from gpuscale.study.runner import STUDY_FILE, cell_from_entry, read_study, read_summary

RESULTS_VERSION = 2
PARTS = ("data", "exposed_comm", "imbalance", "compute", "rest")
"""The parts of lost efficiency, in the order the table, the report and the waterfall show them."""
PART_LABELS = {"data": "data", "exposed_comm": "exposed communication", "imbalance": "imbalance",
               "compute": "per-device compute", "rest": "rest (unexplained)"}

STARVED_FRACTION = 0.2
"""Waiting for data longer than this share of training time flags a starving loader."""
UNDERUSED_RATIO = 0.5
"""A device busy less than this share of the busiest device's utilisation is flagged as under-used."""
BUSY_PCT = 30.0
"""...provided the busiest device is above this, so that a uniformly idle run is not misread."""
ACCURACY_DROP = 0.02
SPREAD = 0.1
"""Repeated runs whose throughput spreads over more than this share of the median are flagged."""
PART_FLAG = 0.1
"""A part of lost efficiency above this share of ideal throughput (and beyond the noise) gets a flag with its fix."""
NOISE_FLOOR = 0.03
"""The least noise a comparison of two runs is taken to have, as a share of ideal throughput: a part of lost
efficiency within the noise reads "~0%". With --repeat, the spread of the runs' throughput raises it."""


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


def _time_to_result(summary: dict[str, Any]) -> float:
    """The whole run in seconds: startup + training + evaluation + checkpoints (+ probes).

    Summaries of gpuscale before 0.2 have no time_to_result_s: startup + train_time_s is the same sum."""
    if summary.get("time_to_result_s") is not None:
        return float(summary["time_to_result_s"])
    return float((summary.get("time_split_s") or {}).get("startup") or 0.0) + float(summary["train_time_s"])


def _lr(summary: dict[str, Any]) -> dict[str, Any] | None:
    lr = summary.get("lr")
    return lr if isinstance(lr, dict) and isinstance(lr.get("rule"), str) else None


def row_from_summary(cell: Cell, summary: dict[str, Any], study_dir: Path, runs: list[float] | None = None) -> dict[str, Any]:
    """One table row from a run's summary (speed-up, efficiency, breakdown and flags filled in later)."""
    metric, value = _metric(summary)
    timeline = Path(cell.name) / "timeline.json"
    return {
        "name": cell.base_name, "run": cell.name, "repeats": len(runs or [0]),
        "samples_per_s_runs": runs or [summary["samples_per_s"]], "variant": cell.variant, "scaling": cell.scaling,
        "nodes": cell.nodes, "nproc_per_node": cell.nproc_per_node,
        "world_size": summary["world_size"], "device": summary.get("device"), "strategy": summary.get("strategy"),
        "global_batch": summary.get("global_batch"), "per_device_batch": summary.get("per_device_batch"),
        "grad_accum_steps": summary.get("grad_accum_steps") or 1, "epochs": summary.get("epochs"),
        "steps": summary.get("steps"), "samples": summary.get("samples"),
        "samples_per_s": summary["samples_per_s"], "train_time_s": summary["train_time_s"],
        "time_to_result_s": _time_to_result(summary),
        "step_time_s": summary.get("step_time_s"), "time_split_s": summary.get("time_split_s") or {},
        "step_breakdown_s": summary.get("step_breakdown_s"), "sync_probe": summary.get("sync_probe"),
        "measured_by": summary.get("measured_by") or "meter",
        "not_measured": (summary.get("probe") or {}).get("not_measured") or [],
        "gradient_bytes": summary.get("gradient_bytes"),
        "samples_from": summary.get("samples_from"), "synchronised": (summary.get("probe") or {}).get("synchronised"),
        "planned_per_device_batch": None,
        "ideal_samples_per_s": None, "speedup": None, "efficiency": None,
        "time_speedup": None, "loss_breakdown": None, "predicted_breakdown": None,
        "metric": metric, "metric_value": value, "lr": _lr(summary), "per_epoch": summary.get("per_epoch"),
        "final_loss": summary.get("final_loss"), "predicted_samples_per_s": None, "predicted_efficiency": None,
        "utilisation": summary.get("utilisation"),
        "timeline": str(timeline) if (study_dir / timeline).is_file() else None,
        "flags": [],
    }


def _per_epoch(row: dict[str, Any], key: str) -> float:
    return row[key] / max(row.get("epochs") or 1, 1)


def _samples_per_device_step(row: dict[str, Any]) -> int:
    return (row.get("per_device_batch") or 1) * (row.get("grad_accum_steps") or 1)


def _parts_per_sample(row: dict[str, Any]) -> dict[str, float | None]:
    """The measured per-step parts of a row (`gpuscale.stepsplit`), in seconds per sample on one device."""
    per_step = row.get("step_breakdown_s") or {}
    samples = _samples_per_device_step(row)
    names = {"data": "data_wait", "exposed_comm": "exposed_comm", "imbalance": "imbalance", "compute": "compute"}
    return {part: None if per_step.get(key) is None else per_step[key] / samples for part, key in names.items()}


def breakdown(row: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    """Lost efficiency split into `PARTS`, each a fraction of ideal throughput (see the module docstring).

    The shares add up to 1 - efficiency; a part without a measurement on either side is None and
    counted in "rest". The baseline's own row is all zeros.
    """
    if row is base:
        return {part: 0.0 for part in PARTS}
    t = row["world_size"] / row["samples_per_s"]  # seconds per sample on one device
    t0 = base["world_size"] / base["samples_per_s"]
    mine, theirs = _parts_per_sample(row), _parts_per_sample(base)
    shares: dict[str, float | None] = {}
    for part in PARTS[:-1]:
        a, b = mine[part], theirs[part]
        shares[part] = None if a is None or b is None else (a - b) / t
    shares["rest"] = (t - t0) / t - sum(v for v in shares.values() if v is not None)
    return shares


def _spread(row: dict[str, Any]) -> float:
    runs = row.get("samples_per_s_runs") or []
    return (max(runs) - min(runs)) / row["samples_per_s"] if len(runs) > 1 and row["samples_per_s"] else 0.0


def noise(row: dict[str, Any], base: dict[str, Any]) -> float:
    """How far a part of `row`'s lost efficiency may be from zero by chance, as a share of ideal throughput: the
    spread of the repeated runs' throughput of the row or its baseline (--repeat), at least NOISE_FLOOR."""
    return max(NOISE_FLOOR, _spread(row), _spread(base))


def predicted_breakdown(cell: dict[str, Any] | None) -> dict[str, float | None] | None:
    """The prediction's parts, as fractions of ideal: the model has only exposed communication
    (compute per sample is assumed constant: 0); data, imbalance and the rest it does not model (None)."""
    if not cell or not cell.get("step_time_s"):
        return None
    return {"data": None, "exposed_comm": cell["exposed_comm_s"] / cell["step_time_s"], "imbalance": None,
            "compute": 0.0, "rest": None}


def _devices(n: int) -> str:
    return f"{n} device" if n == 1 else f"{n} devices"


def _training_time(row: dict[str, Any]) -> float:
    split = row["time_split_s"] or {}
    return sum(float(split.get(k) or 0.0) for k in ("data_wait", "compute", "exposed_comm", "imbalance"))


def _data_flag(row: dict[str, Any], device: str) -> list[str]:
    split = row["time_split_s"] or {}
    training = _training_time(row)
    waited = float(split.get("data_wait") or 0.0) / training if training > 0 else 0.0
    if waited <= STARVED_FRACTION:
        return []
    text = f"waited for data {100 * waited:.0f}% of its training time (data wait / training time, both in the time split)"
    if device == "cpu":
        return [text + ": on CPUs the loader shares the cores with training; keep small data sets decoded in memory, "
                "or give loading cores of its own"]
    return [text + ": the loader starves the GPU; give the DataLoader more workers (num_workers, cores next to the "
            "GPU), pin memory, or read faster storage"]


def _utilisation_flags(row: dict[str, Any], device: str) -> list[str]:
    flags = []
    devices = [d for d in ((row.get("utilisation") or {}).get("devices") or []) if d.get("util_mean") is not None]
    if len(devices) > 1:
        busiest = max(devices, key=lambda d: d["util_mean"])
        if busiest["util_mean"] >= BUSY_PCT:
            for d in devices:
                if d["util_mean"] < UNDERUSED_RATIO * busiest["util_mean"]:
                    unit = "of its cores" if str(d.get("device") or "cpu").startswith("cpu") else "of the time (GPU)"
                    flags.append(f"rank {d['rank']} ({d.get('device')} on {d.get('host')}) was busy {d['util_mean']:.0f}% {unit} "
                                 f"while rank {busiest['rank']} was busy {busiest['util_mean']:.0f}%: an idle or under-used "
                                 "device (uneven shards, work on one rank only, or a rank waiting on the others)")
    elif len(devices) == 1 and device == "cuda" and devices[0]["util_mean"] < BUSY_PCT:
        flags.append(f"the GPU was busy only {devices[0]['util_mean']:.0f}% of the time: a larger batch, more loader "
                     "workers, or less host-side work per step")
    return flags


_PART_FIXES = {
    "data": "the loader keeps up less well than on the baseline: more loader workers per rank, data decoded once, faster storage",
    "exposed_comm": "gradient synchronisation is not hidden behind compute: a larger per-device batch, gradient "
                    "accumulation (fewer all-reduces per sample), a faster interconnect (see the prediction)",
    "imbalance": "one rank sets the pace (see the per-rank waits in summary.json's ranks): uneven shards or loader "
                 "workers, a rank doing extra work (logging, evaluation on rank 0 only), a slower device",
    "compute": "each device computes a sample more slowly than the baseline did: under strong scaling the per-device "
               "batch shrank (less efficient kernels); devices may share caches or memory bandwidth",
    "rest": "not explained by the measured parts: host-side work per step (the optimizer step, logging, metrics that "
            "synchronise), or noise (--repeat 3)",
}


def _breakdown_flags(row: dict[str, Any]) -> list[str]:
    shares = row.get("loss_breakdown") or {}
    if all(shares.get(part) is None for part in PARTS[:-1]):
        return []  # nothing measured the causes: "rest" would be all of the loss, not an unexplained remainder
    threshold = max(PART_FLAG, row.get("noise") or NOISE_FLOOR)
    return [f"lost {100 * share:.0f}% of ideal throughput to {PART_LABELS[part]}: {_PART_FIXES[part]}"
            for part, share in shares.items() if share is not None and share > threshold]


def _phase_of_gap(row: dict[str, Any], base: dict[str, Any], key: str) -> str | None:
    """Where the validation metric first fell behind the baseline's by more than ACCURACY_DROP: "in phase P (epoch E: a vs b)"."""
    mine, theirs = row.get("per_epoch") or [], base.get("per_epoch") or []
    for a, b in zip(mine, theirs):
        if not (isinstance(a, dict) and isinstance(b, dict)) or a.get(key) is None or b.get(key) is None:
            continue
        if b[key] - a[key] > ACCURACY_DROP:
            phase = f"in phase '{a['phase']}' " if a.get("phase") else ""
            return f"{phase}(epoch {a.get('epoch', '?')}: validation {a[key]:.3f} against {b[key]:.3f})"
    return None


def _rule(row: dict[str, Any]) -> str:
    lr = row.get("lr")
    return f"lr rule '{lr['rule']}'" if lr else "no lr rule recorded"


def _accuracy_flags(row: dict[str, Any], base: dict[str, Any]) -> list[str]:
    if row["metric"] != "accuracy" or base["metric_value"] is None or row["metric_value"] is None \
            or base["metric_value"] - row["metric_value"] <= ACCURACY_DROP:
        return []
    text = (f"accuracy {row['metric_value']:.3f} against {base['metric_value']:.3f} on {_devices(base['world_size'])} "
            f"({_rule(row)})")
    gap = _phase_of_gap(row, base, "val_accuracy")
    if gap:
        text += f"; it fell behind {gap}"
    if row["global_batch"] != base["global_batch"]:
        text += (f"; the global batch is {row['global_batch']} instead of {base['global_batch']}, so there are fewer "
                 "steps per epoch")
        if not row.get("lr") or row["lr"]["rule"] == "none":
            text += ": scale the learning rate with the batch (--lr-scaling linear, with warm-up), or use strong scaling"
        else:
            text += ": try more epochs or a longer warm-up (--lr-warmup-steps)"
    return [text]


def _flags(row: dict[str, Any], base: dict[str, Any], device: str) -> list[str]:
    flags = _data_flag(row, device)
    runs = row.get("samples_per_s_runs") or []
    if len(runs) > 1 and (max(runs) - min(runs)) / row["samples_per_s"] > SPREAD:
        flags.append(f"its {len(runs)} runs spread over {100 * (max(runs) - min(runs)) / row['samples_per_s']:.0f}% of the median "
                     "throughput: the machine is noisy (shared nodes, frequency scaling); trust only larger differences")
    flags += _utilisation_flags(row, device)
    if row is base:
        return flags
    return flags + _breakdown_flags(row) + _accuracy_flags(row, base)


def analyse_rows(rows: list[dict[str, Any]], device: str = "cpu", planned: dict[str, str] | None = None) -> dict[str, str]:
    """Fill in speed-ups, efficiency, the breakdown and flags (in place); return the baseline run of each
    scaling (and variant), keyed by `group_key`. A scaling whose planned baseline (`planned`: the smallest cell,
    `planned_baselines`) did not finish has none: its runs keep their own measurements only (no speed-up,
    efficiency or breakdown), since the next smallest run would pass for a perfect baseline."""
    baselines: dict[str, str] = {}
    for variant, scaling in sorted({(r.get("variant", ""), r["scaling"]) for r in rows}):
        group = sorted((r for r in rows if r["scaling"] == scaling and r.get("variant", "") == variant),
                       key=lambda r: (r["world_size"], r["nodes"]))
        base = group[0]
        if planned and planned.get(group_key(variant, scaling), base["name"]) != base["name"]:
            for row in group:
                row["flags"] = _flags(row, row, device)
            continue
        baselines[group_key(variant, scaling)] = base["name"]
        for row in group:
            if row["world_size"] > 1 and row["synchronised"] is False:  # independent copies: more samples/s, but not one training sped up
                row["flags"] = _flags(row, row, device)
                continue
            devices = row["world_size"] / base["world_size"]
            row["ideal_samples_per_s"] = base["samples_per_s"] * devices
            row["speedup"] = row["samples_per_s"] / base["samples_per_s"]
            row["efficiency"] = row["speedup"] / devices
            row["time_speedup"] = _per_epoch(base, "time_to_result_s") / _per_epoch(row, "time_to_result_s")
            row["loss_breakdown"] = breakdown(row, base)
            row["noise"] = noise(row, base)
            row["flags"] = _flags(row, base, device)
    return baselines


def compared_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a results.json that have a breakdown against a baseline (every row but the baselines)."""
    baselines = set((results.get("baseline") or {}).values())
    return [r for r in results["rows"]
            if r["name"] not in baselines and r.get("loss_breakdown") and r.get("efficiency") is not None]


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


def attach_prediction(rows: list[dict[str, Any]], prediction: dict[str, Any]) -> None:
    """Put each predicted cell's throughput, efficiency and parts beside its row (in place)."""
    by_name = {p["name"]: p for p in prediction.get("cells", [])}
    for row in rows:
        cell = by_name.get(row["name"])
        if cell is None:
            continue
        row["predicted_samples_per_s"] = cell["samples_per_s"]
        row["predicted_efficiency"] = cell["efficiency"]
        row["predicted_breakdown"] = predicted_breakdown(cell) if row["world_size"] > 1 else None


def analyse(study_dir: Path, prediction: dict[str, Any] | None = None) -> dict[str, Any]:
    """The study's results (gpuscale.study's schema) from what is on disk."""
    study, finished = load_cells(study_dir)
    rows = [row_from_summary(cell, summary, study_dir, runs) for cell, summary, runs in median_runs(finished)]
    variants = list(dict.fromkeys(c.variant for c, _ in finished))  # in the order they were asked for
    rows.sort(key=lambda r: (variants.index(r["variant"]), SCALINGS.index(r["scaling"]), r["world_size"], r["nodes"]))
    first = finished[0][1] if finished else {}
    device = first.get("device", "cpu")
    cells = [cell_from_entry(entry) for entry in study.get("cells", [])]
    planned = planned_baselines(cells)
    checks = check_experiments(rows, study, cells)
    baselines = analyse_rows(rows, device, planned)
    missing = {key: name for key, name in planned.items() if key not in baselines}
    if prediction is not None:
        attach_prediction(rows, prediction)
    return {
        "version": RESULTS_VERSION, "command": study.get("command", []), "launcher": study.get("launcher"),
        "device": device, "device_name": first.get("device_name"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "rows": rows, "baseline": baselines, "missing_baseline": missing, "prediction": prediction,
        "notes": checks + [missing_baseline_note(key, name) for key, name in missing.items()
                           if any(group_key(r["variant"], r["scaling"]) == key for r in rows)],
    }
