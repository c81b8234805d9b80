"""The scaling report: a plain-text table, report.md, a self-contained report.html and PNG plots.

    from gpuscale.study.report import format_table, write_report
    print(format_table(results))              # what `gpuscale report DIR` prints
    write_report(results, Path("runs/study"))  # report.md, report.html, plots/*.png

`results` is a results.json dict (schema in `gpuscale.study`). Every number is formatted once, by
the column table `COLUMNS`, so the terminal table, report.md and report.html show the same text:

    samples/s and time   1 decimal ("123.4", "10.2s")
    speed-up             2 decimals and "x" ("1.93x")
    efficiency           whole per cent ("96%")
    accuracy             3 decimals; perplexity 2 decimals
    a missing value      "—" (an em dash), e.g. a run without a baseline or a prediction

The predicted column appears only when some row has a prediction, the lr rule only when some
run recorded one. Every header and paragraph names its unit and denominator (`BASIS`, `WHY_TEXT`,
`SPLIT_TEXT`, `UTIL_TEXT`). "Why not more" gives each run's lost efficiency by part
(`gpuscale.study.analysis.breakdown`, worded by `gpuscale.study.explain`). The time split gives
each phase in seconds and as % of the whole run (the sum of its phases: startup, data wait,
compute, exposed communication, imbalance, eval, checkpoint, probe).

report.html needs nothing but the file: CSS inline, plots embedded as data: URLs, no script,
and a Content-Security-Policy that forbids any fetch, so it can be mailed or opened offline.
Stable hooks for tools and tests: the runs table is ``table#runs``; each of its cells carries
``data-row`` (the run name) and ``data-key`` (a key of COLUMNS: the row's results.json key, or
"layout" for nodes x procs); the breakdown is ``table#breakdown`` (data-key: a part of
`analysis.PARTS`, or "lost") and ``ul#why``; the time split ``table#time-split``, flags
``ul#flags``, the prediction ``table#prediction`` and ``table#predicted-runs``, and each plot a
``figure[data-plot]``. All text is escaped: a command or flag reading ``<script>`` shows as text.
"""

from __future__ import annotations

import base64
import html
import re
import shlex
import textwrap
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from gpuscale.files import atomic_write
from gpuscale.stepsplit import PHASES
from gpuscale.study.analysis import PART_LABELS, PARTS, RESULTS_VERSION, compared_rows
from gpuscale.study.explain import DASH, breakdown_cells, prediction_facts, prediction_table, why_not_more
from gpuscale.study.plots import plot_paths, write_plots

__all__ = ["DASH", "COLUMNS", "columns", "format_table", "format_markdown", "render_html", "write_report"]

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


COLUMNS = (
    Column("name", "run", _field("name"), numeric=False),
    Column("scaling", "scaling", _field("scaling"), numeric=False),
    Column("layout", "nodes x procs (world)",
           lambda r: f"{r['nodes']}x{r['nproc_per_node']} ({r['world_size']})", numeric=False),
    Column("global_batch", "global batch", _field("global_batch")),
    Column("per_device_batch", "per-device batch", _field("per_device_batch")),
    Column("samples_per_s", "train samples/s", _field("samples_per_s", _num(1))),
    Column("speedup", "speed-up", _field("speedup", _num(2, "x"))),
    Column("efficiency", "efficiency", _field("efficiency", _num(0, "%", 100.0))),
    Column("predicted_efficiency", "predicted efficiency", _field("predicted_efficiency", _num(0, "%", 100.0))),
    Column("time_to_result_s", "time to result", _field("time_to_result_s", _num(1, "s"))),
    Column("time_speedup", "speed-up (time)", _field("time_speedup", _num(2, "x"))),
    Column("metric_value", "metric", _metric),
    Column("lr", "lr rule", _lr_rule, numeric=False),
)
"""Every column the runs table can have, in order; `columns(results)` picks those shown."""

BASIS = {
    "samples_per_s": "train samples/s: samples per second of optimizer steps, data waits included, evaluation, "
                     "checkpoints and probes excluded.",
    "efficiency": "speed-up and efficiency: train samples/s over the baseline's (the smallest run of the same scaling), "
                  "and over ideal (the baseline's samples/s per device x devices).",
    "predicted_efficiency": "predicted efficiency: the same quantity from the model (see Prediction).",
    "time_to_result_s": "time to result: the whole run (startup, training, evaluation, checkpoints) for the same "
                        "epochs; speed-up (time): the baseline's time to result over this run's.",
    "lr": "lr rule: how the learning rate followed the global batch (gpuscale.scale_lr), with its factor.",
}
"""What each shown column means: its unit and denominator, printed under the table."""


def basis(results: dict[str, Any]) -> str:
    """The sentences of `BASIS` for the columns `results` shows; which runs the probe measured, and what it could not."""
    shown = {col.key for col in columns(results)}
    return " ".join([text for key, text in BASIS.items() if key in shown] + _probed(results))


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
_PHASE_NAMES = {"startup": "startup", "data_wait": "data wait", "compute": "compute",
                "exposed_comm": "exposed communication", "imbalance": "imbalance", "eval": "eval",
                "checkpoint": "checkpoint", "probe": "probe"}


def _rows(results: dict[str, Any]) -> list[dict[str, Any]]:
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
    rows = _rows(results)
    predicted = any(row.get(k) is not None for row in rows for k in _PREDICTED)
    names = sorted({row["metric"] for row in rows if row.get("metric")})
    shown = []
    for col in COLUMNS:
        if col.key in _PREDICTED and not predicted or col.key == "lr" and not any(row.get("lr") for row in rows):
            continue
        if col.key == "metric_value":
            col = col._replace(header="/".join(names) or "metric")
        shown.append(col)
    return shown


def _cells(results: dict[str, Any]) -> tuple[list[Column], list[list[str]]]:
    cols = columns(results)
    return cols, [[col.format(row) for col in cols] for row in results["rows"]]


def _command(results: dict[str, Any]) -> str:
    command = results.get("command") or []
    return command if isinstance(command, str) else shlex.join(str(part) for part in command)


def _flags(results: dict[str, Any]) -> list[tuple[str, str]]:
    return [(row["name"], str(flag)) for row in results["rows"] for flag in row.get("flags") or []]


def format_table(results: dict[str, Any]) -> str:
    """The runs as an aligned plain-text table; why each run lost what it lost; then each run's flags."""
    cols, cells = _cells(results)
    widths = [max(len(col.header), *(len(r[i]) for r in cells)) for i, col in enumerate(cols)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if c.numeric else v.ljust(w) for c, v, w in zip(cols, values, widths)).rstrip()

    out = [line([c.header for c in cols]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    out += [""] + textwrap.wrap(basis(results), width=110)
    why = why_not_more(results)
    if why:
        out += ["", WHY_HEADING + ":"] + [f"  {name}: {text}" for name, text in why]
    flags = _flags(results)
    out.append("")
    out.append("Flags:" if flags else "Flags: none")
    out += [f"  {name}: {flag}" for name, flag in flags]
    return "\n".join(out) + "\n"


WHY_HEADING = "Why not more (lost efficiency, % of ideal throughput, measured; the model's prediction in brackets)"
WHY_TEXT = ("Each part is the growth of a time per sample against the baseline, in % of ideal throughput; the parts "
            "add up to 100% - efficiency. data: loader wait; exposed communication: synchronisation that compute did "
            "not hide; imbalance: the fastest rank waiting for the slowest (both from the sync probe's replayed steps, or "
            "from DDP's own timers in a script measured by the probe); "
            "per-device compute: forward and backward per sample; rest: what no measurement explains. The model "
            "predicts exposed communication only (and assumes compute per sample constant).")
SPLIT_TEXT = ("Seconds, and % of the whole run (the sum of the phases). Communication, imbalance, data wait and "
              "compute are seen from the rank that waited longest for the others (the fastest); compute includes "
              "the optimizer step and the loop's own work. probe: the sync probe's replays, left out of training time.")


def _split(row: dict[str, Any]) -> list[str]:
    """The row's time split cells: "1.2s (10%)" per phase, then the total."""
    split = row.get("time_split_s") or {}
    total = sum(float(split.get(p) or 0.0) for p in PHASES)
    cells = []
    for phase in PHASES:
        value = split.get(phase)
        if value is None:
            cells.append(DASH)
        else:
            cells.append(f"{value:.1f}s ({100 * value / total:.0f}%)" if total > 0 else f"{value:.1f}s")
    return cells + [f"{total:.1f}s" if split else DASH]


_UTIL_HEADER = ["run", "rank", "device", "host", "source", "busy, mean (%)", "busy, max (%)", "memory peak", "power (mean)"]
UTIL_TEXT = ("Each rank's device while it trained: on CPUs the share of the rank's own cores in use (at most 100%), "
             "on GPUs the share of time a kernel was running (NVML, rocm-smi).")


def _utilisation(results: dict[str, Any]) -> list[list[str]]:
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


def _plot_title(rel: str) -> str:
    stem = Path(rel).stem
    if stem.startswith("utilisation-"):
        return f"Utilisation of {stem[len('utilisation-'):]}"
    return {"throughput": "Throughput and speed-up vs devices", "efficiency": "Scaling efficiency",
            "waterfall": "Why not more: ideal throughput, each measured loss, measured throughput",
            "time_breakdown": "Where each run's time went"}.get(stem, stem)


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: Iterable[list[str]], numeric: list[bool]) -> list[str]:
    out = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
           "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    return out + ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]


def _meta(results: dict[str, Any]) -> list[tuple[str, str]]:
    device = results.get("device") or DASH
    if results.get("device_name"):
        device += f" ({results['device_name']})"
    return [("launcher", str(results.get("launcher") or DASH)), ("device", device),
            ("created", str(results.get("created") or DASH))]


BREAKDOWN_HEADER = ["run", *(PART_LABELS[p] for p in PARTS), "lost (100% - efficiency)"]


def _breakdown_rows(results: dict[str, Any]) -> list[list[str]]:
    return [[row["name"], *breakdown_cells(row)] for row in compared_rows(results)]


def format_markdown(results: dict[str, Any], plots: Iterable[str] | None = None) -> str:
    """report.md: command, device, runs, why not more, time split, utilisation, flags, prediction, plots.

    `plots` are the image paths to link, relative to the study directory (default: every plot
    `plots.plot_paths` plans; `write_report` passes those actually written).
    """
    cols, cells = _cells(results)
    command = _command(results)
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", command)), default=0))
    out = ["# gpuscale scaling report", "", fence + "sh", command, fence, ""]
    out += [f"- {key}: {value}" for key, value in _meta(results)] + ["", "## Runs", ""]
    out += _md_table([c.header for c in cols], cells, [c.numeric for c in cols])
    out += ["", basis(results)]
    breakdown = _breakdown_rows(results)
    if breakdown:
        out += ["", "## Why not more", "", WHY_TEXT, ""]
        out += _md_table(BREAKDOWN_HEADER, breakdown, [False] + [True] * (len(BREAKDOWN_HEADER) - 1))
        out += [""] + [f"- **{name}**: {text}" for name, text in why_not_more(results)]
    out += ["", "## Time split", "", SPLIT_TEXT, ""]
    out += _md_table(["run", *_PHASE_NAMES.values(), "total"],
                     ([r["name"], *_split(r)] for r in results["rows"]), [False] + [True] * (len(PHASES) + 1))
    util = _utilisation(results)
    if util:
        out += ["", "## Utilisation", "", UTIL_TEXT, ""]
        out += _md_table(_UTIL_HEADER, util, [False] * 5 + [True] * 4)
    out += ["", "## Flags", ""]
    out += [f"- **{name}**: {flag}" for name, flag in _flags(results)] or ["None."]
    facts = prediction_facts(results)
    header, predicted = prediction_table(results)
    if facts or predicted:
        out += ["", "## Prediction", ""]
        out += _md_table(["", "value"], ([label, text] for _, label, text in facts), [False, False]) if facts else []
        if predicted:
            out += ["", "### Predicted runs", ""] + _md_table(header, predicted, [False] + [True] * (len(header) - 1))
    rels = list(plot_paths(results).values() if plots is None else plots)
    if rels:
        out += ["", "## Plots", ""]
        for rel in rels:
            out += [f"![{_plot_title(rel)}]({rel})", ""]
    return "\n".join(out).rstrip("\n") + "\n"


_CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; margin: 0; background: #fafafa; }
main { max-width: 1400px; margin: 0 auto; padding: 24px; }
h1 { font-size: 1.6em; margin: 0 0 .4em; } h2 { font-size: 1.2em; margin-top: 1.8em; } h3 { font-size: 1em; }
pre { background: #f0f0f0; padding: 8px 12px; border-radius: 4px; white-space: pre-wrap; word-break: break-all; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #ddd; padding: 4px 8px; white-space: nowrap; }
th { background: #f0f0f0; text-align: left; white-space: normal; vertical-align: bottom; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.wrap td { white-space: normal; }
ul#flags li { margin: 2px 0; }
figure { margin: 16px 0; } figure img { max-width: 100%; height: auto; border: 1px solid #ddd; background: #fff; }
figcaption { color: #555; font-size: .9em; }
div.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 0 16px; }
div.plots figure[data-plot="throughput"] { grid-column: 1 / -1; }
"""
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _td(text: str, key: str, row: str, numeric: bool) -> str:
    cls = ' class="num"' if numeric else ""
    return f'<td{cls} data-key="{html.escape(key)}" data-row="{html.escape(row)}">{html.escape(text)}</td>'


def render_html(results: dict[str, Any], images: Mapping[str, bytes]) -> str:
    """report.html's text: `images` maps plot paths (relative, as in report.md) to PNG bytes."""
    e = html.escape
    cols, cells = _cells(results)
    out = ['<!DOCTYPE html>', '<html lang="en">', '<head>', '<meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           '<title>gpuscale scaling report</title>', f'<style>{_CSS}</style>', '</head>', '<body>', '<main>',
           '<h1 id="title">gpuscale scaling report</h1>',
           f'<pre id="command">{e(_command(results))}</pre>', '<dl class="meta" id="meta">']
    out += [f'<dt>{e(k)}</dt><dd data-key="{e(k)}">{e(v)}</dd>' for k, v in _meta(results)]
    out += ['</dl>', '<h2>Runs</h2>', '<div class="scroll"><table id="runs">', '<thead><tr>']
    out += [f'<th data-key="{e(c.key)}">{e(c.header)}</th>' for c in cols]
    out += ['</tr></thead>', '<tbody>']
    for row, texts in zip(results["rows"], cells):
        out.append(f'<tr data-row="{e(row["name"])}">'
                   + "".join(_td(t, c.key, row["name"], c.numeric) for c, t in zip(cols, texts)) + '</tr>')
    out += ['</tbody>', '</table></div>', f'<p id="basis">{e(basis(results))}</p>']
    breakdown = _breakdown_rows(results)
    if breakdown:
        keys = ["name", *PARTS, "lost"]
        out += ['<h2>Why not more</h2>', f'<p>{e(WHY_TEXT)}</p>', '<div class="scroll"><table id="breakdown">', '<thead><tr>']
        out += [f'<th data-key="{k}">{e(h)}</th>' for k, h in zip(keys, BREAKDOWN_HEADER)] + ['</tr></thead>', '<tbody>']
        for line in breakdown:
            out.append(f'<tr data-row="{e(line[0])}">' + "".join(
                _td(t, k, line[0], i > 0) for i, (k, t) in enumerate(zip(keys, line))) + '</tr>')
        out += ['</tbody>', '</table></div>', '<ul id="why">']
        out += [f'<li data-row="{e(name)}"><strong>{e(name)}</strong>: {e(text)}</li>' for name, text in why_not_more(results)]
        out.append('</ul>')
    out += ['<h2>Time split</h2>', f'<p>{e(SPLIT_TEXT)}</p>',
            '<div class="scroll"><table id="time-split">', '<thead><tr><th data-key="name">run</th>']
    out += [f'<th data-key="{k}">{e(label)}</th>' for k, label in _PHASE_NAMES.items()]
    out += ['<th data-key="total">total</th></tr></thead>', '<tbody>']
    for row in results["rows"]:
        texts = _split(row)
        out.append(f'<tr data-row="{e(row["name"])}">' + _td(row["name"], "name", row["name"], False)
                   + "".join(_td(t, k, row["name"], True) for k, t in zip([*PHASES, "total"], texts)) + '</tr>')
    out += ['</tbody>', '</table></div>']
    util = _utilisation(results)
    if util:
        out += ['<h2>Utilisation</h2>', f"<p>{e(UTIL_TEXT)}</p>",
                '<div class="scroll"><table id="utilisation">', '<thead><tr>']
        out += [f'<th>{e(h)}</th>' for h in _UTIL_HEADER] + ['</tr></thead>', '<tbody>']
        for line in util:
            out.append(f'<tr data-row="{e(line[0])}">' + "".join(
                _td(t, k, line[0], i >= 5) for i, (k, t) in enumerate(zip(_UTIL_HEADER, line))) + '</tr>')
        out += ['</tbody>', '</table></div>']
    out += ['<h2>Flags</h2>']
    flags = _flags(results)
    if flags:
        out.append('<ul id="flags">')
        out += [f'<li data-row="{e(name)}"><strong>{e(name)}</strong>: {e(flag)}</li>' for name, flag in flags]
        out.append('</ul>')
    else:
        out.append('<p id="flags">None.</p>')
    facts = prediction_facts(results)
    header, predicted = prediction_table(results)
    if facts or predicted:
        out += ['<h2>Prediction</h2>', '<table id="prediction" class="wrap">', '<tbody>']
        out += [f'<tr><th>{e(label)}</th><td data-key="{e(key)}">{e(text)}</td></tr>' for key, label, text in facts]
        out += ['</tbody>', '</table>']
        if predicted:
            out += ['<h3>Predicted runs</h3>', '<div class="scroll"><table id="predicted-runs">',
                    '<thead><tr>' + "".join(f'<th>{e(h)}</th>' for h in header) + '</tr></thead>', '<tbody>']
            out += [f'<tr data-row="{e(row[0])}">' + "".join(_td(c, h, row[0], i > 0) for i, (h, c) in enumerate(zip(header, row)))
                    + '</tr>' for row in predicted]
            out += ['</tbody>', '</table></div>']
    if images:
        out += ['<h2>Plots</h2>', '<div class="plots">']
    for rel, data in images.items():
        title = _plot_title(rel)
        src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        out += [f'<figure data-plot="{e(Path(rel).stem)}">', f'<img src="{src}" alt="{e(title)}">',
                f'<figcaption>{e(title)} ({e(rel)})</figcaption>', '</figure>']
    if images:
        out.append('</div>')
    out += ['</main>', '</body>', '</html>']
    return "\n".join(out) + "\n"


def write_report(results: dict[str, Any], study_dir: Path) -> dict[str, Path]:
    """Write study_dir/report.md, study_dir/report.html and study_dir/plots/*.png.

    Returns the files written, keyed by their path relative to study_dir ("report.md",
    "report.html", "plots/throughput.png", ...). Raises ValueError when `results` has no rows.
    """
    _rows(results)
    study_dir = Path(study_dir)
    plots = write_plots(results, study_dir)
    images = {rel: path.read_bytes() for rel, path in plots.items()}
    markdown = format_markdown(results, plots=list(plots))
    page = render_html(results, images)
    written = {
        "report.md": atomic_write(study_dir / "report.md", lambda f: f.write(markdown.encode())),
        "report.html": atomic_write(study_dir / "report.html", lambda f: f.write(page.encode())),
    }
    return {**written, **plots}
