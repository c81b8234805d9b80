"""report.html: the scaling report as one self-contained page (inline CSS, embedded plots, no script).

`render_html` joins the page's named parts: head, title and meta, runs, why not more, time split,
utilisation, flags, prediction and plots. Every text comes from `gpuscale.study.report_cells` (the
same as in report.md) and is escaped, a pointer to the Prediction section linked to the page's own
(`gpuscale.study.sections`); the hooks tools and tests use (``table#runs``, ``data-row``,
``data-key``, ...) are listed in `gpuscale.study.report`.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpuscale.measure.stepsplit import PHASES
from gpuscale.study.analysis import PARTS
from gpuscale.study.explain import has_prediction, prediction_facts, prediction_table, why_not_more
from gpuscale.study.report_cells import (
    BREAKDOWN_HEADER,
    PHASE_NAMES,
    SPLIT_TEXT,
    UTIL_HEADER,
    UTIL_TEXT,
    WHY_TEXT,
    Column,
    answer_text,
    basis,
    breakdown_rows,
    cells,
    command_line,
    flags,
    meta,
    notes,
    plot_title,
    split_cells,
    utilisation_lines,
)
from gpuscale.study.sections import PREDICTION_ID, in_html

__all__ = ["render_html"]

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
_HEAD = ['<!DOCTYPE html>', '<html lang="en">', '<head>', '<meta charset="utf-8">',
         f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         '<title>gpuscale scaling report</title>', f'<style>{_CSS}</style>', '</head>']
_e = html.escape


def render_html(results: dict[str, Any], images: Mapping[str, bytes]) -> str:
    """report.html's text: `images` maps plot paths (relative, as in report.md) to PNG bytes."""
    cols, texts = cells(results)
    out = [*_HEAD, '<body>', '<main>', *_title(results), *_answer(results), *_runs(results, cols, texts), *_why(results),
           *_time_split(results), *_utilisation(results), *_flags(results), *_prediction(results), *_plots(images),
           '</main>', '</body>', '</html>']
    return "\n".join(out) + "\n"


def _td(text: str, key: str, row: str, numeric: bool) -> str:
    cls = ' class="num"' if numeric else ""
    return f'<td{cls} data-key="{_e(key)}" data-row="{_e(row)}">{_e(text)}</td>'


def _th(text: str, key: str | None = None) -> str:
    return f'<th data-key="{_e(key)}">{_e(text)}</th>' if key is not None else f'<th>{_e(text)}</th>'


def _tr(name: str, tds: Iterable[str]) -> str:
    return f'<tr data-row="{_e(name)}">' + "".join(tds) + '</tr>'


def _line(keys: Iterable[str], texts: list[str], first_numeric: int) -> str:
    """A row named by its first cell, the cells from `first_numeric` on right-aligned."""
    return _tr(texts[0], (_td(t, k, texts[0], i >= first_numeric) for i, (k, t) in enumerate(zip(keys, texts, strict=False))))


def _table(table_id: str, head: list[str], rows: Iterable[str]) -> list[str]:
    """A table that scrolls sideways: `head` the lines of its <thead>, `rows` its <tr> lines."""
    return [f'<div class="scroll"><table id="{table_id}">', *head, '<tbody>', *rows, '</tbody>', '</table></div>']


def _own(results: dict[str, Any], text: str) -> str:
    """`text` escaped, a pointer to the Prediction section linked to the page's own (`sections.in_html`)."""
    return in_html(text, has_prediction(results))


def _items(results: dict[str, Any], pairs: Iterable[tuple[str, str]]) -> list[str]:
    return [f'<li data-row="{_e(name)}"><strong>{_e(name)}</strong>: {_own(results, text)}</li>' for name, text in pairs]


def _title(results: dict[str, Any]) -> list[str]:
    return ['<h1 id="title">gpuscale scaling report</h1>', f'<pre id="command">{_e(command_line(results))}</pre>',
            '<dl class="meta" id="meta">',
            *(f'<dt>{_e(k)}</dt><dd data-key="{_e(k)}">{_e(v)}</dd>' for k, v in meta(results)), '</dl>']


def _answer(results: dict[str, Any]) -> list[str]:
    said = answer_text(results)
    return ['<h2>Answer</h2>', '<div id="answer">', *(f'<p>{_own(results, line)}</p>' for line in said), '</div>'] if said else []


def _runs(results: dict[str, Any], cols: list[Column], texts: list[list[str]]) -> list[str]:
    head = ['<thead><tr>', *(_th(c.header, c.key) for c in cols), '</tr></thead>']
    rows = (_tr(row["name"], (_td(t, c.key, row["name"], c.numeric) for c, t in zip(cols, line, strict=True)))
            for row, line in zip(results["rows"], texts, strict=True))
    said = [f'<p class="note">{_own(results, note)}</p>' for note in notes(results)]
    return ['<h2>Runs</h2>', *_table("runs", head, rows), *said, f'<p id="basis">{_own(results, basis(results))}</p>']


def _why(results: dict[str, Any]) -> list[str]:
    breakdown = breakdown_rows(results)
    if not breakdown:
        return []
    keys = ["name", *PARTS, "lost"]
    head = ['<thead><tr>', *(_th(h, k) for k, h in zip(keys, BREAKDOWN_HEADER, strict=True)), '</tr></thead>']
    rows = (_line(keys, line, 1) for line in breakdown)
    return ['<h2>Why not more</h2>', f'<p>{_e(WHY_TEXT)}</p>', *_table("breakdown", head, rows),
            '<ul id="why">', *_items(results, why_not_more(results)), '</ul>']


def _time_split(results: dict[str, Any]) -> list[str]:
    head = ['<thead><tr><th data-key="name">run</th>', *(_th(label, k) for k, label in PHASE_NAMES.items()),
            '<th data-key="total">total</th></tr></thead>']
    rows = (_line(["name", *PHASES, "total"], [row["name"], *split_cells(row)], 1) for row in results["rows"])
    return ['<h2>Time split</h2>', f'<p>{_e(SPLIT_TEXT)}</p>', *_table("time-split", head, rows)]


def _utilisation(results: dict[str, Any]) -> list[str]:
    util = utilisation_lines(results)
    if not util:
        return []
    head = ['<thead><tr>', *(_th(h) for h in UTIL_HEADER), '</tr></thead>']
    return ['<h2>Utilisation</h2>', f"<p>{_e(UTIL_TEXT)}</p>",
            *_table("utilisation", head, (_line(UTIL_HEADER, line, 5) for line in util))]


def _flags(results: dict[str, Any]) -> list[str]:
    pairs = flags(results)
    return ['<h2>Flags</h2>', *(['<ul id="flags">', *_items(results, pairs), '</ul>'] if pairs else ['<p id="flags">None.</p>'])]


def _prediction(results: dict[str, Any]) -> list[str]:
    facts = prediction_facts(results)
    header, predicted = prediction_table(results)
    if not (facts or predicted):
        return []
    out = [f'<h2 id="{PREDICTION_ID}">Prediction</h2>', '<table id="prediction" class="wrap">', '<tbody>',
           *(f'<tr><th>{_e(label)}</th><td data-key="{_e(key)}">{_e(text)}</td></tr>' for key, label, text in facts),
           '</tbody>', '</table>']
    if predicted:
        head = ['<thead><tr>' + "".join(_th(h) for h in header) + '</tr></thead>']
        out += ['<h3>Predicted runs</h3>', *_table("predicted-runs", head, (_line(header, row, 1) for row in predicted))]
    return out


def _plots(images: Mapping[str, bytes]) -> list[str]:
    if not images:
        return []
    out = ['<h2>Plots</h2>', '<div class="plots">']
    for rel, data in images.items():
        title = plot_title(rel)
        src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        out += [f'<figure data-plot="{_e(Path(rel).stem)}">', f'<img src="{src}" alt="{_e(title)}">',
                f'<figcaption>{_e(title)} ({_e(rel)})</figcaption>', '</figure>']
    return out + ['</div>']
