"""The scaling report's PNG plots, drawn with matplotlib (Agg: no display needed) from results.json.

    from gpuscale.study.plots import write_plots
    write_plots(results, Path("runs/study"))   # -> {"plots/throughput.png": Path(...), ...}

What each plot shows, and why it is drawn that way:

- `throughput_plot` (plots/throughput.png): one panel per scaling present, devices on x, training
  throughput (samples/s) on y, the basis of the table's speed-up and efficiency for both
  scalings, with the ideal line baseline samples/s x (devices / baseline devices). Predictions,
  where the study made them, are dotted. Axes start at 0 so that a gap to the ideal is not
  exaggerated.
- `efficiency_plot` (plots/efficiency.png): efficiency in % vs devices, one line per scaling (and
  variant), the 100% line dashed; the prediction dotted, out to the scales the study did not run
  (hollow markers).
- `cost_plot` (plots/cost.png): speed-up against cost per sample (device-hours over the baseline's), one
  point per run, named, with its billing units per million samples where the profile has a billing rule;
  ideal scaling is the line x = 1.
- `waterfall_plot` and `utilisation_plot`: each run's own figures (`gpuscale.study.plot_runs`).
- `time_breakdown_plot` (plots/time_breakdown.png): one horizontal stacked bar per run, in
  seconds: the phases of PHASES.

Values that are None (no baseline, no prediction, no timeline) are skipped, never drawn as 0.
Every figure is closed after saving, so a long study does not accumulate them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from gpuscale.measure.stepsplit import PHASES
from gpuscale.study.analysis import compared_rows
from gpuscale.study.experiments import group_key
from gpuscale.study.numbers import three_figures
from gpuscale.study.plot_runs import utilisation_plot, waterfall_plot
from gpuscale.study.plotting import pyplot as _pyplot
from gpuscale.study.plotting import save as _save

__all__ = ["devices_label", "plot_paths", "throughput_plot", "efficiency_plot", "waterfall_plot", "cost_plot",
           "time_breakdown_plot", "utilisation_plot", "write_plots"]


_PHASE_COLOURS = ("#9e9e9e", "#e3a32b", "#3b75af", "#d1603d", "#8c564b", "#59a14f", "#b07aa1", "#c7c7c7", "#e0e0e0")
_SCALING_STYLE = {"weak": ("#3b75af", "o"), "strong": ("#d1603d", "s")}


def devices_label(results: dict[str, Any]) -> str:
    """The x-axis label for device counts: GPUs for CUDA studies, CPU processes for CPU ones."""
    device = results.get("device")
    if device == "cuda":
        return "devices (GPUs)"
    if device == "cpu":
        return "devices (CPU processes)"
    return "devices (GPUs, or CPU processes)"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def plot_paths(results: dict[str, Any]) -> dict[str, str]:
    """The plots a report of `results` links, relative to the study directory, keyed by kind.

    Keys: "throughput", "efficiency", "waterfall" (when a run has a breakdown), "time_breakdown", and
    "utilisation-<run>" for each row with a timeline (`write_plots` leaves out those whose file turns
    out missing or empty).
    """
    paths = {"throughput": "plots/throughput.png"}
    if any(row.get("efficiency") is not None for row in results["rows"]):
        paths["efficiency"] = "plots/efficiency.png"
    if sum(1 for row in results["rows"] if row.get("speedup") is not None and row.get("cost_ratio") is not None) >= 2:
        paths["cost"] = "plots/cost.png"
    for row in compared_rows(results):
        paths[f"waterfall-{row['name']}"] = f"plots/waterfall-{_safe(row['name'])}.png"
    paths["time_breakdown"] = "plots/time_breakdown.png"
    for row in results["rows"]:
        if row.get("timeline"):
            paths[f"utilisation-{row['name']}"] = f"plots/utilisation-{_safe(row['name'])}.png"
    return paths


def _by_scaling(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The rows of each scaling (and variant), by `group_key`: "weak", or "linear/weak" in a study with variants."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in results["rows"]:
        groups.setdefault(group_key(row.get("variant") or "", row["scaling"]), []).append(row)
    return {s: sorted(rows, key=lambda r: r["world_size"]) for s, rows in groups.items()}


def _group_title(key: str) -> str:
    """"weak" -> "Weak scaling", "linear/weak" -> "Weak scaling (linear)"."""
    variant, _, scaling = key.rpartition("/")
    return f"{scaling.capitalize()} scaling" + (f" ({variant})" if variant else "")


def _style(key: str, index: int) -> tuple[str, str, Any]:
    """(colour, marker, line style) of a group: its scaling's colour and marker, a line style per variant."""
    colour, marker = _SCALING_STYLE.get(key.rpartition("/")[2], ("#555555", "^"))
    return colour, marker, ("-", "-.", "--", (0, (1, 1)))[index % 4] if "/" in key else "-"


def _baseline(results: dict[str, Any], key: str, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row named in results["baseline"], else the smallest run of that scaling; None where the planned
    baseline did not finish (results["missing_baseline"]): no run may stand in for it."""
    if key in (results.get("missing_baseline") or {}):
        return None
    name = (results.get("baseline") or {}).get(key)
    return next((r for r in rows if r["name"] == name), rows[0])


def _not_run(results: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prediction's cells of the same scaling as `rows` that the study did not run (its next scales)."""
    prefix = rows[0]["name"].rsplit("-", 1)[0] + "-"
    return [c for c in (results.get("prediction") or {}).get("cells") or []
            if c.get("run") is False and str(c.get("name", "")).startswith(prefix) and c.get("efficiency") is not None]


def _integer_ticks(ax: Any, sizes: list[int]) -> None:
    """Ticks at the device counts measured (integers only when there are too many to label)."""
    if len(set(sizes)) <= 12:
        ax.set_xticks(sorted(set(sizes)))
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, max(sizes) * 1.08 + 0.5)


def _points(rows: list[dict[str, Any]], value: Any) -> tuple[list[int], list[float]]:
    """(world sizes, values) for rows where `value(row)` is not None."""
    pairs = [(r["world_size"], value(r)) for r in rows]
    pairs = [(w, v) for w, v in pairs if v is not None and math.isfinite(v)]
    return [w for w, _ in pairs], [v for _, v in pairs]


def _by_nodes(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows of one scaling as lines: one, unlabelled, where all ran on the same number of nodes; else one per node
    count (" on 1 node", " on 2 nodes"): 2 processes on one node and 2 nodes of 1 are two points at 2 devices, and
    one line through both would zig-zag between what are two layouts."""
    counts = sorted({int(r.get("nodes") or 1) for r in rows})
    if len(counts) == 1:
        return [("", rows)]
    return [(f" on {n} node{'s' if n > 1 else ''}", [r for r in rows if int(r.get("nodes") or 1) == n]) for n in counts]


def throughput_plot(results: dict[str, Any], path: Path) -> Path:
    """Training throughput (samples/s) vs devices per scaling, with the ideal line and the prediction."""
    groups = _by_scaling(results)
    columns = min(len(groups), 2)
    lines = math.ceil(len(groups) / columns)
    fig, axes = _pyplot().subplots(lines, columns, figsize=(6.0 * columns, 4.2 * lines), squeeze=False)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    for ax, (key, rows) in zip(axes.flat, groups.items(), strict=False):
        colour, marker = _SCALING_STYLE.get(key.rpartition("/")[2], ("#555555", "^"))
        base = _baseline(results, key, rows)
        sizes = [r["world_size"] for r in rows]
        ideal_x = sorted(set(sizes) | {base["world_size"]}) if base else []
        ideal = [base["samples_per_s"] * w / base["world_size"] for w in ideal_x] if base else []
        ys: list[float] = []
        py: list[float] = []
        if base:
            ax.plot(ideal_x, ideal, "--", color="#777777", label=f"ideal ({base['name']} per device x devices)")
        for index, (where, line) in enumerate(_by_nodes(rows)):
            xs, measured = _points(line, lambda r: r["samples_per_s"])
            px, predicted = _points(line, lambda r: r.get("predicted_samples_per_s"))
            style = ("-", "-.", "--", (0, (1, 1)))[index % 4]
            if xs:
                ax.plot(xs, measured, marker=marker, color=colour, linestyle=style, label=f"measured{where}")
            if px:
                ax.plot(px, predicted, ":", marker=".", color=colour, alpha=0.7, label=f"predicted{where}")
            ys += measured
            py += predicted
        _integer_ticks(ax, sizes)
        ax.set_ylim(0, max([*ideal, *ys, *py, 0.0]) * 1.1 or 1.0)
        ax.set_xlabel(devices_label(results))
        ax.set_ylabel("training throughput (samples/s)")
        ax.set_title(f"{_group_title(key)}: throughput")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def efficiency_plot(results: dict[str, Any], path: Path) -> Path | None:
    """Efficiency (%) vs devices per scaling with the 100% line; None (nothing written) if no row has one."""
    groups = _by_scaling(results)
    if not any(r.get("efficiency") is not None for rows in groups.values() for r in rows):
        return None
    fig, ax = _pyplot().subplots(figsize=(7.0, 4.4))
    sizes = [r["world_size"] for r in results["rows"]]
    ax.axhline(100, linestyle="--", color="#777777", label="ideal (100%)")
    top = 100.0
    for index, (key, rows) in enumerate(groups.items()):
        colour, marker, line = _style(key, index)
        name = _group_title(key).replace(" scaling", "")
        ys: list[float] = []
        for number, (where, members) in enumerate(_by_nodes(rows)):
            xs, measured = _points(members, lambda r: None if r.get("efficiency") is None else 100 * r["efficiency"])
            mx, modelled = _points(members, lambda r: None if r.get("predicted_efficiency") is None
                                   else 100 * r["predicted_efficiency"])
            if xs:
                ax.plot(xs, measured, marker=marker, color=colour, label=f"{name}{where}",
                        linestyle=line if not where else ("-", "-.", "--", (0, (1, 1)))[number % 4])
            if mx:
                ax.plot(mx, modelled, ":", marker=".", color=colour, alpha=0.7, label=f"{name}{where} (predicted)")
            ys += measured
        px, py = _points(rows, lambda r: None if r.get("predicted_efficiency") is None
                         else 100 * r["predicted_efficiency"])
        ahead = _not_run(results, rows)
        if ahead and px:
            ax.plot([px[-1], *(c["world_size"] for c in ahead)], [py[-1], *(100 * c["efficiency"] for c in ahead)], ":",
                    color=colour, alpha=0.7)
            ax.plot([c["world_size"] for c in ahead], [100 * c["efficiency"] for c in ahead], marker, color=colour,
                    markerfacecolor="white", alpha=0.8, label=f"{name} (predicted, not run)")
            sizes += [c["world_size"] for c in ahead]
        top = max([top, *ys, *py])
    _integer_ticks(ax, sizes)
    ax.set_ylim(0, top * 1.1)
    ax.set_xlabel(devices_label(results))
    ax.set_ylabel("efficiency (%, speed-up / devices)")
    ax.set_title("Scaling efficiency")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize="small")
    return _save(fig, path)


def cost_plot(results: dict[str, Any], path: Path) -> Path | None:
    """Speed-up against what each sample costs (device-hours per sample over the baseline's), one point per run with a
    baseline, labelled with its name and, on a cluster with a billing rule, its billing units per million samples. Ideal
    scaling sits on the line x = 1 (faster at no extra cost per sample); a run to its right pays for its speed-up."""
    groups = _by_scaling(results)
    points = [(key, r) for key, rows in groups.items() for r in rows if r.get("speedup") is not None and r.get("cost_ratio") is not None]
    if len(points) < 2:
        return None
    baselines = set((results.get("baseline") or {}).values())
    fig, ax = _pyplot().subplots(figsize=(7.0, 4.4))
    ax.axvline(1.0, linestyle="--", color="#777777", label="ideal: no extra cost per sample")
    for index, key in enumerate(groups):
        mine = [r for k, r in points if k == key]
        if not mine:
            continue
        colour, marker, line = _style(key, index)
        ax.plot([r["cost_ratio"] for r in mine], [r["speedup"] for r in mine], marker=marker, color=colour, linestyle=line,
                label=_group_title(key))
        for r in mine:
            if r["name"] in baselines:
                continue  # every baseline sits at (1, 1): named once below
            label = r["name"]
            if r.get("billed_per_m_samples") is not None:
                label += f"\n{three_figures(r['billed_per_m_samples'])} {(r.get('billing') or {}).get('unit', '')}/1M"
            ax.annotate(label, (r["cost_ratio"], r["speedup"]), textcoords="offset points", xytext=(6, -4), fontsize="x-small")
    ax.annotate("baselines" if len({r["name"] for _, r in points} & baselines) > 1 else "baseline", (1.0, 1.0),
                textcoords="offset points", xytext=(6, -10), fontsize="x-small")
    ax.set_xlim(0.0, max(2.0, max(r["cost_ratio"] for _, r in points) * 1.25))
    ax.set_ylim(0.0, max(r["speedup"] for _, r in points) * 1.2)
    ax.set_xlabel("cost per sample (device-hours, x the baseline's)")
    ax.set_ylabel("speed-up (x the baseline's samples/s)")
    ax.set_title("Speed-up against its cost")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize="small")
    return _save(fig, path)


def time_breakdown_plot(results: dict[str, Any], path: Path) -> Path:
    """One horizontal stacked bar per run (first run on top): seconds in each phase of PHASES."""
    rows = results["rows"]
    fig, ax = _pyplot().subplots(figsize=(7.5, 1.2 + 0.45 * len(rows)))
    names = [r["name"] for r in rows]
    left = [0.0] * len(rows)
    for phase, colour in zip(PHASES, _PHASE_COLOURS, strict=False):
        widths = [float((r.get("time_split_s") or {}).get(phase) or 0.0) for r in rows]
        ax.barh(names, widths, left=left, color=colour, label=phase.replace("_", " "))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_ylabel("run")
    ax.set_title("Where each run's time went")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize="small")
    return _save(fig, path)


def write_plots(results: dict[str, Any], study_dir: Path) -> dict[str, Path]:
    """Draw every plot of `plot_paths(results)` under study_dir/plots; return those written.

    Keys are the paths relative to study_dir ("plots/throughput.png", ...).
    """
    study_dir = Path(study_dir)
    planned = plot_paths(results)
    written: dict[str, Path | None] = {
        planned["throughput"]: throughput_plot(results, study_dir / planned["throughput"]),
    }
    if "efficiency" in planned:
        written[planned["efficiency"]] = efficiency_plot(results, study_dir / planned["efficiency"])
    if "cost" in planned:
        written[planned["cost"]] = cost_plot(results, study_dir / planned["cost"])
    for row in compared_rows(results):
        key = f"waterfall-{row['name']}"
        if key in planned:
            written[planned[key]] = waterfall_plot(row, study_dir / planned[key])
    written[planned["time_breakdown"]] = time_breakdown_plot(results, study_dir / planned["time_breakdown"])
    for row in results["rows"]:
        key = f"utilisation-{row['name']}"
        if key in planned:
            written[planned[key]] = utilisation_plot(row, study_dir, study_dir / planned[key])
    return {rel: p for rel, p in written.items() if p is not None}
