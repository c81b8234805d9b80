"""The answer first: what the study found, in a few plain sentences, and what to ask for. Pure.

    answer(results, target_efficiency=0.75) -> ["Strong scaling to 2 processes: 1.36x faster (68% of ideal); ...", ...]

Built from the same numbers as the table, claiming nothing the table does not show, one sentence per scaling:
its largest run against its baseline (speed-up, efficiency, what each sample costs in device-hours against
the baseline's; a speed-up below 1 reads as the slowdown it is), the recommendation (the largest run whose
efficiency stays at or above the target, `--target-efficiency`, and whose throughput beats the baseline's beyond
the noise: `faster`; where none beyond the baseline does, the baseline's scale), the biggest measured loss
beyond the noise with its cure where it kept a run from the target, and for weak scaling whether accuracy held.
"""

from __future__ import annotations

from typing import Any

from gpuscale.study.flags import ACCURACY_DROP, pass_shrank
from gpuscale.study.numbers import three_figures
from gpuscale.study.parts import NOISE_FLOOR, PART_LABELS, noise_of
from gpuscale.study.sections import PREDICTION_SECTION

__all__ = ["TARGET_EFFICIENCY", "answer", "check_target", "faster"]

TARGET_EFFICIENCY = 0.75
"""The efficiency a run must keep to be recommended (`--target-efficiency`)."""

_CURES = {
    "data": "more loader workers per rank (or data decoded once) would feed the devices faster",
    "exposed_comm": "a larger per-device batch or gradient accumulation would hide more of the synchronisation",
    "imbalance": "evening out the ranks' work (shards, loader workers, work on rank 0 only) would stop the others waiting",
    "jitter": "cores of its own for each rank, with nothing else on them, or longer steps would make the ranks' jitter weigh less",
    "compute": "each device computes a sample more slowly than alone; a larger per-device batch keeps its kernels efficient",
    "compute_same_pass": "each device computes a sample more slowly than alone with the same batch per pass: the devices "
                         "share caches, memory bandwidth or cores",
    "rest": "--repeat 3 would tell noise from host work per step (the optimizer step, logging)",
}


def check_target(value: float) -> float:
    """--target-efficiency: a fraction in (0, 1]; ValueError naming the fix otherwise."""
    if not 0 < value <= 1:
        raise ValueError(f"--target-efficiency {value} must be a fraction of ideal in (0, 1], e.g. 0.75 for 75%")
    return value


def _pct(share: float) -> str:
    return f"{100 * share:.0f}%"


def _units(results: dict[str, Any], n: int) -> str:
    unit = "GPU" if results.get("device") in ("cuda", "rocm") else "process"
    return f"{n} {unit}" + ("" if n == 1 else "es" if unit == "process" else "s")


def _biggest_loss(row: dict[str, Any]) -> tuple[str, float] | None:
    shares = {part: share for part, share in (row.get("loss_breakdown") or {}).items() if share is not None}
    if set(shares) <= {"rest"}:  # no cause measured: "rest" would be the whole loss, not a finding
        return None
    part, share = max(shares.items(), key=lambda item: item[1])
    return (part, share) if share > (noise_of(row, part) or NOISE_FLOOR) else None


def _accuracy(row: dict[str, Any], base: dict[str, Any]) -> str:
    if row.get("metric") != "accuracy" or row.get("metric_value") is None or base.get("metric_value") is None:
        return ""
    mine, theirs = row["metric_value"], base["metric_value"]
    rule = (row.get("lr") or {}).get("rule")
    how = f" with --lr-scaling {rule}" if rule and rule != "none" else ""
    if theirs - mine > ACCURACY_DROP:
        return f"; accuracy falls to {mine:.3f}{how}, from {theirs:.3f}"
    return f"; accuracy holds{how} ({mine:.3f} against {theirs:.3f})"


def _loss_text(row: dict[str, Any], base: dict[str, Any], cure: bool) -> str:
    loss = _biggest_loss(row)
    if not loss:
        return ""
    part, share = loss
    what = f"unexplained by the measured parts ({_pct(share)} of ideal)" if part == "rest" else f"{PART_LABELS[part]} ({_pct(share)} of ideal)"
    if part == "compute" and not pass_shrank(row, base):  # only the passes per step changed, or nothing did
        part = "compute_same_pass"
    return f"; the biggest loss is {what}" + (f": {_CURES[part]}" if cure else "")


def _sentence(results: dict[str, Any], rows: list[dict[str, Any]], base: dict[str, Any], target: float) -> str | None:
    """One scaling in one sentence: its largest run against the baseline, what each sample cost, the largest run that
    keeps the target efficiency, the biggest loss with its cure, and (weak scaling) whether accuracy held."""
    compared = [r for r in rows if r is not base and r.get("speedup") is not None]
    if not compared:
        return None
    top = max(compared, key=lambda r: (r["world_size"], r["samples_per_s"]))
    label = f"{top['scaling'].capitalize()} scaling" + (f" ({top['variant']})" if top.get("variant") else "")
    ignored = [r["name"] for r in (base, *compared) if r.get("batch_ignored")]
    trained = {(r.get("per_device_batch") or 0) * (r.get("grad_accum_steps") or 1) for r in (base, *compared)}
    if ignored and (top["scaling"] == "strong" or len(trained) > 1):
        # the runs trained batches of the script's choosing, not this scaling's (the same batch on every device is
        # still weak scaling, at the script's batch: the note below names it)
        return (f"{label} to {_units(results, top['world_size'])}: not measured, the script ignored the batch the study "
                f"planned in {', '.join(ignored)} (below), so these runs are no {top['scaling']} scaling; pass the batch "
                "template to the option the script reads and run the study again.")
    text = f"{label} to {_units(results, top['world_size'])}: {_gain(results, top, base)} ({_pct(top['efficiency'])} of ideal)"
    if top.get("cost_ratio") is not None:
        text += f" for {top['cost_ratio']:.2f}x the device-hours per sample"
        if top.get("billed_per_m_samples") is not None and base.get("billed_per_m_samples") is not None:
            unit = (top.get("billing") or {}).get("unit", "billing units")
            text += (f" ({three_figures(top['billed_per_m_samples'])} {unit} per million samples against "
                     f"{three_figures(base['billed_per_m_samples'])})")
    on_target = [r for r in compared if r["efficiency"] >= target]
    kept = [r for r in on_target if faster(r, base)]  # paying for more devices for fewer samples/s is no recommendation
    best = max(kept, key=lambda r: (r["world_size"], r["samples_per_s"])) if kept else None
    if best is top:
        text += f"; ask for {_units(results, top['world_size'])}, the largest run at or above the {_pct(target)} target"
    elif best is None and on_target:
        text += (f"; ask for {_units(results, base['world_size'])}: no run beyond it both keeps the {_pct(target)} target "
                 "and gets more samples/s than it beyond the noise")
    elif best is None:
        text += f"; no run beyond {_units(results, base['world_size'])} keeps the {_pct(target)} target"
    else:
        text += (f"; ask for {_units(results, best['world_size'])} ({best['name']}, {_pct(best['efficiency'])} of ideal, "
                 f"{three_figures(best['samples_per_s'])} samples/s), the largest run at or above the {_pct(target)} target")
    text += _loss_text(top, base, cure=best is not top)
    if top["scaling"] == "weak":
        text += _accuracy(top, base)
    return text + "." + _beyond(results, top)


def faster(row: dict[str, Any], base: dict[str, Any]) -> bool:
    """Whether `row` got more samples/s than its baseline beyond the comparison's noise: its speed-up above 1 by more
    than the noise (a share of ideal throughput, at least NOISE_FLOOR) times the devices over the baseline's. At 2
    devices and 3% noise a speed-up must pass 1.06x: 1.05x is within the noise of no gain at all."""
    devices = row["world_size"] / base["world_size"]
    return row["speedup"] - max(NOISE_FLOOR, row.get("noise") or 0.0) * devices > 1


def _gain(results: dict[str, Any], top: dict[str, Any], base: dict[str, Any]) -> str:
    """The largest run's speed-up in words that never call a slowdown a gain: "1.36x faster" or "0.80x as fast: slower
    than 1 process" (strong scaling), "1.80x the samples/s" or "0.93x the samples/s: fewer samples/s than 1 process" (weak)."""
    speedup, than = top["speedup"], _units(results, base["world_size"])
    if top["scaling"] == "strong":
        if round(speedup, 2) > 1:
            return f"{speedup:.2f}x faster"
        return f"{speedup:.2f}x as fast" + (f": slower than {than}" if round(speedup, 2) < 1 else "")
    return f"{speedup:.2f}x the samples/s" + (f": fewer samples/s than {than}" if round(speedup, 2) < 1 else "")


def _beyond(results: dict[str, Any], top: dict[str, Any]) -> str:
    """The scales the study did not run, as the prediction sees them: " Predicted, not run: 4 processes 1.8x (45% of
    ideal), ...; below 97 samples per device a step of 8 GPUs would communicate longer than it computes."

    The model knows communication only. Where the largest run measured less than the model predicted for it (beyond
    the noise), the losses the model leaves out are carried to the scales not run, as the same share of each step:
    "... It predicted 88% for 2 processes, which measured 68%; if the losses it leaves out keep their share of each
    step: 4 processes 2.3x (59% of ideal)". Otherwise a prediction above the target beside a run that missed it
    would read as advice to ask for more."""
    prediction = results.get("prediction") or {}
    cells = prediction.get("cells") or []
    ahead = [c for c in cells if c.get("run") is False and c.get("efficiency") is not None
             and c.get("name", "").startswith(top["name"].rsplit("-", 1)[0] + "-")]
    if not ahead:
        return ""
    said = []
    for cell in ahead:
        said.append(f"{_units(results, cell['world_size'])}{_on_nodes(cell)} {cell['efficiency'] * cell['world_size']:.1f}x "
                    f"({_pct(cell['efficiency'])} of ideal)")
    text = f" Predicted, not run (the model: {PREDICTION_SECTION}): {', '.join(said)}"
    last = ahead[-1]
    below = last["comm_dominates_below_batch"] if "comm_dominates_below_batch" in last else (  # its group's; older: the first's
        (prediction.get("comm_dominates_below_batch") or {}).get(f"{last['nodes']}x{last['world_size'] // max(1, last['nodes'])}"))
    if isinstance(below, (int, float)) and below > 1:
        text += (f"; below {below:.0f} samples per device a step of {_units(results, last['world_size'])} would "
                 "communicate longer than it computes")
    return text + "." + _left_out(results, top, cells, ahead)


def _on_nodes(cell: dict[str, Any]) -> str:
    return f" on {cell['nodes']} nodes" if cell.get("nodes", 1) > 1 else ""


def _left_out(results: dict[str, Any], top: dict[str, Any], cells: list[dict[str, Any]], ahead: list[dict[str, Any]]) -> str:
    """The scales not run with the losses the model left out of the largest run (its measured over its predicted
    efficiency) keeping their share of each step; "" where the model met that run within its noise, or was below it."""
    modelled = next((c.get("efficiency") for c in cells if c.get("run") is not False and c.get("name") == top["name"]), None)
    if not modelled or top.get("efficiency") is None:
        return ""
    if modelled - top["efficiency"] <= max(NOISE_FLOOR, top.get("noise") or 0.0):
        return ""
    kept = top["efficiency"] / modelled
    said = [f"{_units(results, c['world_size'])}{_on_nodes(c)} {c['efficiency'] * kept * c['world_size']:.1f}x "
            f"({_pct(c['efficiency'] * kept)} of ideal)" for c in ahead]
    return (f" It predicted {_pct(modelled)} for {_units(results, top['world_size'])}, which measured "
            f"{_pct(top['efficiency'])}; if the losses it leaves out keep their share of each step: {', '.join(said)}.")


def answer(results: dict[str, Any], target_efficiency: float = TARGET_EFFICIENCY) -> list[str]:
    """The study's findings in plain sentences, one per scaling (and variant), from `results` (results.json's schema)."""
    sentences = []
    by_name = {row["name"]: row for row in results.get("rows") or []}
    order = {name: i for i, name in enumerate(by_name)}  # the table's order (the baselines' keys sort by name)
    for name in sorted((results.get("baseline") or {}).values(), key=lambda name: order.get(name, len(order))):
        base = by_name.get(name)
        if base is None:
            continue
        rows = [r for r in by_name.values() if r["scaling"] == base["scaling"] and r.get("variant", "") == base.get("variant", "")]
        said = _sentence(results, rows, base, target_efficiency)
        if said:
            sentences.append(said)
    for key, name in (results.get("missing_baseline") or {}).items():
        sentences.append(f"{key.replace('/', ' ').capitalize()} scaling: no speed-up to show, its baseline {name} did not finish.")
    return sentences
