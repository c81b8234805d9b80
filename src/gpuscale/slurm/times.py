"""SLURM's time format: `parse_time` reads a time limit as sbatch does, `format_time` writes one back.

Used by the profiles (their partitions' limits) and by the job checks and batch scripts (--time).
"""

from __future__ import annotations

import re

__all__ = ["parse_time", "format_time", "MAX_TIME_S"]

MAX_TIME_S = 60 * 10**9
"""Longest time parse_time accepts: 10^9 minutes, so that format_time's output always parses again."""


def parse_time(text: str) -> int:
    """SLURM time ('MM', 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM', 'D-HH:MM:SS') -> seconds."""
    value = str(text).strip(" \t")  # not newlines: the time is echoed in messages that must stay one line
    match = re.fullmatch(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?", value)
    if not match or any(len(part) > 9 for part in match.groups() if part):  # 9 digits: 1.9 million years of minutes
        raise ValueError(f"time {text!r} is not a SLURM time; write e.g. 30 (minutes), 01:30:00 or 1-12:00:00")
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
        total = int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    elif c is not None:  # HH:MM:SS
        total = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # MM:SS
        total = int(a) * 60 + int(b)
    else:  # MM
        total = int(a) * 60
    if total <= 0:
        raise ValueError(f"time {text!r} must be longer than zero")
    if total > MAX_TIME_S:
        raise ValueError(f"time {text!r} is longer than SLURM counts (about 1900 years); ask for what the job needs")
    return total


def format_time(seconds: int) -> str:
    """Seconds -> SLURM's D-HH:MM:SS (or HH:MM:SS under a day)."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
