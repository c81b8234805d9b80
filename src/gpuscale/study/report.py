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

The predicted columns appear only when some row has a prediction. The time split gives each
phase in seconds and as % of the run (the sum of the five phases: startup, data wait, compute,
eval, checkpoint).

report.html needs nothing but the file: CSS inline, plots embedded as data: URLs, no script,
and a Content-Security-Policy that forbids any fetch, so it can be mailed or opened offline.
Stable hooks for tools and tests: the runs table is ``table#runs``; each of its cells carries
``data-row`` (the run name) and ``data-key`` (a key of COLUMNS: the row's results.json key, or
"layout" for nodes x procs); the time split is ``table#time-split``, flags ``ul#flags``, the
prediction ``table#prediction``, and each plot a ``figure[data-plot]``. All text is escaped: a
command or flag reading ``<script>`` shows as text.

The prediction (a dict, its keys rendered generically) lists "batch_sweet_spot" and
"comm_dominates_below_batch" first; a dict value reads "key: value; ...", and a list of records
(the predicted cells) becomes its own table (``table.prediction-records[data-key]`` in HTML).
"""

from __future__ import annotations

import base64
import html
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from gpuscale.files import atomic_write
from gpuscale.study.plots import PHASES, plot_paths, write_plots

__all__ = ["DASH", "COLUMNS", "columns", "format_table", "format_markdown", "render_html", "write_report"]

DASH = "—"
"""What a missing value (None) renders as, everywhere."""


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


COLUMNS = (
    Column("name", "run", _field("name"), numeric=False),
    Column("scaling", "scaling", _field("scaling"), numeric=False),
    Column("layout", "nodes x procs (world)",
           lambda r: f"{r['nodes']}x{r['nproc_per_node']} ({r['world_size']})", numeric=False),
    Column("global_batch", "global batch", _field("global_batch")),
    Column("per_device_batch", "per-device batch", _field("per_device_batch")),
    Column("samples_per_s", "samples/s", _field("samples_per_s", _num(1))),
    Column("train_time_s", "time", _field("train_time_s", _num(1, "s"))),
    Column("speedup", "speed-up", _field("speedup", _num(2, "x"))),
    Column("efficiency", "efficiency", _field("efficiency", _num(0, "%", 100.0))),
    Column("metric_value", "metric", _metric),
    Column("predicted_samples_per_s", "predicted samples/s", _field("predicted_samples_per_s", _num(1))),
    Column("predicted_efficiency", "predicted efficiency", _field("predicted_efficiency", _num(0, "%", 100.0))),
)
"""Every column the runs table can have, in order; `columns(results)` picks those shown."""

_PREDICTED = ("predicted_samples_per_s", "predicted_efficiency")
_PHASE_NAMES = {"startup": "startup", "data_wait": "data wait", "compute": "compute", "eval": "eval",
                "checkpoint": "checkpoint"}
_HIGHLIGHTS = {"batch_sweet_spot": "batch sweet spot",
               "comm_dominates_below_batch": "communication outlasts compute below a per-device batch of"}


def _rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    if results.get("version", 1) != 1:
        raise ValueError(f"results.json has version {results.get('version')!r}, this gpuscale reads version 1; "
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
        if col.key in _PREDICTED and not predicted:
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
    """The runs as an aligned plain-text table, then each run's flags prefixed with its name."""
    cols, cells = _cells(results)
    widths = [max(len(col.header), *(len(r[i]) for r in cells)) for i, col in enumerate(cols)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if c.numeric else v.ljust(w) for c, v, w in zip(cols, values, widths)).rstrip()

    out = [line([c.header for c in cols]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    flags = _flags(results)
    out.append("")
    out.append("Flags:" if flags else "Flags: none")
    out += [f"  {name}: {flag}" for name, flag in flags]
    return "\n".join(out) + "\n"


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


_UTIL_HEADER = ["run", "rank", "device", "host", "source", "busy (mean)", "busy (max)", "memory peak", "power (mean)"]


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


def _value(value: Any) -> str:
    """A prediction value, rendered generically: floats to 4 digits, a dict as "key: value; ..."."""
    if value is None:
        return DASH
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_value(v)}" for k, v in value.items()) or DASH
    if isinstance(value, (list, tuple)):
        return ", ".join(_value(v) for v in value) or DASH
    return str(value)


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _prediction(results: dict[str, Any]) -> tuple[list[tuple[str, str, str]], list[tuple[str, list[str], list[list[str]]]]]:
    """The prediction as (key, label, text) entries, highlighted ones first, and as tables
    (key, header, rows) for its lists of records (the predicted cells)."""
    prediction = results.get("prediction") or {}
    keys = [k for k in _HIGHLIGHTS if k in prediction] + sorted(k for k in prediction if k not in _HIGHLIGHTS)
    entries = [(k, _HIGHLIGHTS.get(k, k), _value(prediction[k])) for k in keys if not _is_records(prediction[k])]
    tables = []
    for key in keys:
        if _is_records(prediction[key]):
            header = list(dict.fromkeys(k for record in prediction[key] for k in record))
            tables.append((key, header, [[_value(r.get(h)) for h in header] for r in prediction[key]]))
    return entries, tables


def _plot_title(rel: str) -> str:
    stem = Path(rel).stem
    if stem.startswith("utilisation-"):
        return f"Utilisation of {stem[len('utilisation-'):]}"
    return {"throughput": "Throughput and speed-up vs devices", "efficiency": "Scaling efficiency",
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


def format_markdown(results: dict[str, Any], plots: Iterable[str] | None = None) -> str:
    """report.md: command, device, runs, time split, flags, prediction and the plots.

    `plots` are the image paths to link, relative to the study directory (default: every plot
    `plots.plot_paths` plans; `write_report` passes those actually written).
    """
    cols, cells = _cells(results)
    command = _command(results)
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", command)), default=0))
    out = ["# gpuscale scaling report", "", fence + "sh", command, fence, ""]
    out += [f"- {key}: {value}" for key, value in _meta(results)] + ["", "## Runs", ""]
    out += _md_table([c.header for c in cols], cells, [c.numeric for c in cols])
    out += ["", "## Time split", "", "Seconds and % of the run (the sum of the phases).", ""]
    out += _md_table(["run", *_PHASE_NAMES.values(), "total"],
                     ([r["name"], *_split(r)] for r in results["rows"]), [False] + [True] * (len(PHASES) + 1))
    util = _utilisation(results)
    if util:
        out += ["", "## Utilisation", "", "Each rank's device while it trained (CPU: % of the rank's cores).", ""]
        out += _md_table(_UTIL_HEADER, util, [False] * 5 + [True] * 4)
    out += ["", "## Flags", ""]
    out += [f"- **{name}**: {flag}" for name, flag in _flags(results)] or ["None."]
    entries, tables = _prediction(results)
    if entries or tables:
        out += ["", "## Prediction", ""]
        out += _md_table(["", "value"], ([label, text] for _, label, text in entries), [False, False]) if entries else []
        for key, header, rows in tables:
            out += ["", f"### {key}", ""] + _md_table(header, rows, [False] * len(header))
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
    out += ['</tbody>', '</table></div>', '<h2>Time split</h2>',
            '<p>Seconds and % of the run (the sum of the phases).</p>',
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
        out += ['<h2>Utilisation</h2>', "<p>Each rank's device while it trained (CPU: % of the rank's cores).</p>",
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
    entries, tables = _prediction(results)
    if entries or tables:
        out += ['<h2>Prediction</h2>', '<table id="prediction" class="wrap">', '<tbody>']
        out += [f'<tr><th>{e(label)}</th><td data-key="{e(key)}">{e(text)}</td></tr>' for key, label, text in entries]
        out += ['</tbody>', '</table>']
        for key, header, rows in tables:
            out += [f'<h3>{e(key)}</h3>', f'<div class="scroll"><table class="prediction-records" data-key="{e(key)}">',
                    '<thead><tr>' + "".join(f'<th>{e(h)}</th>' for h in header) + '</tr></thead>', '<tbody>']
            out += ['<tr>' + "".join(f'<td>{e(c)}</td>' for c in row) + '</tr>' for row in rows]
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
