"""One optimizer step, split into what every rank measured: data wait, compute, exposed communication,
imbalance and the rest. Pure: `gpuscale.Meter` gathers the inputs from every rank and calls `split_step`.

Every rank reports its total data wait and its sync probes (`gpuscale.measure.syncprobe`). On a probed
step each rank knows what synchronising cost it: ``sync wait = synchronised backward - the same
backward replayed without synchronisation``. Across the ranks of that step:

    exposed communication = the smallest sync wait     (even the last rank to arrive waits this long)
    imbalance             = largest - smallest sync wait (the fastest rank idling for the slowest)

each the median over the probed steps (the first probe is dropped as warm-up when there are three
or more), or, for DDP's timers on every step, the mean over the steps after warm-up. Imbalance is split
into a persistent part (one rank slower on average: the gap between the ranks' average waits, the slow
rank named) and jitter (waiting that changes rank from step to step). The step is then seen from the
reference rank, the one that waited longest on average, i.e. the fastest: its data wait per step and
its compute (forward and backward, replayed without synchronisation, times the micro-batches per
step) are the "data wait" and "compute" of the step;
what remains of the step time (optimizer step, the loop's own host work, measurement noise) is
"other":

    step = data_wait + compute + exposed_comm + imbalance + other

With one rank there is no synchronisation: exposed communication and imbalance are 0 and only
compute and other come from the probe. Without usable probes (the probe was off, or could not
measure the strategy) only the data wait is known; the result says why in ``why``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["PHASES", "split_step", "time_split"]

PHASES = ("startup", "data_wait", "compute", "exposed_comm", "imbalance", "eval", "checkpoint", "probe", "after_training")
"""The keys of a summary's time_split_s (`time_split`), in the order reports stack and tabulate them. Together they
are the run's time to result (summaries before "after_training" lack it)."""


def _common_probes(ranks: Sequence[dict[str, Any]], warmup: int | None) -> list[list[dict[str, Any]]]:
    """The probes every rank took, grouped by step (each group in rank order), warm-up left out: with `warmup`,
    the steps up to it where at least 10 come after it; otherwise the first probe where there are three or more."""
    by_rank = [{p["step"]: p for p in r.get("probes") or []} for r in ranks]
    steps = sorted(set.intersection(*(set(probes) for probes in by_rank))) if by_rank else []
    groups = [[probes[s] for probes in by_rank] for s in steps]
    if warmup is not None and sum(s > warmup for s in steps) >= 10:
        return [g for s, g in zip(steps, groups, strict=True) if s > warmup]
    return groups[1:] if len(groups) >= 3 else groups


def _sync_wait(probe: dict[str, Any]) -> float:
    return max(probe["synced_backward_s"] - probe["backward_s"], 0.0)


def _compute(probe: dict[str, Any]) -> float:
    """What the rank computed in a probed step: forward, the host work before its backward (DDP's timers), backward."""
    return (probe["forward_s"] + (probe.get("host_s") or 0.0) + probe["backward_s"]) * probe.get("micro_batches", 1)


UNHINDERED_QUANTILE = 0.1
"""The backward's time with no all-reduce beside it: the fastest tenth of the ranks' backward passes in the run."""


def _slowed_backward(groups: list[list[dict[str, Any]]], average: Callable[[list[float]], float]) -> list[float]:
    """How much longer each rank's backward took than with no all-reduce beside it, in seconds per step.

    DDP's timers time the backward with the all-reduce running beside it (gloo's threads on the rank's cores,
    NCCL's kernels on its SMs). Every rank runs the same model on the same batch size, and on the steps where the
    others came late the all-reduce had nothing to do beside the backward: the fastest tenth of all ranks'
    backward passes (`UNHINDERED_QUANTILE`) stands for the backward alone, and each rank's average beyond it is
    what synchronising cost its backward."""
    passes = sorted(p["backward_s"] for group in groups for p in group)
    alone = passes[int(UNHINDERED_QUANTILE * (len(passes) - 1))]
    return [max(average([group[i]["backward_s"] for group in groups]) - alone, 0.0) for i in range(len(groups[0]))]


def _imbalance(waits: list[list[float]], average: Callable[[list[float]], float]) -> dict[str, Any]:
    """The fastest rank's waiting for the slowest, split in two. Per step, imbalance is the largest sync wait less the
    smallest. Its **persistent** part is what one rank lags on average: the gap between the ranks' average waits
    (the slow rank waits least); its **jitter** the rest, waiting that changes rank from step to step."""
    total = average([max(w) - min(w) for w in waits])
    per_rank = [average([w[i] for w in waits]) for i in range(len(waits[0]))]
    persistent = min(max(per_rank) - min(per_rank), total)
    slow = min(range(len(per_rank)), key=lambda i: per_rank[i])
    return {"total": total, "persistent": persistent, "jitter": total - persistent, "slow": slow, "per_rank": per_rank}


def split_step(step_time_s: float | None, steps: int, ranks: Sequence[dict[str, Any]],
               unsupported: str | None = None, *, average: str = "median", warmup: int | None = None,
               slowed_backward: bool = False) -> dict[str, Any]:
    """The step's split from every rank's ``{"rank", "data_wait_s" (total over the run), "probes": [...]}``.

    average: how the probed steps are summarised, "median" (a few sync probes, robust to one odd step) or "mean"
    (DDP's timers on every step: what the run lost on average); warmup: the step after which probes count, where
    enough come after it (`_common_probes`); slowed_backward: the probes time the backward with the all-reduce
    beside it (DDP's timers; a replay does not), so what that cost the backward (`_slowed_backward`) is moved to
    exposed communication: the reference rank's from its compute, and the slow rank's excess over it from the
    persistent imbalance (a rank that lags because its all-reduce ran beside its backward lags for communication).

    Returns ``{"status": "measured" | "not measured", "why": str | None, "probes": int (the steps the parts rest
    on), "of_steps": int, "reference_rank": int | None, "slow_rank": int | None, "per_step_s": {"step", "data_wait",
    "compute", "exposed_comm", "imbalance", "persistent_imbalance", "jitter", "other",
    "comm_slowdown", "sampled_step"}, "ranks": [{"rank", "data_wait_s", "compute_s", "sync_wait_s"}]}``, all seconds per optimizer
    step; parts that could not be measured are None. "imbalance" is persistent_imbalance + jitter (`_imbalance`);
    sampled_step is the probed steps' own wall time where the probes carry it (``step_s``), to compare with step.
    """
    summarise: Callable[[list[float]], float] = statistics.fmean if average == "mean" else statistics.median
    ranks = sorted(ranks, key=lambda r: r["rank"])
    per_step = max(steps, 1)
    groups = _common_probes(ranks, warmup)
    waits = [[_sync_wait(p) for p in group] for group in groups]
    computes = [[_compute(p) for p in group] for group in groups]
    rank_rows = [{"rank": r["rank"], "data_wait_s": r["data_wait_s"] / per_step,
                  "compute_s": summarise([c[i] for c in computes]) if groups else None,
                  "sync_wait_s": summarise([w[i] for w in waits]) if groups else None}
                 for i, r in enumerate(ranks)]
    result: dict[str, Any] = {"status": "not measured", "why": None, "probes": len(groups), "of_steps": steps,
                              "reference_rank": None, "slow_rank": None,
                              "per_step_s": {"step": step_time_s, "data_wait": None, "compute": None,
                                             "exposed_comm": None, "imbalance": None,
                                             "persistent_imbalance": None, "jitter": None, "other": None, "comm_slowdown": None,
                                             "sampled_step": None},
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
        imbalance: dict[str, Any] = {"total": 0.0, "persistent": 0.0, "jitter": 0.0, "slow": None, "per_rank": [0.0]}
        exposed, reference = 0.0, 0
    else:
        imbalance = _imbalance(waits, summarise)
        exposed = summarise([min(w) for w in waits])
        reference = max(range(len(ranks)), key=lambda i: imbalance["per_rank"][i])
    ref = rank_rows[reference]
    mine = [group[reference] for group in groups]
    slowed = 0.0
    if slowed_backward and len(ranks) > 1:
        by_rank = _slowed_backward(groups, summarise)
        lag = min(max(by_rank[imbalance["slow"]] - by_rank[reference], 0.0), imbalance["persistent"]) if imbalance["slow"] is not None else 0.0
        slowed = by_rank[reference] + lag
        exposed += slowed
        ref = {**ref, "compute_s": ref["compute_s"] - by_rank[reference]}
        imbalance = {**imbalance, "total": imbalance["total"] - lag, "persistent": imbalance["persistent"] - lag}
    parts = {"data_wait": ref["data_wait_s"], "compute": ref["compute_s"], "exposed_comm": exposed, "imbalance": imbalance["total"]}
    other = step_time_s - sum(parts.values()) if step_time_s is not None else None
    wall = [p["step_s"] for p in mine if p.get("step_s") is not None]
    result.update(status="measured", reference_rank=ref["rank"],
                  slow_rank=ranks[imbalance["slow"]]["rank"] if imbalance["persistent"] > 0 and imbalance["slow"] is not None else None,
                  per_step_s={"step": step_time_s, **parts, "other": other,
                              "persistent_imbalance": imbalance["persistent"], "jitter": imbalance["jitter"],
                              "comm_slowdown": slowed if slowed_backward else None,
                              "sampled_step": summarise(wall) if wall else None})
    return result


def time_split(startup_s: float, train_s: float, steps: int, split: dict[str, Any], eval_s: float,
               checkpoint_s: float, probe_s: float, whole_s: float | None = None) -> dict[str, float | None]:
    """The run's time in phases (seconds): startup, data wait, compute, exposed communication,
    imbalance, evaluation, checkpoints, the probe's replays, and what the run did after training.

    `train_s` is the training time (optimizer steps and their data waits, without evaluation,
    checkpoints and probes); its per-step parts come from `split` (`split_step`'s result) times the
    steps, and "compute" is what training time the others leave (the forward, backward and
    optimizer step, and the loop's own work). Communication and imbalance are None when not measured.
    `whole_s` is the run's time to result: "after_training" is what of it the other phases leave (a script's own
    saving and end after its last step, as the probe sees it; about 0 where a Meter's summary ends the run), so the
    phases add up to the time to result. None without `whole_s`.
    """
    per_step = split["per_step_s"]
    data_wait = (per_step["data_wait"] or 0.0) * steps
    measured = split["status"] == "measured"
    exposed = per_step["exposed_comm"] * steps if measured else None
    imbalance = per_step["imbalance"] * steps if measured else None
    compute = max(train_s - data_wait - (exposed or 0.0) - (imbalance or 0.0), 0.0)
    phases: dict[str, float | None] = {"startup": startup_s, "data_wait": data_wait, "compute": compute, "exposed_comm": exposed,
                                       "imbalance": imbalance, "eval": eval_s, "checkpoint": checkpoint_s, "probe": probe_s}
    accounted = sum(value or 0.0 for value in phases.values())
    phases["after_training"] = None if whole_s is None else max(0.0, whole_s - accounted)
    return phases
