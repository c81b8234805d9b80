"""Is other work using the cores a study runs on? Measured just before each of its runs, from /proc/stat.

A study compares runs made one after another. On a machine whose cores something else uses too (another
user's job, a build, a virtual machine's neighbours taking its time as "steal"), the same run varies from
minute to minute, and one run per cell cannot tell a scaling loss from a busy minute. So before each
local run, with none of the study's own processes alive, the study samples for `SAMPLE_S` how busy the
cores it may use were (user, system, interrupts and steal, over all time; idle and I/O wait are idle), and
keeps it beside the run (`OTHER_LOAD_FILE`). `warning` turns the samples into one line when the cores were
busier than `BUSY_WARNING` before any run of a study that ran each cell once: it recommends ``--repeat 3``,
whose spread the table then shows.

During each local run the study measures again (`during`): how much of the run's cores' time went to anything
but the run itself (their busy time, steal included, less the CPU time the run's processes used, from the
resource usage of the study's finished children) and how much the hypervisor took from each core (steal). A
neighbour that slows one core for a minute makes the rank bound to it the slow one: the run then shows an
imbalance, rightly measured, that is the machine's and not the script's. `during_warning` names such runs.

A SLURM study's runs start on compute nodes it does not see beforehand; this measures the local node only.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["OTHER_LOAD_FILE", "SAMPLE_S", "BUSY_WARNING", "busy_share", "record", "read", "warning", "during", "others_share",
           "read_during", "during_warning"]

OTHER_LOAD_FILE = "other_load.json"
SAMPLE_S = 0.5
BUSY_WARNING = 0.15
"""Cores busier than this share of their time, with none of the study's processes running, make its timings doubtful."""
_IDLE_FIELDS = (3, 4)  # idle, iowait: the columns after the cpuN name are user nice system idle iowait irq softirq steal
_STEAL_FIELD = 7
_COUNTED = 8
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _times(stat: Path, cores: list[int]) -> dict[int, list[int]]:
    wanted = {f"cpu{c}": c for c in cores}
    found = {}
    for line in stat.read_text().splitlines():
        fields = line.split()
        if fields and fields[0] in wanted:
            found[wanted[fields[0]]] = [int(v) for v in fields[1:1 + _COUNTED]]
    return found


def _deltas(before: dict[int, list[int]], after: dict[int, list[int]]) -> dict[int, list[int]]:
    """Each core's counters over the interval (`_times` before and after), for the cores read both times."""
    return {core: [b - a for a, b in zip(start, after[core], strict=False)] for core, start in before.items() if core in after}


def _busy(deltas: list[int]) -> int:
    """A core's busy ticks over an interval: all but idle and I/O wait (steal counts as busy)."""
    return sum(deltas) - sum(deltas[i] for i in _IDLE_FIELDS if i < len(deltas))


def busy_share(cores: list[int], seconds: float = SAMPLE_S, stat: Path = Path("/proc/stat")) -> float | None:
    """How busy `cores` were over the next `seconds`, 0..1 (steal counted as busy); None where /proc/stat is missing."""
    try:
        before = _times(stat, cores)
        time.sleep(seconds)
        after = _times(stat, cores)
    except (OSError, ValueError):
        return None
    deltas = _deltas(before, after)
    total = sum(sum(d) for d in deltas.values())
    return sum(_busy(d) for d in deltas.values()) / total if total > 0 else None


def _children_cpu_s() -> float:
    """CPU seconds (user and system) of this process's finished, waited-for children, theirs included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def others_share(before: dict[int, list[int]], after: dict[int, list[int]], own_cpu_s: float,
                 ticks_per_s: float = _TICKS_PER_S) -> dict[str, Any] | None:
    """What took the cores' time besides a run, from /proc/stat's counters before and after it and the CPU seconds
    the run's own processes used: ``{"others": share of the cores' time (0..1), "steal": {core: share of its time}}``;
    None where the counters show no time passing."""
    deltas = _deltas(before, after)
    total = sum(sum(d) for d in deltas.values())
    if total <= 0:
        return None
    busy = sum(_busy(d) for d in deltas.values())
    steal = {core: d[_STEAL_FIELD] / sum(d) for core, d in deltas.items() if sum(d) > 0 and len(d) > _STEAL_FIELD}
    return {"others": min(max((busy - own_cpu_s * ticks_per_s) / total, 0.0), 1.0), "steal": steal}


@contextmanager
def during(cell_dir: Path, cores: list[int], stat: Path = Path("/proc/stat")) -> Iterator[None]:
    """Measure, around a run whose processes are all this process's children, what else took `cores`' time
    (`others_share`), and keep it in the run's `OTHER_LOAD_FILE` under "during" (with the run's "seconds")."""
    try:
        before, own, start = _times(stat, cores), _children_cpu_s(), time.monotonic()
    except (OSError, ValueError):
        yield
        return
    yield
    try:
        measured = others_share(before, _times(stat, cores), _children_cpu_s() - own)
    except (OSError, ValueError):
        return
    if measured is None:
        return
    path = cell_dir / OTHER_LOAD_FILE
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    kept = kept if isinstance(kept, dict) else {}
    kept["during"] = {**measured, "seconds": time.monotonic() - start}
    path.write_text(json.dumps(kept) + "\n")


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


def read_during(run_dir: Path) -> dict[str, Any] | None:
    """What took the run's cores' time while it ran (`during`), or None where it was not measured."""
    try:
        value = json.loads((run_dir / OTHER_LOAD_FILE).read_text())["during"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("others"), (int, float)):
        return None
    return value


def _heaviest_steal(during_run: dict[str, Any]) -> tuple[str, float] | None:
    steal = {str(core): float(share) for core, share in (during_run.get("steal") or {}).items()
             if isinstance(share, (int, float))}
    return max(steal.items(), key=lambda item: item[1]) if steal else None


def during_warning(rows: list[dict[str, Any]]) -> str | None:
    """One line naming the runs during which other work (or the hypervisor, on one core) took more than
    `BUSY_WARNING` of their cores' time."""
    busy = []
    for row in rows:
        measured = row.get("other_load_during")
        if not measured:
            continue
        steal = _heaviest_steal(measured)
        if measured["others"] > BUSY_WARNING or (steal and steal[1] > BUSY_WARNING):
            text = f"{row['name']} {100 * measured['others']:.0f}%"
            if steal and steal[1] > BUSY_WARNING:
                text += f" (the hypervisor took {100 * steal[1]:.0f}% of core {steal[0]})"
            busy.append(text)
    if not busy:
        return None
    again = ("the table's ranges show how much the repeated runs varied" if any((row.get("repeats") or 1) > 1 for row in rows)
             else "--repeat 3 would show how much the runs vary")
    runs = "a run" if len(busy) == 1 else f"{len(busy)} runs"
    its = "its" if len(busy) == 1 else "their"
    return (f"Other work took time on the cores while {runs} ran: {', '.join(busy)} of {its} cores' time, besides the "
            f"run's own processes. A core slowed for a while slows the rank bound to it, so {its} throughput, and "
            f"{its} imbalance above all, are partly the machine's, not the script's; {again}.")


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
