"""The scaling report's text, formatted once: every cell, header and paragraph that the terminal table,
report.md (`gpuscale.study.report`) and report.html (`gpuscale.study.report_html`) show.

A results.json dict goes in (schema in `gpuscale.study`); strings come out, a missing value as
`DASH`. The runs table's columns are `COLUMNS`; the time split, utilisation, breakdown, flags and
plot titles each have their function here, so the three renderings cannot disagree on a number.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from gpuscale.measure.stepsplit import PHASES
from gpuscale.study.analysis import NOISE_FLOOR, PART_LABELS, PARTS, RESULTS_VERSION, compared_rows
from gpuscale.study.explain import DASH, breakdown_cells
from gpuscale.study.flags import group_flags
from gpuscale.study.numbers import three_figures
from gpuscale.study.sections import PREDICTION_SECTION

__all__ = ["DASH", "Column", "COLUMNS", "BASIS", "basis", "checked_rows", "columns", "cells", "command_line", "flags",
           "meta", "notes", "answer_text", "WHY_HEADING", "WHY_TEXT", "SPLIT_TEXT", "PHASE_NAMES", "split_cells", "UTIL_HEADER", "UTIL_TEXT",
           "utilisation_lines", "plot_title", "BREAKDOWN_HEADER", "breakdown_rows"]


def _num(digits: int, suffix: str = "", scale: float = 1.0) -> Callable[[Any], str]:
    return lambda value: f"{value * scale:.{digits}f}{suffix}"


def _metric(row: dict[str, Any]) -> str:
    value = row.get("metric_value")
    if value is None:
        return DASH
    return {"accuracy": f"{value:.3f}", "perplexity": f"{value:.2f}"}.get(row.get("metric") or "", f"{value:.4g}")


class Column(NamedTuple):
    """One column of the runs table: its key (data-key in HTML), header, formatter, alignment."""
    key: str
    header: str
    format: Callable[[dict[str, Any]], str]
    numeric: bool = True


def _field(key: str, fmt: Callable[[Any], str] = str) -> Callable[[dict[str, Any]], str]:
    return lambda row: DASH if row.get(key) is None else fmt(row[key])


def _lr_rule(row: dict[str, Any]) -> str:
    lr = row.get("lr")
    if not lr:
        return DASH
    return lr["rule"] if lr["rule"] == "none" or lr.get("factor") is None else f"{lr['rule']} x{lr['factor']:.3g}"


def _spread(key: str, runs_key: str, fmt: Callable[[Any], str], unit: str = "") -> Callable[[dict[str, Any]], str]:
    """The value, and with --repeat the range its runs spread over: "1400 (1380-1420)", "68% (66-70%)"."""
    def text(row: dict[str, Any]) -> str:
        if row.get(key) is None:
            return DASH
        runs = row.get(runs_key) or []
        if len(runs) < 2:
            return fmt(row[key]) + unit
        return f"{fmt(row[key])}{unit} ({fmt(min(runs))}-{fmt(max(runs))}{unit})"
    return text


COLUMNS = (
    Column("name", "run", lambda r: r["name"] + (f" (= {r['same_as']})" if r.get("same_as") else ""), numeric=False),
    Column("scaling", "scaling", _field("scaling"), numeric=False),
    Column("layout", "nodes x procs (world)",
           lambda r: f"{r['nodes']}x{r['nproc_per_node']} ({r['world_size']})", numeric=False),
    Column("global_batch", "global batch", _field("global_batch")),
    Column("per_device_batch", "per-device batch",
           lambda r: DASH if r.get("per_device_batch") is None else str(r["per_device_batch"])
           + (f" x {r['grad_accum_steps']}" if (r.get("grad_accum_steps") or 1) > 1 else "")),
    Column("samples_per_s", "train samples/s", _spread("samples_per_s", "samples_per_s_runs", three_figures)),
    Column("speedup", "speed-up", _field("speedup", _num(2, "x"))),
    Column("efficiency", "efficiency", _spread("efficiency", "efficiency_runs", _num(0, "", 100.0), "%")),
    Column("predicted_efficiency", "predicted efficiency", _field("predicted_efficiency", _num(0, "%", 100.0))),
    Column("device_hours_per_m_samples", "device-h/1M samples", _field("device_hours_per_m_samples", three_figures)),
    Column("cost_ratio", "cost/sample", _field("cost_ratio", _num(2, "x"))),
    Column("billed_per_m_samples", "billed/1M samples", _field("billed_per_m_samples", three_figures)),
    Column("joules_per_sample", "J/sample", _field("joules_per_sample", three_figures)),
    Column("time_to_result_s", "time to result", _field("time_to_result_s", _num(1, "s"))),
    Column("time_speedup", "speed-up (time)", _field("time_speedup", _num(2, "x"))),
    Column("metric_value", "metric", _metric),
    Column("lr", "lr rule", _lr_rule, numeric=False),
)
"""Every column the runs table can have, in order; `columns(results)` picks those shown."""

BASIS = {
    "per_device_batch": "per-device batch: samples on each device per pass; \"16 x 4\": 4 passes accumulated into each "
                        "optimizer step.",
    "samples_per_s": "train samples/s: samples per second of optimizer steps, data waits included, evaluation, "
                     "checkpoints and probes excluded.",
    "efficiency": "speed-up and efficiency: train samples/s over the baseline's (the smallest run of the same scaling), "
                  "and over ideal (the baseline's samples/s per device x devices). With --repeat, the median run's, and in "
                  "brackets the range the runs spread over (each run's efficiency against the baseline's median).",
    "predicted_efficiency": f"predicted efficiency: the same quantity from the model (its inputs: {PREDICTION_SECTION}).",
    "device_hours_per_m_samples": "device-h/1M samples: devices x hours to train a million samples at that throughput; "
                                  "cost/sample: the same over the baseline's (1 / efficiency).",
    "billed_per_m_samples": "{unit}/1M samples: what the cluster bills for a million samples at that throughput, by "
                            "its rule ({rules}; {source}).",
    "joules_per_sample": "J/sample: the devices' mean power while training, summed over ranks, over train samples/s.",
    "time_to_result_s": "time to result: the whole run from its launch (gpuscale's and the script's start-up, training, "
                        "evaluation, checkpoints) for the same epochs; speed-up (time): the baseline's time to result over this run's.",
    "lr": "lr rule: how the learning rate followed the global batch (gpuscale.scale_lr), with its factor.",
}
"""What each shown column means: its unit and denominator, printed under the table."""


def basis(results: dict[str, Any]) -> str:
    """The sentences of `BASIS` for the columns `results` shows; which runs the probe measured, and what it could not."""
    shown = {col.key for col in columns(results)}
    if not any((row.get("grad_accum_steps") or 1) > 1 for row in results.get("rows") or []):
        shown.discard("per_device_batch")  # a plain number needs no key
    texts = [text for key, text in BASIS.items() if key in shown]
    billed = _billing(results)
    if billed:
        key = BASIS["billed_per_m_samples"]
        texts = [t.format(**billed) if t == key else t for t in texts]
    return " ".join(texts + _probed(results))


def _billing(results: dict[str, Any]) -> dict[str, str] | None:
    """The unit, rules and source of the rows' billing records, for the billed column's header and basis."""
    records = [row["billing"] for row in results["rows"] if row.get("billing") and row.get("billed_per_m_samples") is not None]
    if not records:
        return None
    rules = list(dict.fromkeys(str(r.get("rule") or r.get("partition")) for r in records))
    sources = list(dict.fromkeys(str(r.get("source")) for r in records if r.get("source")))
    return {"unit": str(records[0]["unit"]), "rules": "; ".join(rules), "source": ", ".join(sources) or "no source named"}


def _probed(results: dict[str, Any]) -> list[str]:
    probed = [row for row in results["rows"] if row.get("measured_by") == "probe"]
    if not probed:
        return []
    missing = list(dict.fromkeys(text for row in probed for text in row.get("not_measured") or []))
    names = "all runs" if len(probed) == len(results["rows"]) else ", ".join(row["name"] for row in probed)
    text = (f"Measured by the probe, the script unchanged ({names}): optimizer steps, loader waits and samples, "
            "and exposed communication and imbalance from DDP's own timers where the script trains a DDP model.")
    return [text + (" Not measured there: " + "; ".join(missing) + "." if missing else "")]


_PREDICTED = ("predicted_efficiency",)
PHASE_NAMES = {"startup": "startup", "data_wait": "data wait", "compute": "compute",
               "exposed_comm": "exposed communication", "imbalance": "imbalance", "eval": "eval",
               "checkpoint": "checkpoint", "probe": "probe", "after_training": "after training"}
"""The time split's phases (`gpuscale.measure.stepsplit.PHASES`) as the report names them, in order."""


def checked_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of `results`; ValueError when it has another version or no finished run."""
    if results.get("version") != RESULTS_VERSION:
        raise ValueError(f"results.json has version {results.get('version')!r}, this gpuscale reads version {RESULTS_VERSION}; "
                         "re-derive it with `gpuscale report DIR`")
    rows = results.get("rows") or []
    if not rows:
        raise ValueError("results.json has no finished runs; run `gpuscale study` first")
    return rows


def columns(results: dict[str, Any]) -> list[Column]:
    """The columns shown for `results`: the predicted ones only when a row has a prediction,
    and the metric column headed by the metric's name ("accuracy", "perplexity")."""
    rows = checked_rows(results)
    predicted = any(row.get(k) is not None for row in rows for k in _PREDICTED)
    names = sorted({row["metric"] for row in rows if row.get("metric")})
    shown = []
    for col in COLUMNS:
        if col.key in _PREDICTED and not predicted or col.key == "lr" and not any(row.get("lr") for row in rows):
            continue
        if col.key == "joules_per_sample" and not any(row.get("joules_per_sample") is not None for row in rows):
            continue  # no power was sampled (CPUs)
        if col.key == "billed_per_m_samples":
            billed = _billing(results)
            if billed is None:
                continue  # no profile with a billing rule (a local study)
            col = col._replace(header=f"{billed['unit']}/1M samples")
        if col.key == "metric_value":
            col = col._replace(header="/".join(names) or "metric")
        shown.append(col)
    return shown


def cells(results: dict[str, Any]) -> tuple[list[Column], list[list[str]]]:
    """The runs table: the columns shown, and each run's cells in their order."""
    cols = columns(results)
    return cols, [[col.format(row) for col in cols] for row in results["rows"]]


def command_line(results: dict[str, Any]) -> str:
    """The study's training command, as one shell line."""
    command = results.get("command") or []
    return command if isinstance(command, str) else shlex.join(str(part) for part in command)


def answer_text(results: dict[str, Any]) -> list[str]:
    """The answer first: the study's findings and recommendation in plain sentences (`study.answer`)."""
    return [str(line) for line in results.get("answer") or []]


def notes(results: dict[str, Any]) -> list[str]:
    """What the study says of itself, under the runs table: a scaling without its baseline, and the like."""
    return [str(note) for note in results.get("notes") or []]


def flags(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(runs, flag): each cause once, with the runs it applies to (`flags.group_flags`)."""
    return group_flags(results["rows"])


def meta(results: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, value) of the study's launcher, device, creation time (the study's, kept by every report) and the time
    the report was written (where results.json has one)."""
    device = results.get("device") or DASH
    if results.get("device_name"):
        device += f" ({results['device_name']})"
    written = [("report written", str(results["report_written"]))] if results.get("report_written") else []
    return [("launcher", str(results.get("launcher") or DASH)), ("device", device),
            ("created", str(results.get("created") or DASH)), *written]


WHY_HEADING = "Why not more (lost efficiency, % of ideal throughput, measured; the model's prediction in brackets)"
WHY_TEXT = ("Each part is the growth of a time per sample against the baseline, in % of ideal throughput; the parts "
            f"add up to 100% - efficiency. A part within its noise (at least {100 * NOISE_FLOOR:.0f}%; for data, compute and the rest, "
            "which compare two runs, the spread of repeated runs) reads ~0% (±noise), a negative one too (the baseline's "
            "part came out larger: noise, not a gain), except the rest: a rest below minus its noise is shown, the "
            "amount by which the measured parts overshoot the loss. data: loader wait; "
            "exposed communication: synchronisation that compute did "
            "not hide, and the backward it slowed by running beside it; imbalance: the fastest rank waiting for a rank "
            "that is slower on average (named); jitter: waiting where which rank lags changes from step to step (these "
            "from the sync probe's replayed steps, or from DDP's own timers in a script measured by the probe, on the "
            "steps the line names); "
            "per-device compute: forward and backward per sample; rest: what no measurement explains. The model "
            "predicts exposed communication only (and assumes compute per sample constant).")
SPLIT_TEXT = ("Seconds, and % of the whole run: its time to result, which the phases add up to. Communication, imbalance, "
              "data wait and compute are seen from the rank that waited longest for the others (the fastest); compute "
              "includes the optimizer step and the loop's own work. probe: the sync probe's replays, left out of training "
              "time. after training: what the run did after its last step (a script's own saving and end, as the probe "
              "sees it).")


def split_cells(row: dict[str, Any]) -> list[str]:
    """The row's time split cells: "1.2s (10%)" per phase, then the total."""
    split = row.get("time_split_s") or {}
    total = sum(float(split.get(p) or 0.0) for p in PHASES)
    texts = []
    for phase in PHASES:
        value = split.get(phase)
        if value is None:
            texts.append(DASH)
        else:
            texts.append(f"{value:.1f}s ({100 * value / total:.0f}%)" if total > 0 else f"{value:.1f}s")
    return texts + [f"{total:.1f}s" if split else DASH]


UTIL_HEADER = ["run", "rank", "device", "host", "source", "busy, mean (%)", "busy, max (%)", "memory peak", "power (mean)"]
UTIL_TEXT = ("Each rank's device while it trained: on CPUs the share of the rank's own cores in use (at most 100%), "
             "on GPUs the share of time a kernel was running (NVML, rocm-smi).")


def utilisation_lines(results: dict[str, Any]) -> list[list[str]]:
    """One line per run and device from the summaries' utilisation (empty when no run was monitored)."""
    def pct(v: Any) -> str:
        return DASH if v is None else f"{v:.0f}%"

    lines = []
    for row in results["rows"]:
        for d in (row.get("utilisation") or {}).get("devices") or []:
            mem = d.get("mem_peak_bytes")
            power = d.get("power_mean_w")
            lines.append([row["name"], str(d.get("rank", DASH)), str(d.get("device") or DASH), str(d.get("host") or DASH),
                          str(d.get("source") or DASH), pct(d.get("util_mean")), pct(d.get("util_max")),
                          DASH if mem is None else f"{mem / 2**30:.2f} GiB", DASH if power is None else f"{power:.0f} W"])
    return lines


def plot_title(rel: str) -> str:
    """The title of the plot at `rel` (a path relative to the study directory), from its file name."""
    stem = Path(rel).stem
    if stem.startswith("utilisation-"):
        return f"Utilisation of {stem[len('utilisation-'):]}"
    if stem.startswith("waterfall-"):
        return f"Why not more, {stem[len('waterfall-'):]}: ideal throughput, each measured loss, measured throughput"
    return {"throughput": "Throughput and speed-up vs devices", "efficiency": "Scaling efficiency",
            "cost": "Speed-up against cost per sample",
            "time_breakdown": "Where each run's time went"}.get(stem, stem)


BREAKDOWN_HEADER = ["run", *(PART_LABELS[p] for p in PARTS), "lost (100% - efficiency)"]


def breakdown_rows(results: dict[str, Any]) -> list[list[str]]:
    """One line per run compared with a baseline: its name, then its lost efficiency by part (`BREAKDOWN_HEADER`)."""
    return [[row["name"], *breakdown_cells(row)] for row in compared_rows(results)]
