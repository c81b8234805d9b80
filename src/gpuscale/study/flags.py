"""Flags: what held a run back, each a cause with what was found and what to do about it. Pure.

Each flag is an item ``{"cause", "finding", "advice", "what", "value"}``: the cause names what went wrong (a
key), the finding says how much in this run (with its unit and denominator; `what` is its text with "{}" where
this run's `value` goes), the advice is the same for every run it applies to and fits the run's scaling. A row keeps
its items (``flag_items``) and their text (``flags``, "finding: advice"); the report groups the items of all runs by
cause and advice, so one cause is said once, with the runs it applies to (`group_flags`). Every reference in an advice
points to something the reader can see where they read it: a file the study wrote, or a section of report.md and
report.html named as such.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuscale.study.parts import NOISE_FLOOR, PART_LABELS, PARTS, noise_of
from gpuscale.study.sections import PREDICTION_SECTION

__all__ = ["STARVED_FRACTION", "UNDERUSED_RATIO", "BUSY_PCT", "ACCURACY_DROP", "SPREAD", "PART_FLAG", "spread", "row_flags", "set_flags",
           "group_flags"]

STARVED_FRACTION = 0.2
"""Waiting for data longer than this share of training time flags a starving loader."""
UNDERUSED_RATIO = 0.5
"""A device busy less than this share of the busiest device's utilisation is flagged as under-used."""
BUSY_PCT = 30.0
"""...provided the busiest device is above this, so that a uniformly idle run is not misread."""
ACCURACY_DROP = 0.02
SPREAD = 0.1
"""Repeated runs whose throughput spreads over more than this share of the median are flagged."""
PART_FLAG = 0.1
"""A part of lost efficiency above this share of ideal throughput (and beyond the noise) gets a flag with its fix."""


def _item(cause: str, what: str, value: str, advice: str = "") -> dict[str, str]:
    """A flag whose finding is `what` with this run's `value` in place of "{}"."""
    return {"cause": cause, "finding": what.replace("{}", value), "advice": advice, "what": what, "value": value}


def _devices(n: int) -> str:
    return f"{n} device" if n == 1 else f"{n} devices"


def _training_time(row: dict[str, Any]) -> float:
    split = row["time_split_s"] or {}
    return sum(float(split.get(k) or 0.0) for k in ("data_wait", "compute", "exposed_comm", "imbalance"))


def _data_flag(row: dict[str, Any], device: str) -> list[dict[str, str]]:
    split = row["time_split_s"] or {}
    training = _training_time(row)
    waited = float(split.get("data_wait") or 0.0) / training if training > 0 else 0.0
    if waited <= STARVED_FRACTION:
        return []
    what, value = "waited for data {} of its training time (data wait / training time, both in the time split)", f"{100 * waited:.0f}%"
    if device == "cpu":
        return [_item("data wait", what, value, "on CPUs the loader shares the cores with training; keep small data sets decoded "
                      "in memory, or give loading cores of its own")]
    return [_item("data wait", what, value, "the loader starves the GPU; give the DataLoader more workers (num_workers, cores "
                  "next to the GPU), pin memory, or read faster storage")]


def spread(row: dict[str, Any]) -> float:
    """How far the row's repeated runs spread: (max - min) / the median run's throughput; 0 for a single run."""
    runs = row.get("samples_per_s_runs") or []
    return (max(runs) - min(runs)) / row["samples_per_s"] if len(runs) > 1 and row["samples_per_s"] else 0.0


def _spread_flag(row: dict[str, Any]) -> list[dict[str, str]]:
    if spread(row) <= SPREAD:
        return []
    return [_item("noise", f"its {len(row['samples_per_s_runs'])} runs spread over {{}} of the median throughput",
                  f"{100 * spread(row):.0f}%", "the machine is noisy (shared nodes, frequency scaling); trust only larger differences")]


def _utilisation_flags(row: dict[str, Any], device: str) -> list[dict[str, str]]:
    flags = []
    devices = [d for d in ((row.get("utilisation") or {}).get("devices") or []) if d.get("util_mean") is not None]
    if len(devices) > 1:
        busiest = max(devices, key=lambda d: d["util_mean"])
        if busiest["util_mean"] >= BUSY_PCT:
            for d in devices:
                if d["util_mean"] < UNDERUSED_RATIO * busiest["util_mean"]:
                    unit = "of its cores" if str(d.get("device") or "cpu").startswith("cpu") else "of the time (GPU)"
                    finding = (f"rank {d['rank']} ({d.get('device')} on {d.get('host')}) was busy {d['util_mean']:.0f}% {unit} "
                               f"while rank {busiest['rank']} was busy {busiest['util_mean']:.0f}%")
                    flags.append(_item("under-used device", "{}", finding, "an idle or under-used device (uneven shards, work on "
                                       "one rank only, or a rank waiting on the others)"))
    elif len(devices) == 1 and device == "cuda" and devices[0]["util_mean"] < BUSY_PCT:
        flags.append(_item("idle GPU", "the GPU was busy only {} of the time", f"{devices[0]['util_mean']:.0f}%",
                           "a larger batch, more loader workers, or less host-side work per step"))
    return flags


_PART_FIXES = {
    "data": "the loader keeps up less well than on the baseline: more loader workers per rank, data decoded once, faster storage",
    "exposed_comm": "gradient synchronisation is not hidden behind compute: a larger per-device batch, gradient "
                    f"accumulation (fewer all-reduces per sample), a faster interconnect ({PREDICTION_SECTION} models it)",
    "imbalance": "one rank is slower on average and sets the pace (each rank's waits are in the run's summary.json): uneven "
                 "shards or loader workers, a rank doing extra work (logging, evaluation on rank 0 only), a slower device or "
                 "a busier node",
    "jitter": "no rank is slower on average, but on each step some rank lags and the others wait for it: the ranks' speed "
              "jitters (other processes on their cores, the OS scheduler, frequency changes, garbage collection); give each "
              "rank cores of its own with nothing else on them, or make steps longer (a larger per-device batch) so that "
              "the jitter weighs less",
    "rest": "not explained by the measured parts: a sample of steps that does not stand for the run (Why not more names "
            "it), host-side work per step (the optimizer step, logging, metrics that synchronise), or noise (--repeat 3)",
}
_COMPUTE_FIXES = {
    "shrank": "each device computes a sample more slowly than the baseline did: each device's batch per pass shrank "
              "(less efficient kernels); devices may also share caches or memory bandwidth",
    "same": "each device computes a sample more slowly than the baseline did with the same batch per pass: the devices "
            "share caches, memory bandwidth or cores (on CPUs, with the all-reduce's threads), or run at a lower clock",
}


def pass_shrank(row: dict[str, Any], base: dict[str, Any]) -> bool:
    """Whether each device's batch per pass is smaller than the baseline's (strong scaling without accumulation)."""
    return (row.get("per_device_batch") or 0) < (base.get("per_device_batch") or 0)


def _breakdown_flags(row: dict[str, Any], base: dict[str, Any]) -> list[dict[str, str]]:
    shares = row.get("loss_breakdown") or {}
    if all(shares.get(part) is None for part in PARTS[:-1]):
        return []  # nothing measured the causes: "rest" would be all of the loss, not an unexplained remainder
    # strong scaling shrinks each pass, unless the baseline accumulated and only the passes per step fell
    fixes = {**_PART_FIXES, "compute": _COMPUTE_FIXES["shrank" if pass_shrank(row, base) else "same"]}
    return [_item(part, f"lost {{}} of ideal throughput to {PART_LABELS[part]}{_who(row, part)}", f"{100 * share:.0f}%", fixes[part])
            for part, share in shares.items() if share is not None and share > max(PART_FLAG, noise_of(row, part) or NOISE_FLOOR)]


def _who(row: dict[str, Any], part: str) -> str:
    """For imbalance, the rank that is slower on average (which the others wait for), where the split named it."""
    slow = (row.get("sync_probe") or {}).get("slow_rank")
    return f": rank {slow} is slower on average" if part == "imbalance" and slow is not None else ""


def _phase_of_gap(row: dict[str, Any], base: dict[str, Any], key: str) -> str | None:
    """Where the validation metric first fell behind the baseline's by more than ACCURACY_DROP: "in phase P (epoch E: a vs b)"."""
    mine, theirs = row.get("per_epoch") or [], base.get("per_epoch") or []
    for a, b in zip(mine, theirs, strict=False):
        if not (isinstance(a, dict) and isinstance(b, dict)) or a.get(key) is None or b.get(key) is None:
            continue
        if b[key] - a[key] > ACCURACY_DROP:
            phase = f"in phase '{a['phase']}' " if a.get("phase") else ""
            return f"{phase}(epoch {a.get('epoch', '?')}: validation {a[key]:.3f} against {b[key]:.3f})"
    return None


def _rule(row: dict[str, Any]) -> str:
    lr = row.get("lr")
    return f"lr rule '{lr['rule']}'" if lr else "no lr rule recorded"


def _accuracy_flags(row: dict[str, Any], base: dict[str, Any]) -> list[dict[str, str]]:
    if row["metric"] != "accuracy" or base["metric_value"] is None or row["metric_value"] is None \
            or base["metric_value"] - row["metric_value"] <= ACCURACY_DROP:
        return []
    finding = (f"accuracy {row['metric_value']:.3f} against {base['metric_value']:.3f} on {_devices(base['world_size'])} "
               f"({_rule(row)})")
    gap = _phase_of_gap(row, base, "val_accuracy")
    if gap:
        finding += f"; it fell behind {gap}"
    advice = ""
    if row["global_batch"] != base["global_batch"]:
        finding += (f"; the global batch is {row['global_batch']} instead of {base['global_batch']}, so there are fewer "
                    "steps per epoch")
        if not row.get("lr") or row["lr"]["rule"] == "none":
            advice = "scale the learning rate with the batch (--lr-scaling linear, with warm-up), or use strong scaling"
        else:
            advice = "try more epochs or a longer warm-up (--lr-warmup-steps)"
    return [_item("accuracy", "{}", finding, advice)]


def row_flags(row: dict[str, Any], base: dict[str, Any], device: str) -> list[dict[str, str]]:
    """The flags of `row` against its baseline `base` (the row itself for a baseline, or a run without one)."""
    flags = _data_flag(row, device) + _spread_flag(row) + _utilisation_flags(row, device)
    if row is base:
        return flags
    return flags + _breakdown_flags(row, base) + _accuracy_flags(row, base)


def set_flags(row: dict[str, Any], items: list[dict[str, str]]) -> None:
    """Give `row` its flag items and their text ("finding: advice")."""
    row["flag_items"] = items
    row["flags"] = [f"{item['finding']}: {item['advice']}" if item["advice"] else item["finding"] for item in items]


def group_flags(rows: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """One (runs, text) per cause and advice, in the order first met: the runs it applies to, what was found in each
    ("run: finding; run: finding", or the finding once where it is the same in all), then the advice once. A row
    without items (results.json of an older gpuscale) contributes its flag texts, each its own cause. A cause found in
    every run of more than two reads "all runs"."""
    rows = list(rows)
    groups: dict[tuple[str, str, str], list[tuple[str, dict[str, str]]]] = {}
    for row in rows:
        items = row.get("flag_items")
        if items is None:
            items = [_item(text, "{}", text) for text in row.get("flags") or []]
        for item in items:
            what = item.get("what") or "{}"
            groups.setdefault((item["cause"], item["advice"], what), []).append((row["name"], item))
    everyone = {row["name"] for row in rows}
    out = []
    for (_, advice, what), found in groups.items():
        values = list(dict.fromkeys(item.get("value", item["finding"]) for _, item in found))
        if len(values) == 1:
            said = found[0][1]["finding"]
        elif what == "{}":  # a finding without a common text: each run's own
            said = "; ".join(f"{name}: {item['finding']}" for name, item in found)
        else:
            said = what.replace("{}", ", ".join(f"{item['value']} in {name}" for name, item in found))
        names = list(dict.fromkeys(name for name, _ in found))
        runs = "all runs" if len(names) > 2 and set(names) == everyone else ", ".join(names)
        out.append((runs, f"{said}: {advice}" if advice else said))
    return out
