"""How a study writes its measured numbers: three significant figures, whatever their size. Pure.

    three_figures(1479.31) -> "1480"     three_figures(12.345) -> "12.3"     three_figures(0.01234) -> "0.0123"

A throughput measured on a shared machine varies by more than 1% from run to run, so a fourth figure says
nothing; the table, the lines under it and the study's progress lines all write throughput this way, so
they agree.
"""

from __future__ import annotations

import math

__all__ = ["three_figures"]


def three_figures(value: float) -> str:
    """`value` rounded to three significant figures, in plain notation (no exponent)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}" if not math.isfinite(value) else "0"
    digits = 2 - math.floor(math.log10(abs(value)))
    rounded = round(value, digits)
    if rounded and math.floor(math.log10(abs(rounded))) != math.floor(math.log10(abs(value))):
        digits -= 1  # 999.6 -> 1000: one figure fewer after the point
    return f"{round(value, digits):.{max(0, digits)}f}"
