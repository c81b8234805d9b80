"""The scaling report: a plain-text table, report.md, a self-contained report.html and PNG plots.

    from gpuscale.study.report import format_table, write_report
    print(format_table(results))              # what `gpuscale report DIR` prints
    write_report(results, Path("runs/study"))  # report.md, report.html, plots/*.png

This module formats the terminal table and report.md, and `write_report` writes every file; the texts
they share are formatted in `gpuscale.study.report_cells`, the page is laid out in `gpuscale.study.report_html`.

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
each phase in seconds and as % of the whole run: its time to result, which its phases add up to (startup,
data wait, compute, exposed communication, imbalance, eval, checkpoint, probe, after training).

report.html needs nothing but the file: CSS inline, plots embedded as data: URLs, no script,
and a Content-Security-Policy that forbids any fetch, so it can be mailed or opened offline.
Stable hooks for tools and tests: the runs table is ``table#runs``; each of its cells carries
``data-row`` (the run name) and ``data-key`` (a key of COLUMNS: the row's results.json key, or
"layout" for nodes x procs); the breakdown is ``table#breakdown`` (data-key: a part of
`analysis.PARTS`, or "lost") and ``ul#why``; the time split ``table#time-split``, flags
``ul#flags``, the prediction ``table#prediction`` and ``table#predicted-runs`` under the heading
``h2#prediction-section`` (the texts that point to the model link it), and each plot a
``figure[data-plot]``. All text is escaped: a command or flag reading ``<script>`` shows as text.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuscale.base.files import atomic_write
from gpuscale.measure.stepsplit import PHASES
from gpuscale.study.explain import has_prediction, prediction_facts, prediction_table, why_not_more
from gpuscale.study.plots import plot_paths, write_plots
from gpuscale.study.report_cells import BASIS as BASIS  # re-exported: they were defined here
from gpuscale.study.report_cells import (
    BREAKDOWN_HEADER,
    COLUMNS,
    DASH,
    PHASE_NAMES,
    SPLIT_TEXT,
    UTIL_HEADER,
    UTIL_TEXT,
    WHY_HEADING,
    WHY_TEXT,
    answer_text,
    basis,
    breakdown_rows,
    cells,
    checked_rows,
    columns,
    command_line,
    flags,
    meta,
    notes,
    plot_title,
    split_cells,
    utilisation_lines,
)
from gpuscale.study.report_cells import Column as Column
from gpuscale.study.report_html import render_html
from gpuscale.study.sections import in_markdown

__all__ = ["DASH", "COLUMNS", "columns", "format_table", "format_markdown", "render_html", "write_report"]


def format_table(results: dict[str, Any]) -> str:
    """The runs as an aligned plain-text table; why each run lost what it lost; then each run's flags."""
    cols, texts = cells(results)
    widths = [max(len(col.header), *(len(r[i]) for r in texts)) for i, col in enumerate(cols)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if c.numeric else v.ljust(w) for c, v, w in zip(cols, values, widths, strict=True)).rstrip()

    out = [wrapped for sentence in answer_text(results) for wrapped in textwrap.wrap(sentence, width=110)]
    out += [""] if out else []
    out += [line([c.header for c in cols]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in texts]
    for note in notes(results):
        out += [""] + textwrap.wrap(note, width=110)
    out += [""] + textwrap.wrap(basis(results), width=110)
    why = why_not_more(results)
    if why:
        out += ["", WHY_HEADING + ":"] + [f"  {name}: {text}" for name, text in why]
    pairs = flags(results)
    out.append("")
    out.append("Flags:" if pairs else "Flags: none")
    out += [f"  {name}: {flag}" for name, flag in pairs]
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: Iterable[list[str]], numeric: list[bool]) -> list[str]:
    out = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
           "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    return out + ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]


def format_markdown(results: dict[str, Any], plots: Iterable[str] | None = None) -> str:
    """report.md: command, device, runs, why not more, time split, utilisation, flags, prediction, plots.

    `plots` are the image paths to link, relative to the study directory (default: every plot
    `plots.plot_paths` plans; `write_report` passes those actually written).
    """
    cols, texts = cells(results)
    command = command_line(results)
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", command)), default=0))
    linked = has_prediction(results)

    def own(text: str) -> str:  # a pointer to the Prediction section is to report.md's own, as a link
        return in_markdown(text, linked)

    out = ["# gpuscale scaling report", "", fence + "sh", command, fence, ""]
    out += [f"- {key}: {value}" for key, value in meta(results)] + [""]
    if answer_text(results):
        out += ["## Answer", "", *map(own, answer_text(results)), ""]
    out += ["## Runs", ""]
    out += _md_table([c.header for c in cols], texts, [c.numeric for c in cols])
    out += [line for note in notes(results) for line in ("", f"**{own(note)}**")]
    out += ["", own(basis(results))]
    breakdown = breakdown_rows(results)
    if breakdown:
        out += ["", "## Why not more", "", WHY_TEXT, ""]
        out += _md_table(BREAKDOWN_HEADER, breakdown, [False] + [True] * (len(BREAKDOWN_HEADER) - 1))
        out += [""] + [f"- **{name}**: {own(text)}" for name, text in why_not_more(results)]
    out += ["", "## Time split", "", SPLIT_TEXT, ""]
    out += _md_table(["run", *PHASE_NAMES.values(), "total"],
                     ([r["name"], *split_cells(r)] for r in results["rows"]), [False] + [True] * (len(PHASES) + 1))
    util = utilisation_lines(results)
    if util:
        out += ["", "## Utilisation", "", UTIL_TEXT, ""]
        out += _md_table(UTIL_HEADER, util, [False] * 5 + [True] * 4)
    out += ["", "## Flags", ""]
    out += [f"- **{name}**: {own(flag)}" for name, flag in flags(results)] or ["None."]
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
            out += [f"![{plot_title(rel)}]({rel})", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def write_report(results: dict[str, Any], study_dir: Path) -> dict[str, Path]:
    """Write study_dir/report.md, study_dir/report.html and study_dir/plots/*.png.

    Returns the files written, keyed by their path relative to study_dir ("report.md",
    "report.html", "plots/throughput.png", ...). Raises ValueError when `results` has no rows.
    """
    checked_rows(results)
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
