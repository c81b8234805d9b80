"""The report's explanations, as text: why each run lost what it lost, and what the prediction assumed.

Pure functions of a results.json dict (schema in `gpuscale.study`); `report` puts their text in the
terminal table, report.md and report.html alike, so the three always say the same thing.

    why_not_more(results)      -> [(run, "76% of an ideal 5050 samples/s; lost 24%: data 3%, ...")]
    prediction_facts(results)  -> [(key, label, text)]: interconnect, baseline, overlap, ... with units
    prediction_table(results)  -> (header, rows): the predicted cells, one unit per column
    has_prediction(results)    -> whether the report has a Prediction section (facts or cells)
"""

from __future__ import annotations

import math
from typing import Any

from gpuscale.study.analysis import PART_LABELS, PARTS, compared_rows
from gpuscale.study.numbers import three_figures
from gpuscale.study.parts import noise_of

__all__ = ["DASH", "pct", "part_share", "shown_share", "why_not_more", "doubted_measurement", "rests_on", "REST_DOUBT",
           "breakdown_cells", "prediction_facts", "prediction_table", "has_prediction"]

DASH = "—"
"""What a missing value (None) renders as, everywhere."""


def pct(share: float | None) -> str:
    """A fraction as whole per cent ("24%", "-3%"); None as DASH."""
    return DASH if share is None else f"{100 * share:.0f}%"


def part_share(share: float | None, noise: float | None, *, remainder: bool = False) -> str:
    """A part of lost efficiency: "12%"; "~0% (±3%)" within the noise, and for a negative part, which only says that
    the baseline's time for it per sample came out larger (measurement noise, never a gain); None as DASH.

    remainder: the part is the rest, what the loss leaves after the measured parts. A negative rest beyond the noise
    is shown as it is ("-17%"): it is how far the measured parts overshoot the loss, and without it they would
    seem to add up to more than the line says was lost (`doubted_measurement` says which parts it doubts)."""
    if share is None:
        return DASH
    if noise is not None and share <= noise and not (remainder and share < -noise):
        return f"~0% (±{100 * noise:.0f}%)"
    return pct(share)


def hidden_noise(row: dict[str, Any]) -> float | None:
    """The sum of the measured parts (not the rest) that `shown_share` reads as ~0%, where it is large enough to show
    (1% or more either way); None otherwise. The rest is the loss less every measured part, these included, so the
    parts as shown add up to the loss only with it."""
    shares = row.get("loss_breakdown") or {}
    hidden = sum(share for part, share in shares.items()
                 if part != "rest" and share is not None and shown_share(row, part).startswith("~0%"))
    return hidden if round(100 * hidden) != 0 else None


def shown_share(row: dict[str, Any], part: str) -> str:
    """`part_share` of one part of a row's breakdown, with that part's noise."""
    return part_share((row.get("loss_breakdown") or {}).get(part), noise_of(row, part), remainder=part == "rest")


def _not_measured(row: dict[str, Any]) -> str:
    why = (row.get("sync_probe") or {}).get("why")
    return f" (not measured: {why})" if why else " (not measured)"


def _detail(row: dict[str, Any], part: str) -> str:
    """What a part's number holds beyond its share: the slow rank for imbalance; for exposed communication, the
    backward that the all-reduce beside it slowed (measured from DDP's timers, `analysis.comm_slowdown`)."""
    slow = (row.get("sync_probe") or {}).get("slow_rank")
    if part == "imbalance" and slow is not None and (row.get("loss_breakdown") or {}).get("imbalance", 0) > (noise_of(row, part) or 0):
        return f" (rank {slow} slower on average)"
    slowdown = row.get("comm_slowdown_s")
    if part == "exposed_comm" and slowdown:
        return f" (with {1000 * slowdown:.1f} ms per step of backward slowed by the all-reduce beside it)"
    return ""


def _probe_source(row: dict[str, Any]) -> str:
    probe = row.get("sync_probe") or {}
    return "DDP's timers" if probe.get("source") == "ddp_timers" or row.get("measured_by") == "probe" else "the sync probe's replays"


def rests_on(row: dict[str, Any]) -> str | None:
    """How many steps each part rests on: data waits are timed on every step; communication, imbalance, jitter and
    compute on the steps the sync probe replayed or DDP's timers timed (after their warm-up)."""
    probe = row.get("sync_probe") or {}
    count, steps = probe.get("probes"), probe.get("of_steps") or row.get("steps")
    if not count or not steps or (row.get("loss_breakdown") or {}).get("exposed_comm") is None:
        return None
    return (f"data rests on all {steps} steps; communication, imbalance, jitter and compute on {count} of them "
            f"({_probe_source(row)})")


def why_not_more(results: dict[str, Any]) -> list[tuple[str, str]]:
    """One line per run that is not a baseline: its efficiency, ideal throughput and each part of the
    loss in % of ideal, the prediction's part in brackets where the model has one."""
    lines = []
    for row in compared_rows(results):
        shares = row["loss_breakdown"]
        predicted = row.get("predicted_breakdown") or {}
        parts = []
        for part in PARTS:
            if shares.get(part) is None:
                parts.append(f"{PART_LABELS[part]} {DASH}")
                continue
            text = f"{PART_LABELS[part]} {shown_share(row, part)}{_detail(row, part)}"
            if predicted.get(part) is not None:
                text += f" (predicted {pct(predicted[part])})"
            parts.append(text)
        line = (f"{pct(row['efficiency'])} of an ideal {three_figures(row['ideal_samples_per_s'])} samples/s; "
                f"lost {pct(1 - row['efficiency'])}: " + ", ".join(parts))
        hidden = hidden_noise(row)
        if hidden is not None:
            line += (f" (the parts that read ~0% measured {pct(hidden)} together; counted at that, the parts add up to "
                     f"the {pct(1 - row['efficiency'])} lost)")
        if any(shares.get(p) is None for p in PARTS):
            line += _not_measured(row)
        rests = rests_on(row)
        if rests:
            line += f"; {rests}"
        doubt = doubted_measurement(row)
        if doubt:
            line += f". {doubt}"
        lines.append((row["name"], line))
    return lines


REST_DOUBT = 0.1
"""A "rest" above this share of ideal throughput, or below its negative (and beyond the noise), makes the study name
the measurement it doubts."""


def doubted_measurement(row: dict[str, Any]) -> str | None:
    """Where "rest" is large though the parts were measured: which measurement the study doubts, and why.

    Data waits are timed on every step; exposed communication and imbalance (and so compute, the step's
    remainder) come from a sample of steps: the sync probe's replays in a gpuscale script, DDP's own timed
    iterations in a script measured by the probe. A sample unlike the rest of the run leaves the difference in rest:
    positive where the sampled steps were quicker than the run's average, negative (the parts add up to more than
    was lost) where they were slower."""
    shares = row.get("loss_breakdown") or {}
    rest, noise = shares.get("rest"), noise_of(row, "rest") or 0.0
    if rest is None or abs(rest) <= max(REST_DOUBT, noise) or shares.get("exposed_comm") is None:
        return None
    probe = row.get("sync_probe") or {}
    count, steps = probe.get("probes"), probe.get("of_steps") or row.get("steps")
    sample = f"{count} of its {steps} steps" if count and steps else (f"{count} of its steps" if count else "a sample of its steps")
    what = _probe_source(row)
    if rest < 0:
        return (f"Its rest ({pct(rest)}) is beyond the noise, below zero: the measured parts add up to {pct(-rest)} of ideal more "
                f"than the run lost. The study doubts exposed communication, imbalance and compute, which rest on {sample} "
                f"({what}): sampled steps slower than the run's average step overstate them")
    return (f"Its rest ({pct(rest)}) is beyond the noise: the study doubts exposed communication and imbalance, which rest on "
            f"{sample} ({what}); steps unlike the rest of the run leave the difference in rest "
            "(per-step host work the parts do not time adds to it too)")


def breakdown_cells(row: dict[str, Any]) -> list[str]:
    """A run's breakdown as table cells: each part ("12% (pred. 15%)"), then the whole loss."""
    shares = row.get("loss_breakdown") or {}
    predicted = row.get("predicted_breakdown") or {}
    cells = []
    for part in PARTS:
        text = shown_share(row, part)
        if predicted.get(part) is not None and shares.get(part) is not None:
            text += f" (pred. {pct(predicted[part])})"
        cells.append(text)
    return cells + [pct(None if row.get("efficiency") is None else 1 - row["efficiency"])]


def _gb_s(bytes_per_s: float | None) -> str:
    return DASH if bytes_per_s is None else f"{bytes_per_s / 1e9:.3g} GB/s"


def _us(seconds: float | None) -> str:
    return DASH if seconds is None else f"{seconds * 1e6:.3g} µs"


def _link(link: dict[str, Any]) -> str:
    text = (f"{link.get('source') or 'unknown source'}: within a node {_gb_s(link.get('intra_bandwidth'))} per direction, "
            f"{_us(link.get('intra_latency'))} per ring step")
    if link.get("inter_bandwidth") is not None:
        text += f"; between nodes {_gb_s(link['inter_bandwidth'])}, {_us(link.get('inter_latency'))}"
    return text


def _batch(value: Any) -> str:
    """A per-device batch threshold as whole samples (a fraction of a sample means nothing)."""
    return f"{math.ceil(value)}" if isinstance(value, (int, float)) and math.isfinite(value) else DASH


def _baseline_text(prediction: dict[str, Any]) -> str | None:
    base = prediction.get("baseline")
    if not isinstance(base, dict):
        return None
    parts = [str(base.get("device_name") or base.get("device") or "device unknown")]
    if base.get("step_time_s") is not None:
        parts.append(f"{1e3 * base['step_time_s']:.3g} ms per optimizer step")
    if base.get("per_device_batch") is not None:
        parts.append(f"at {base['per_device_batch']} samples per device")
    if base.get("step_time_source"):
        parts.append(f"({base['step_time_source']})")
    return " ".join(parts)


def prediction_facts(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """What the prediction assumed, as (key, label, text with units); keys it does not know are shown as given."""
    prediction = results.get("prediction") or {}
    facts = []
    baseline = _baseline_text(prediction)
    if baseline:
        facts.append(("baseline", "baseline step (scaled linearly with the per-device batch)", baseline))
    if isinstance(prediction.get("link"), dict):
        facts.append(("link", "interconnect", _link(prediction["link"])))
    if prediction.get("gradient_bytes") is not None:
        facts.append(("gradient_bytes", "synchronised per optimizer step", f"{prediction['gradient_bytes'] / 2**20:.3g} MiB of gradients"))
    if prediction.get("overlap") is not None:
        source = prediction.get("overlap_source") or "as given (--overlap)"
        facts.append(("overlap", "overlap", f"{prediction['overlap']:.2f} of a step's compute time can hide communication ({source})"))
    below = prediction.get("comm_dominates_below_batch") or {}
    if below:
        facts.append(("comm_dominates_below_batch", "a step communicates longer than it computes below a per-device batch of",
                      "; ".join(f"{shape}: {_batch(b)} samples" for shape, b in below.items())))
    known = {"baseline", "link", "gradient_bytes", "overlap", "overlap_source", "comm_dominates_below_batch", "cells"}
    for key in sorted(k for k in prediction if k not in known):
        facts.append((key, key.replace("_", " "), str(prediction[key])))
    return facts


PREDICTION_HEADER = ["run", "devices", "nodes", "per-device batch", "compute (ms/step)", "all-reduce (ms/step)",
                     "exposed communication (ms/step)", "step (ms)", "samples/s", "efficiency"]


def has_prediction(results: dict[str, Any]) -> bool:
    """Whether the report has a Prediction section: the prediction's facts or its predicted cells."""
    return bool(prediction_facts(results) or prediction_table(results)[1])


def _batch_text(cell: dict[str, Any]) -> str:
    """A predicted cell's per-device batch in whole samples; "does not divide" where the study would refuse its global
    batch (``refused``, `predict.cell_batch`); a fraction (a results.json from before the model planned exactly) to 2
    decimals."""
    batch = cell.get("per_device_batch")
    if cell.get("refused"):
        return "does not divide"
    return DASH if batch is None else (f"{batch:.0f}" if float(batch).is_integer() else f"{batch:.2f}")


def prediction_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The predicted cells: each column with its unit, the per-device batch as whole samples (`_batch_text`)."""
    rows = []
    for cell in (results.get("prediction") or {}).get("cells") or []:
        def ms(key: str, c: dict[str, Any] = cell) -> str:
            return DASH if c.get(key) is None else f"{1e3 * c[key]:.3g}"
        name = str(cell.get("name")) + (" (not run)" if cell.get("run") is False else "")
        rows.append([name, str(cell.get("world_size", DASH)), str(cell.get("nodes", DASH)), _batch_text(cell),
                     ms("compute_s"), ms("comm_s"), ms("exposed_comm_s"), ms("step_time_s"),
                     DASH if cell.get("samples_per_s") is None else three_figures(cell['samples_per_s']),
                     pct(cell.get("efficiency"))])
    return PREDICTION_HEADER, rows
