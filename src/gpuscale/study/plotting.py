"""What every plot of the scaling report shares: pyplot on the Agg backend, imported only when a plot is drawn, and
an atomic PNG write. `gpuscale.study.plots` draws the study's figures, `gpuscale.study.plot_runs` each run's."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from gpuscale.base.files import atomic_write

__all__ = ["DPI", "pyplot", "save"]

DPI = 110


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display on clusters and in tests), imported when a
    plot is drawn: reading or tabling a study (`gpuscale report --no-files`) needs no matplotlib."""
    import matplotlib

    matplotlib.use("Agg")  # before pyplot
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    """Write the PNG atomically, 0644 whatever the umask (a half-written plot never shows in the report)."""
    png = io.BytesIO()
    try:
        fig.tight_layout()
        fig.savefig(png, dpi=DPI, format="png", bbox_inches="tight")  # keeps outside legends
    finally:
        pyplot().close(fig)
    return atomic_write(path, lambda f: f.write(png.getvalue()))
