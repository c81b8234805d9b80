"""When a run was launched: the time its startup and time to result count from. Torch-free.

The first launcher sets GPUSCALE_LAUNCH_TIME (a study's cell, a gpuscale batch script, else `gpuscale run` to its
own process start) and every launcher and rank below it keeps it (`launch_time`), so a run's time to result is
the user's: from the launch to the last rank's end, gpuscale's own start-up included.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

__all__ = ["LAUNCH_TIME", "launch_time", "process_start_time"]

LAUNCH_TIME = "GPUSCALE_LAUNCH_TIME"
"""When the run was launched (Unix time): set by whoever launched it first (a study's cell, a gpuscale batch script,
`gpuscale run`) and kept by those it starts, so a run's startup and time to result count from the user's launch."""


def launch_time(environ: Mapping[str, str], now: float) -> float | None:
    """The launch time a launcher above this one set (LAUNCH_TIME), if it is a plausible one: at most a day old and
    not in the future (a stale value from a user's shell is ignored)."""
    try:
        value = float(environ.get(LAUNCH_TIME, ""))
    except ValueError:
        return None
    return value if now - 86400 <= value <= now + 1 else None


def process_start_time() -> float:
    """Unix time this process started (Linux: /proc, to the clock tick), else now."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22 of stat, counted after the command name
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
