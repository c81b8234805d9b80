"""The utilisation timeline's documents, from the samples every rank's `gpuscale.measure.monitor` took.

Pure functions, no torch: the probe merges ranks' records into a summary with them after the
training processes have ended, and `gpuscale.measure.monitor` (which samples) exports the same names.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TIMELINE_VERSION", "device_stats", "make_timeline"]

TIMELINE_VERSION = 1


def _mean(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def device_stats(series: dict[str, Any]) -> dict[str, Any]:
    """One device's line of the summary: utilisation and power over t >= 0 (training), peak memory over all."""
    training = [i for i, t in enumerate(series["t"]) if t >= 0]
    util = [series["util_pct"][i] for i in training if series["util_pct"][i] is not None]
    mems = [m for m in series["mem_bytes"] if m is not None]
    return {key: series[key] for key in ("rank", "host", "device", "name", "source")} | {
        "util_mean": _mean(util), "util_max": max(util) if util else None,
        "mem_peak_bytes": max(mems) if mems else None,
        "power_mean_w": _mean([series["power_w"][i] for i in training]),
    }


def make_timeline(series: list[dict[str, Any]], interval_s: float | None, started: float | None) -> dict[str, Any]:
    """The timeline.json document from every rank's series."""
    return {"version": TIMELINE_VERSION, "interval_s": interval_s, "started": started,
            "series": sorted(series, key=lambda s: s["rank"])}
