"""Where the report's texts send the reader: the Prediction section, named in the terminal, linked in each page. Pure.

A text that points to the model (an answer's "Predicted, not run", the exposed-communication flag, the predicted
column's basis) says `PREDICTION_SECTION`, "report.md's Prediction", as results.json keeps it and the terminal table
prints it: the terminal has no sections of its own. report.md and report.html each point to their own section
instead, as a link (`in_markdown`, `in_html`), so a reader of the page is not sent to another file; a report
without one (the study made no prediction) names `gpuscale predict`, which makes one.
"""

from __future__ import annotations

import html

__all__ = ["PREDICTION_SECTION", "PREDICTION_ID", "in_markdown", "in_html"]

PREDICTION_SECTION = "report.md's Prediction"
"""How the texts name the Prediction section (report.md's, as the terminal sees it)."""
PREDICTION_ID = "prediction-section"
"""The id of report.html's Prediction heading (its facts table keeps the id "prediction", a hook for tools)."""
_MD_ANCHOR = "prediction"  # the anchor Markdown renderers (GitHub, mkdocs) give the heading "## Prediction"


def in_markdown(text: str, has_section: bool) -> str:
    """`text` for report.md: the Prediction section as a link to report.md's own; where the report has none (the
    study made no prediction), the command that makes one."""
    return text.replace(PREDICTION_SECTION, f"the [Prediction](#{_MD_ANCHOR}) section" if has_section else _NONE_MD)


def in_html(text: str, has_section: bool) -> str:
    """`text` escaped for report.html, the Prediction section as a link to the page's own heading; where the page has
    none, the command that makes one."""
    escaped, named = html.escape(text), html.escape(PREDICTION_SECTION)
    return escaped.replace(named, f'the <a href="#{PREDICTION_ID}">Prediction</a> section' if has_section else _NONE_HTML)


_NONE_MD, _NONE_HTML = "`gpuscale predict`", "<code>gpuscale predict</code>"
