"""One optimizer step, split into what every rank measured: data wait, compute, exposed communication,
imbalance and the rest. Pure: `gpuscale.Meter` gathers the inputs from every rank and calls `split_step`.

Every rank reports its total data wait and its sync probes (`gpuscale.measure.syncprobe`). On a probed
step each rank knows what synchronising cost it: ``sync wait = synchronised backward - the same
backward replayed without synchronisation``. Across the ranks of that step:

    exposed communication = the smallest sync wait     (even the last rank to arrive waits this long)
    imbalance             = largest - smallest sync wait (the fastest rank idling for the slowest)

each the median over the probed steps (the first probe is dropped as warm-up when there are three
or more). The step is then seen from the reference rank, the one that waited longest, i.e. the
fastest: its data wait per step and its compute (forward and backward, replayed without
synchronisation, times the micro-batches per step) are the "data wait" and "compute" of the step;
what remains of the step time (optimizer step, the loop's own host work, measurement noise) is
"other":

    step = data_wait + compute + exposed_comm + imbalance + other

With one rank there is no synchronisation: exposed communication and imbalance are 0 and only
compute and other come from the probe. Without usable probes (the probe was off, or could not
measure the strategy) only the data wait is known; the result says why in ``why``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["PHASES", "split_step", "time_split"]

PHASES = ("startup", "data_wait", "compute", "exposed_comm", "imbalance", "eval", "checkpoint", "probe")
"""The keys of a summary's time_split_s (`time_split`), in the order reports stack and tabulate them."""


def _common_probes(ranks: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The probes every rank took, grouped by step (each group in rank order)."""
    by_rank = [{p["step"]: p for p in r.get("probes") or []} for r in ranks]
    steps = sorted(set.intersection(*(set(probes) for probes in by_rank))) if by_rank else []
    groups = [[probes[s] for probes in by_rank] for s in steps]
    return groups[1:] if len(groups) >= 3 else groups


def _sync_wait(probe: dict[str, Any]) -> float:
    return max(probe["synced_backward_s"] - probe["backward_s"], 0.0)


def _compute(probe: dict[str, Any]) -> float:
    return (probe["forward_s"] + probe["backward_s"]) * probe.get("micro_batches", 1)


def split_step(step_time_s: float | None, steps: int, ranks: Sequence[dict[str, Any]],
               unsupported: str | None = None) -> dict[str, Any]:
    """The step's split from every rank's ``{"rank", "data_wait_s" (total over the run), "probes": [...]}``.

    Returns ``{"status": "measured" | "not measured", "why": str | None, "probes": int,
    "reference_rank": int | None, "per_step_s": {"step", "data_wait", "compute", "exposed_comm",
    "imbalance", "other"}, "ranks": [{"rank", "data_wait_s", "compute_s", "sync_wait_s"}]}``, all
    seconds per optimizer step; parts that could not be measured are None.
    """
    ranks = sorted(ranks, key=lambda r: r["rank"])
    per_step = max(steps, 1)
    groups = _common_probes(ranks)
    waits = [[_sync_wait(p) for p in group] for group in groups]
    computes = [[_compute(p) for p in group] for group in groups]
    rank_rows = [{"rank": r["rank"], "data_wait_s": r["data_wait_s"] / per_step,
                  "compute_s": statistics.median(c[i] for c in computes) if groups else None,
                  "sync_wait_s": statistics.median(w[i] for w in waits) if groups else None}
                 for i, r in enumerate(ranks)]
    result: dict[str, Any] = {"status": "not measured", "why": None, "probes": len(groups), "reference_rank": None,
                              "per_step_s": {"step": step_time_s, "data_wait": None, "compute": None,
                                             "exposed_comm": None, "imbalance": None, "other": None},
                              "ranks": rank_rows}
    if not ranks:
        result["why"] = "no rank reported"
        return result
    if not groups:
        mean_wait = sum(r["data_wait_s"] for r in rank_rows) / len(rank_rows)
        result["per_step_s"]["data_wait"] = mean_wait
        result["why"] = unsupported or "no probed step: the run took fewer optimizer steps than the first probe (the 6th)"
        return result
    if len(ranks) == 1:
        exposed = imbalance = 0.0
        reference = 0
    else:
        exposed = statistics.median(min(w) for w in waits)
        imbalance = statistics.median(max(w) - min(w) for w in waits)
        reference = max(range(len(ranks)), key=lambda i: rank_rows[i]["sync_wait_s"])
    ref = rank_rows[reference]
    parts = {"data_wait": ref["data_wait_s"], "compute": ref["compute_s"], "exposed_comm": exposed, "imbalance": imbalance}
    other = step_time_s - sum(parts.values()) if step_time_s is not None else None
    result.update(status="measured", reference_rank=ref["rank"],
                  per_step_s={"step": step_time_s, **parts, "other": other})
    return result


def time_split(startup_s: float, train_s: float, steps: int, split: dict[str, Any], eval_s: float,
               checkpoint_s: float, probe_s: float) -> dict[str, float | None]:
    """The run's time in phases (seconds): startup, data wait, compute, exposed communication,
    imbalance, evaluation, checkpoints and the probe's replays.

    `train_s` is the training time (optimizer steps and their data waits, without evaluation,
    checkpoints and probes); its per-step parts come from `split` (`split_step`'s result) times the
    steps, and "compute" is what training time the others leave (the forward, backward and
    optimizer step, and the loop's own work). Communication and imbalance are None when not measured.
    """
    per_step = split["per_step_s"]
    data_wait = (per_step["data_wait"] or 0.0) * steps
    measured = split["status"] == "measured"
    exposed = per_step["exposed_comm"] * steps if measured else None
    imbalance = per_step["imbalance"] * steps if measured else None
    compute = max(train_s - data_wait - (exposed or 0.0) - (imbalance or 0.0), 0.0)
    return {"startup": startup_s, "data_wait": data_wait, "compute": compute, "exposed_comm": exposed,
            "imbalance": imbalance, "eval": eval_s, "checkpoint": checkpoint_s, "probe": probe_s}
