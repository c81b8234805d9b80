"""Each run's own plots in the scaling report: the waterfall of its lost efficiency, and its utilisation over time.

- `waterfall_plot` (plots/waterfall-<run>.png): one figure per run with more devices than its baseline,
  titled with its name: a bar at ideal throughput (100%), one falling bar per measured part of the loss
  (data, exposed communication, imbalance, jitter, per-device compute, rest; rising where a part was a gain; labelled
  "~0%" where the table reads it so, within its noise), and
  the measured efficiency at the end, all in % of ideal; the predicted efficiency is a dashed line and
  the predicted parts are marked with a cross.
- `utilisation_plot` (plots/utilisation-<run>.png): per run with a timeline, util % vs seconds since
  training started (the timeline's t; samples before it, at t < 0, are startup, left of a dashed line),
  one line per series ("rank R device").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuscale.detect.log import get_logger
from gpuscale.study.explain import part_share
from gpuscale.study.numbers import three_figures
from gpuscale.study.parts import PARTS, noise_of
from gpuscale.study.plotting import pyplot, save

__all__ = ["waterfall_plot", "utilisation_plot"]

log = get_logger(__name__)


_PART_COLOURS = {"data": "#e3a32b", "exposed_comm": "#d1603d", "imbalance": "#8c564b", "jitter": "#c49c94",
                 "compute": "#3b75af", "rest": "#9e9e9e"}
_PART_SHORT = {"data": "data", "exposed_comm": "exposed\ncomm.", "imbalance": "imbal-\nance", "jitter": "jitter",
               "compute": "per-dev.\ncompute", "rest": "rest"}


def _waterfall_panel(ax: Any, row: dict[str, Any]) -> None:
    shares = row["loss_breakdown"]
    predicted = row.get("predicted_breakdown") or {}
    labels, level = ["ideal"], 100.0
    ax.bar(0, 100.0, color="#c7c7c7", edgecolor="#555555")
    for i, part in enumerate(PARTS, 1):
        labels.append(_PART_SHORT[part])
        share = shares.get(part)
        if share is None:
            ax.text(i, level, "not\nmeasured", ha="center", va="bottom", fontsize="x-small", color="#555555")
            continue
        loss = 100.0 * share
        ax.bar(i, -loss, bottom=level, color=_PART_COLOURS[part] if loss >= 0 else "#59a14f", edgecolor="#555555")
        within = part_share(share, noise_of(row, part), remainder=part == "rest").startswith("~0%")  # as the table says it
        ax.text(i, level - max(loss, 0.0), "~0%" if within or abs(loss) < 0.5 else f"{-loss:+.0f}%", ha="center", va="top",
                fontsize="x-small")
        if predicted.get(part) is not None:
            ax.plot([i], [level - 100.0 * predicted[part]], "x", color="black", markersize=8)
        level -= loss
    labels.append("measured")
    end = len(PARTS) + 1
    ax.bar(end, 100.0 * row["efficiency"], color="#3b75af", edgecolor="#555555")
    ax.text(end, 100.0 * row["efficiency"], f"{100 * row['efficiency']:.0f}%", ha="center", va="bottom", fontsize="small")
    if row.get("predicted_efficiency") is not None:
        ax.axhline(100.0 * row["predicted_efficiency"], linestyle="--", color="#555555", linewidth=1,
                   label=f"predicted efficiency {100 * row['predicted_efficiency']:.0f}%")
        ax.legend(loc="upper right", fontsize="x-small")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize="x-small")
    ax.set_ylim(0, max(105.0, level + 5, 100.0 * row["efficiency"] + 8))
    ax.set_ylabel("% of ideal throughput")
    ax.set_title(f"{row['name']}: {row['world_size']} devices, ideal {three_figures(row['ideal_samples_per_s'])} samples/s", fontsize="small")
    ax.grid(axis="y", alpha=0.3)


def waterfall_plot(row: dict[str, Any], path: Path) -> Path:
    """One run's way from ideal throughput through each measured loss to its measured efficiency, at a readable size,
    titled with the run's name (a run compared with its baseline: `compared_rows`)."""
    fig, ax = pyplot().subplots(figsize=(7.0, 4.2))
    _waterfall_panel(ax, row)
    ax.set_title(f"Why not more: {row['name']} ({row['world_size']} devices, ideal "
                 f"{three_figures(row['ideal_samples_per_s'])} samples/s; x: the model's prediction)", fontsize="medium")
    return save(fig, path)


def _read_timeline(file: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("skipping the utilisation plot of %s: cannot read it (%s)", file, e)
        return None
    if not isinstance(data, dict) or not isinstance(data.get("series"), list):
        log.warning("skipping the utilisation plot of %s: no 'series' list (timeline version 1 expected)", file)
        return None
    return data


def utilisation_plot(row: dict[str, Any], study_dir: Path, path: Path) -> Path | None:
    """Util % vs time for each series of the row's timeline; None (nothing written) without samples.

    Reads ``study_dir / row["timeline"]``. A row without a timeline, a missing or unreadable file
    (logged), and series without samples are skipped rather than failing the whole report.
    """
    if not row.get("timeline"):
        return None
    timeline = _read_timeline(Path(study_dir) / row["timeline"])
    if timeline is None:
        return None
    series = []
    for s in timeline["series"]:
        t, util = s.get("t") or [], s.get("util_pct") or []
        pairs = [(a, b) for a, b in zip(t, util, strict=False) if a is not None and b is not None]
        if pairs:
            series.append((s, pairs))
    if not series:
        return None
    fig, ax = pyplot().subplots(figsize=(7.5, 3.6))
    hosts = {s.get("host") for s, _ in series}
    for s, pairs in series:
        label = f"rank {s.get('rank')} {s.get('device')}"
        if len(hosts) > 1:
            label += f" on {s.get('host')}"
        ax.plot([a for a, _ in pairs], [b for _, b in pairs], label=label, linewidth=1.2)
    ax.set_ylim(0, 105.0)  # a share of the rank's cores or of the GPU's time: never over 100
    if min(a for _, pairs in series for a, _ in pairs) < 0:  # samples before the first batch: startup
        ax.axvline(0, color="#777777", linestyle="--", linewidth=1, label="training starts")
    ax.set_xlabel("time since training started (s)")
    ax.set_ylabel("utilisation (%)")
    ax.set_title(f"Utilisation: {row['name']}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small", ncol=2 if len(series) > 4 else 1)
    return save(fig, path)
