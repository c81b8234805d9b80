"""Is other work using the cores a study runs on? Measured just before each of its runs, from /proc/stat.

A study compares runs made one after another. On a machine whose cores something else uses too (another
user's job, a build, a virtual machine's neighbours taking its time as "steal"), the same run varies from
minute to minute, and one run per cell cannot tell a scaling loss from a busy minute. So before each
local run, with none of the study's own processes alive, the study samples for `SAMPLE_S` how busy the
cores it may use were (user, system, interrupts and steal, over all time; idle and I/O wait are idle), and
keeps it beside the run (`OTHER_LOAD_FILE`). `warning` turns the samples into one line when the cores were
busier than `BUSY_WARNING` before any run of a study that ran each cell once: it recommends ``--repeat 3``,
whose spread the table then shows.

A SLURM study's runs start on compute nodes it does not see beforehand; this measures the local node only.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

__all__ = ["OTHER_LOAD_FILE", "SAMPLE_S", "BUSY_WARNING", "busy_share", "record", "read", "warning"]

OTHER_LOAD_FILE = "other_load.json"
SAMPLE_S = 0.5
BUSY_WARNING = 0.15
"""Cores busier than this share of their time, with none of the study's processes running, make its timings doubtful."""
_IDLE_FIELDS = (3, 4)  # idle, iowait: the columns after the cpuN name are user nice system idle iowait irq softirq steal
_COUNTED = 8


def _times(stat: Path, cores: list[int]) -> dict[int, list[int]]:
    wanted = {f"cpu{c}": c for c in cores}
    found = {}
    for line in stat.read_text().splitlines():
        fields = line.split()
        if fields and fields[0] in wanted:
            found[wanted[fields[0]]] = [int(v) for v in fields[1:1 + _COUNTED]]
    return found


def busy_share(cores: list[int], seconds: float = SAMPLE_S, stat: Path = Path("/proc/stat")) -> float | None:
    """How busy `cores` were over the next `seconds`, 0..1 (steal counted as busy); None where /proc/stat is missing."""
    try:
        before = _times(stat, cores)
        time.sleep(seconds)
        after = _times(stat, cores)
    except (OSError, ValueError):
        return None
    busy = total = 0
    for core, start in before.items():
        end = after.get(core)
        if end is None:
            continue
        deltas = [b - a for a, b in zip(start, end, strict=False)]
        total += sum(deltas)
        busy += sum(deltas) - sum(deltas[i] for i in _IDLE_FIELDS if i < len(deltas))
    return busy / total if total > 0 else None


def record(cell_dir: Path, cores: list[int], seconds: float = SAMPLE_S) -> float | None:
    """Sample the cores' busy share before a run and keep it in the run's folder; returns it."""
    share = busy_share(cores, seconds)
    if share is not None:
        (cell_dir / OTHER_LOAD_FILE).write_text(json.dumps({"busy": share, "cores": cores, "seconds": seconds}) + "\n")
    return share


def read(run_dir: Path) -> float | None:
    """The busy share recorded before the run in `run_dir`, or None."""
    try:
        value = json.loads((run_dir / OTHER_LOAD_FILE).read_text())["busy"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def warning(rows: list[dict[str, Any]]) -> str | None:
    """One line when other work kept the cores busy before some run of a study that ran each cell once."""
    if any((row.get("repeats") or 1) > 1 for row in rows):
        return None
    busy = [(row["name"], row["other_load"]) for row in rows if row.get("other_load") is not None]
    high = [(name, share) for name, share in busy if share > BUSY_WARNING]
    if not high:
        return None
    worst = max(share for _, share in high)
    return (f"Other work kept this machine's cores busy just before {len(high)} of {len(busy)} runs (up to {100 * worst:.0f}% "
            f"of their time, with none of the study's processes running; "
            + ", ".join(f"{name} {100 * share:.0f}%" for name, share in high)
            + "): on a shared machine the same run varies from minute to minute, and one run per cell cannot tell that "
              "from a scaling loss. Run the same study again with --repeat 3 (its finished runs are kept, each cell gets two more): "
              "the table then shows each cell's spread.")
