"""From the runs' summaries to the study's table: speed-up, efficiency, and why not more. Pure.

    results = analyse(study_dir)          # reads study.json, each cell's summary.json, results.json's prediction
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
one device; `gpuscale.measure.stepsplit` gives the per-step parts):

    data          more loader wait per sample than the baseline (the reference rank's)
    exposed_comm  synchronisation that compute did not hide (sync probe), and the backward it slowed
    imbalance     the fastest rank waiting for a rank that is slower on average (sync probe; the rank named)
    jitter        the fastest rank waiting where which rank lags changes from step to step
    compute       forward and backward per sample grew (smaller per-device batches, shared caches)
    rest          what no measurement explains (optimizer step, the loop's host work, noise)

Communication that runs beside the backward and slows it (gloo's threads on the cores the backward uses, NCCL's
kernels on the SMs) is communication, not compute. The sync probe's replays leave it out of compute by themselves
(the replay does not synchronise). DDP's timers, for a script the probe measures, time the slowed backward:
there the step's split (`gpuscale.measure.stepsplit`) measures the slowdown against the run's own fastest
backward passes and puts it in exposed communication (``step_breakdown_s.comm_slowdown``, the row's
``comm_slowdown_s``).

    share(part) = (part per sample - the baseline's) / this run's time per sample

so the shares add up to 1 - efficiency exactly ("rest" takes what the others leave). A part that
was not measured (the probe off, or a strategy it cannot measure) is None and falls into "rest".

Flags say why a run got less than it could, each with its unit and denominator (`gpuscale.study.flags`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from gpuscale.study import otherload
from gpuscale.study.answer import TARGET_EFFICIENCY, answer, check_target
from gpuscale.study.cost import add_cost
from gpuscale.study.experiments import check_experiments, group_key, missing_baseline_note, planned_baselines
from gpuscale.study.flags import row_flags, set_flags, spread
from gpuscale.study.matrix import SCALINGS, Cell
from gpuscale.study.parts import NOISE_FLOOR, PARTS
from gpuscale.study.parts import PART_LABELS as PART_LABELS  # re-exported: the report imports it from here
from gpuscale.study.runner import STUDY_FILE, cell_from_entry, read_billing, read_study, read_summary, study_created
from gpuscale.study.saved import RESULTS_FILE as RESULTS_FILE  # re-exported: the CLI writes it
from gpuscale.study.saved import SAVED, saved_results, study_target

RESULTS_VERSION = 2


def _metric(summary: dict[str, Any]) -> tuple[str | None, float | None]:
    for name in ("accuracy", "perplexity"):
        if summary.get(name) is not None:
            return name, float(summary[name])
    return None, None


def median_runs(finished: list[tuple[Cell, dict[str, Any]]]) -> list[tuple[Cell, dict[str, Any], list[dict[str, Any]]]]:
    """One entry per cell over its repeats: the run with the median throughput, and every run's summary, slowest first.

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
        chosen.append((cell, summary, [run[1] for run in ordered]))
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


def row_from_summary(cell: Cell, summary: dict[str, Any], study_dir: Path, runs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One table row from a run's summary (speed-up, efficiency, breakdown and flags filled in later); `runs`: the
    summaries of all its repeats (`median_runs`), the run's alone where None."""
    metric, value = _metric(summary)
    runs = runs or [summary]
    timeline = Path(cell.name) / "timeline.json"
    return {
        "name": cell.base_name, "run": cell.name, "repeats": len(runs),
        "samples_per_s_runs": [run["samples_per_s"] for run in runs],
        "step_breakdown_s_runs": [run.get("step_breakdown_s") for run in runs], "variant": cell.variant, "scaling": cell.scaling,
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
        "same_as": summary.get("same_as"), "samples_from": summary.get("samples_from"),
        "synchronised": (summary.get("probe") or {}).get("synchronised"),
        "libraries": (summary.get("probe") or {}).get("libraries"),
        "planned_per_device_batch": None, "device_hours_per_m_samples": None, "device_hours_per_epoch": None,
        "cost_ratio": None, "joules_per_sample": None, "energy_source": None,
        "ideal_samples_per_s": None, "speedup": None, "efficiency": None, "efficiency_runs": None,
        "time_speedup": None, "loss_breakdown": None, "comm_slowdown_s": None, "predicted_breakdown": None,
        "metric": metric, "metric_value": value, "lr": _lr(summary), "per_epoch": summary.get("per_epoch"),
        "final_loss": summary.get("final_loss"), "predicted_samples_per_s": None, "predicted_efficiency": None,
        "utilisation": summary.get("utilisation"), "other_load": otherload.read(study_dir / cell.name),
        "other_load_during": otherload.read_during(study_dir / cell.name),
        "billing": read_billing(study_dir / (summary.get("same_as") or cell.name)), "billed_per_m_samples": None, "billed_per_epoch": None,
        "timeline": str(timeline) if (study_dir / timeline).is_file() else None,
        "flags": [],
    }


def _per_epoch(row: dict[str, Any], key: str) -> float:
    return row[key] / max(row.get("epochs") or 1, 1)


def _samples_per_device_step(row: dict[str, Any]) -> int:
    return (row.get("per_device_batch") or 1) * (row.get("grad_accum_steps") or 1)


def _parts_per_sample(row: dict[str, Any]) -> dict[str, float | None]:
    """The measured per-step parts of a row (`gpuscale.measure.stepsplit`), in seconds per sample on one device. A
    summary from before imbalance was split has it all as "imbalance" and no jitter."""
    per_step = row.get("step_breakdown_s") or {}
    samples = _samples_per_device_step(row)
    split = "persistent_imbalance" in per_step
    names = {"data": "data_wait", "exposed_comm": "exposed_comm", "imbalance": "persistent_imbalance" if split else "imbalance",
             "jitter": "jitter", "compute": "compute"}
    return {part: None if per_step.get(key) is None else per_step[key] / samples for part, key in names.items()}


ALONE_PARTS = ("exposed_comm", "imbalance", "jitter")
"""The parts one device has none of (no peer to talk to or to wait for): a one-device baseline that did not time
them (no DDP model on one process: Accelerate, Lightning and the Trainer wrap none) has them at 0."""


def _baseline_parts(base: dict[str, Any]) -> dict[str, float | None]:
    """`_parts_per_sample` of a baseline, with `ALONE_PARTS` at 0 where it ran on one device and did not time them."""
    parts = _parts_per_sample(base)
    if base.get("world_size") == 1:
        parts.update({part: 0.0 for part in ALONE_PARTS if parts[part] is None})
    return parts


def breakdown(row: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    """Lost efficiency split into `PARTS`, each a fraction of ideal throughput (see the module docstring).

    The shares add up to 1 - efficiency; a part without a measurement on either side is None and
    counted in "rest". The baseline's own row is all zeros.
    """
    if row is base:
        return {part: 0.0 for part in PARTS}
    t = row["world_size"] / row["samples_per_s"]  # seconds per sample on one device
    t0 = base["world_size"] / base["samples_per_s"]
    mine, theirs = _parts_per_sample(row), _baseline_parts(base)
    shares: dict[str, float | None] = {}
    for part in PARTS[:-1]:
        a, b = mine[part], theirs[part]
        shares[part] = None if a is None or b is None else (a - b) / t
    shares["rest"] = (t - t0) / t - sum(v for v in shares.values() if v is not None)
    return shares


def noise(row: dict[str, Any], base: dict[str, Any]) -> float:
    """How far a comparison of `row` with its baseline may be off by chance, as a share of ideal throughput: the
    spread of the repeated runs' throughput of the row or its baseline (--repeat), at least NOISE_FLOOR."""
    return max(NOISE_FLOOR, spread(row), spread(base))


def part_noises(row: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """Each part's noise: how far it ranged over the repeated runs (`part_ranges`), and at least this floor. A part the
    baseline has none of (one device: no communication, imbalance or jitter) is measured within the run, against the
    run's own time per sample: the spread of the repeated runs' throughput does not make it zero by chance, so its
    floor is NOISE_FLOOR. A part that is a difference against the baseline (data, compute, and so the rest) has the
    comparison's `noise` for floor."""
    across, theirs, ranged = noise(row, base), _baseline_parts(base), part_ranges(row, base)
    return {part: max(NOISE_FLOOR if part != "rest" and theirs.get(part) == 0 else across, ranged.get(part, 0.0))
            for part in PARTS}


def _measured_parts(shares: dict[str, float | None]) -> frozenset[str]:
    return frozenset(part for part, share in shares.items() if share is not None)


def _repeats(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Each repeated run of `row` as a row of its own (its throughput and step split); none for a single run, or a
    results.json written before the runs' splits were kept."""
    splits = row.get("step_breakdown_s_runs") or []
    throughputs = row.get("samples_per_s_runs") or []
    if len(throughputs) < 2 or len(splits) != len(throughputs):
        return []
    return [{**row, "samples_per_s": rate, "step_breakdown_s": split} for rate, split in zip(throughputs, splits, strict=True)]


def part_ranges(row: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """How far each part of `row`'s lost efficiency ranged over the repeated runs (--repeat), in shares of ideal:
    each of the row's runs against the baseline's median run, and the row's median run against each of the
    baseline's runs; the larger of the two ranges (max - min). The rest's range is measured as the parts' are: it
    takes the loss's chance and every measured part's at once. Only runs that measured the parts the median run
    measured count (a repeat without the sync probe's parts, or from an older gpuscale, would put them in its rest).
    Empty without repeats."""
    mine, theirs = _repeats(row), _repeats(base)
    if not mine and not theirs:
        return {}
    measured = _measured_parts(breakdown(row, base))
    sides = [[shares for run in mine if _measured_parts(shares := breakdown(run, base)) == measured],
             [shares for run in theirs if _measured_parts(shares := breakdown(row, run)) == measured]]
    ranges: dict[str, float] = {}
    for side in sides:
        for part in PARTS:
            values = [share for shares in side if (share := shares[part]) is not None]
            if len(values) > 1:
                ranges[part] = max(ranges.get(part, 0.0), max(values) - min(values))
    return ranges


def predicted_breakdown(cell: dict[str, Any] | None, row: dict[str, Any] | None = None) -> dict[str, float | None] | None:
    """The prediction's parts, as fractions of ideal: the model has only exposed communication (compute per sample is
    assumed constant: 0); data, imbalance, jitter and the rest it does not model (None).

    Beside a measured run (`row`), the model's exposed communication per step is put in the run's own units: per
    sample on one device, over the run's measured time per sample, as the measured part is. Its share then says
    how many points of this run's lost efficiency the model gives to communication; over the model's own, shorter
    step (which knows nothing of the other parts) the same seconds would read larger."""
    if not cell or not cell.get("step_time_s"):
        return None
    if row is not None and row.get("samples_per_s"):
        t = row["world_size"] / row["samples_per_s"]
        exposed = cell["exposed_comm_s"] / _samples_per_device_step(row) / t
    else:
        exposed = cell["exposed_comm_s"] / cell["step_time_s"]
    return {"data": None, "exposed_comm": exposed, "imbalance": None, "jitter": None, "compute": 0.0, "rest": None}


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
                set_flags(row, row_flags(row, row, device))
                add_cost(row, None)
            continue
        baselines[group_key(variant, scaling)] = base["name"]
        for row in group:
            if row["world_size"] > 1 and row["synchronised"] is False:  # independent copies: more samples/s, but not one training sped up
                set_flags(row, row_flags(row, row, device))
                add_cost(row, None)
                continue
            devices = row["world_size"] / base["world_size"]
            row["ideal_samples_per_s"] = base["samples_per_s"] * devices
            row["speedup"] = row["samples_per_s"] / base["samples_per_s"]
            row["efficiency"] = row["speedup"] / devices
            row["efficiency_runs"] = [runs / row["ideal_samples_per_s"] for runs in row["samples_per_s_runs"]]
            row["time_speedup"] = _per_epoch(base, "time_to_result_s") / _per_epoch(row, "time_to_result_s")
            row["comm_slowdown_s"] = (row.get("step_breakdown_s") or {}).get("comm_slowdown")
            row["loss_breakdown"] = breakdown(row, base)
            row["noise"] = noise(row, base)
            row["part_noise"] = part_noises(row, base)
            set_flags(row, row_flags(row, base, device))
            add_cost(row, base)
    return baselines


def compared_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a results.json that have a breakdown against a baseline (every row but the baselines)."""
    baselines = set((results.get("baseline") or {}).values())
    return [r for r in results["rows"]
            if r["name"] not in baselines and r.get("loss_breakdown") and r.get("efficiency") is not None]


def load_cells(study_dir: Path) -> tuple[dict[str, Any], list[tuple[Cell, dict[str, Any]]]]:
    """study.json and the finished cells with their summaries."""
    path = study_dir / STUDY_FILE
    if study_dir.is_file():
        raise ValueError(f"{study_dir} is a file, not a study directory: give the folder a study wrote (its --out)")
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
        row["predicted_breakdown"] = predicted_breakdown(cell, row) if row["world_size"] > 1 else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def analyse(study_dir: Path, prediction: dict[str, Any] | Literal["saved"] | None = SAVED,
            target_efficiency: float | None = None) -> dict[str, Any]:
    """The study's results (gpuscale.study's schema) from what is on disk: `write_report(analyse(d), d)` writes the
    report `gpuscale report d` writes.

    `prediction`: the model's figures to put beside the runs; by default (SAVED) the study's own, from its results.json;
    None for none. `target_efficiency`: the efficiency a run must keep to be recommended (`study.answer`); by default
    the study's own (`study_target`), else TARGET_EFFICIENCY. results.json is read only where a default needs it
    (ValueError naming the fix where it is damaged). "created" is the study's date (`runner.study_created`; a
    study.json from before it kept one: results.json's), "report_written" the time of this analysis."""
    study, finished = load_cells(study_dir)
    needs_saved = isinstance(prediction, str) or target_efficiency is None or study_created(study) is None
    saved = saved_results(study_dir) if needs_saved else None
    if isinstance(prediction, str):
        prediction = (saved or {}).get("prediction")
    own_target = study_target(study, saved)
    target = check_target(next(t for t in (target_efficiency, own_target, TARGET_EFFICIENCY) if t is not None))
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
    results = {
        "version": RESULTS_VERSION, "command": study.get("command", []), "launcher": study.get("launcher"),
        "device": device, "device_name": first.get("device_name"),
        "created": study_created(study) or study_created(saved or {}) or _now(), "report_written": _now(),
        "rows": rows, "baseline": baselines, "missing_baseline": missing, "prediction": prediction,
        "notes": checks + [missing_baseline_note(key, name) for key, name in missing.items()
                           if any(group_key(r["variant"], r["scaling"]) == key for r in rows)]
                 + [line for line in [otherload.warning(rows), otherload.during_warning(rows)] if line],
        "target_efficiency": target,
        **({"study_target_efficiency": own_target} if own_target is not None else {}),  # a what-if target is not the study's
    }
    results["answer"] = answer(results, target)
    return results
