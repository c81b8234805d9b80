"""Is each run of a study the experiment it planned? Checked before any speed-up is shown. Pure.

- the planned baseline of each scaling (its smallest cell), finished or not: a scaling whose baseline failed
  shows no speed-up, since its next smallest run would pass for a perfect baseline (`planned_baselines`);
- the batch each rank really trained against the one planned, and runs that were one experiment twice;
- ranks that trained independent copies instead of one model (`check_experiments`).
"""

from __future__ import annotations

import re
from typing import Any

from gpuscale.study.command import BATCH_TEMPLATES, StudyCommand, baseline_world_size
from gpuscale.study.matrix import Cell
from gpuscale.study.runner import LOG_FILE

__all__ = ["group_key", "planned_baselines", "check_experiments", "missing_baseline_note"]


def group_key(variant: str, scaling: str) -> str:
    """How results["baseline"] (and "missing_baseline") name a scaling: 'weak', or 'VARIANT/weak' in a study with variants."""
    return f"{variant}/{scaling}" if variant else scaling


def planned_baselines(cells: list[Cell]) -> dict[str, str]:
    """The planned baseline of each scaling (and variant), by `group_key`: its smallest cell, whether it finished or not."""
    smallest: dict[str, Cell] = {}
    for cell in cells:
        key = group_key(cell.variant, cell.scaling)
        if key not in smallest or (cell.world_size, cell.nodes) < (smallest[key].world_size, smallest[key].nodes):
            smallest[key] = cell
    return {key: cell.base_name for key, cell in smallest.items()}


def check_experiments(rows: list[dict[str, Any]], study: dict[str, Any], cells: list[Cell]) -> list[str]:
    """Check that each run is the experiment the study planned, before any speed-up is shown: one line per finding.

    - Each rank trained the per-device batch the study planned per optimizer step, in passes of any size (where
      the script's arguments carry a batch template and something other than that template counted the samples):
      a script that ignores the template trains its own batch, and its row shows the batch it really trained.
      Runs of weak and strong scaling on the same devices that trained the same batches were then one experiment,
      twice.
    - With more than one rank, the ranks trained one model (`probe.merge.synchronised`); independent copies get
      no speed-up (`analyse_rows`).
    """
    notes = []
    argv = tuple(str(arg) for arg in study.get("command") or [])
    command = None
    if study.get("batch") and set(BATCH_TEMPLATES) & {t for arg in argv for t in re.findall(r"\{(\w+)\}", arg)}:
        command = StudyCommand(argv=argv, appends_cell_options=False, **study["batch"])
    by_name = {cell.base_name: cell for cell in cells}
    ignored = []
    for row in rows:
        cell = by_name.get(row["name"])
        if command is not None and cell is not None:
            plan = command.batch_plan(cell, baseline_world_size(cells, cell))
            row["planned_per_device_batch"] = plan.per_device_batch if plan else None
            # per optimizer step: a script may split the planned batch into passes of its own (Accelerate's
            # nlp_example accumulates above a pass size it chose), and still train exactly the batch planned
            trained = (row.get("per_device_batch") or 0) * (row.get("grad_accum_steps") or 1)
            planned = plan.per_device_batch * plan.grad_accum_steps if plan else None
            row["batch_ignored"] = bool(planned and trained and row.get("samples_from") != "study batch" and trained != planned)
            if row["batch_ignored"]:
                ignored.append(f"{row['name']} ({_per_step(row)}, not {planned})")
        if row["world_size"] > 1 and row["synchronised"] is False:
            notes.append(f"{row['name']}: its {row['world_size']} ranks trained independent copies of the model (no rank joined a "
                         "process group of more than one with a backend, and none made a DDP model), so it shows no speed-up. "
                         + _unsynchronised_cause(row))
    if ignored:
        notes.append("The script ignored the batch the study planned: each rank trained its own batch per step, shown in the "
                     "table, in " + ", ".join(ignored) + ". Pass the batch template to the option the script reads "
                     "(e.g. --batch-size {per_device_batch}).")
    return notes + _same_experiments(rows) + _same_work(rows)


def _per_step(row: dict[str, Any]) -> str:
    """A row's samples per device per optimizer step, with its passes where it accumulates: "64 (16 x 4)"."""
    batch, passes = row.get("per_device_batch") or 0, row.get("grad_accum_steps") or 1
    return f"{batch * passes} ({batch} x {passes})" if passes > 1 else str(batch)


def _unsynchronised_cause(row: dict[str, Any]) -> str:
    """The likely cause of ranks that never synchronised, from the libraries the ranks had loaded (the probe's record)."""
    libraries = set(row.get("libraries") or [])
    if libraries & {"accelerate", "transformers"}:
        return ("An HF Trainer or Accelerate script on CPUs distributes only when told to (in the versions that ask for it): "
                "ACCELERATE_USE_CPU=1 in the environment, or Accelerator(cpu=True).")
    if libraries & {"lightning", "pytorch_lightning"}:
        return ("A Lightning Trainer distributes over the launcher's processes when told the world it is in: "
                "--devices {nproc_per_node} --num-nodes {nodes}, with a DDP strategy.")
    if libraries:
        return f"The script loaded {', '.join(sorted(libraries))} but never set up distributed training with it."
    return ("The script never calls torch.distributed.init_process_group nor wraps its model in DistributedDataParallel: a "
            "single-device script started on N processes trains N copies. Add both (the PyTorch DDP tutorial's few lines), "
            "or gpuscale.init() and gpuscale.setup().")


def _same_experiments(rows: list[dict[str, Any]]) -> list[str]:
    """Runs of different scalings on the same devices that trained the same batches: one experiment, twice (the
    baselines of weak and strong scaling often are; so are all runs of a script that ignored the planned batch)."""
    seen: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        key = (row.get("variant"), row["nodes"], row["nproc_per_node"], row.get("per_device_batch"), row.get("grad_accum_steps"))
        seen.setdefault(key, []).append(row)
    notes = []
    for same in seen.values():
        if len({r["scaling"] for r in same}) < 2:
            continue
        names = " and ".join(r["name"] for r in same)
        ran = [r for r in same if not r.get("same_as")]
        if len(ran) == 1:
            notes.append(f"{names} are one run (the same command on the same devices): it ran once, as {ran[0]['name']}, "
                         "and stands for both")
        else:
            notes.append(f"{names} ran the same experiment (the same batches on the same devices): their difference is noise")
    return notes


WORK_TOLERANCE = 0.05
"""Runs of one scaling whose trained samples differ by more than this share trained different amounts of work (a
last partial batch dropped on more devices stays within it)."""


def _same_work(rows: list[dict[str, Any]]) -> list[str]:
    """Runs of one scaling that trained different numbers of samples (a script that stops after a fixed number of
    steps, not epochs): their times to result are not comparable."""
    notes = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row.get("variant") or "", row["scaling"]), []).append(row)
    for (variant, scaling), group in groups.items():
        counted = [r for r in group if r.get("samples")]
        if len(counted) < 2 or max(r["samples"] for r in counted) <= (1 + WORK_TOLERANCE) * min(r["samples"] for r in counted):
            continue
        label = f"{scaling} scaling" + (f" ({variant})" if variant else "")
        epochs = {r.get("epochs") for r in counted}
        # a loader that pads each rank's share repeats fewer than a batch per rank and epoch
        padding = max(r.get("world_size") or 1 for r in counted) * max(r.get("per_device_batch") or 1 for r in counted)
        [epoch_count] = epochs if len(epochs) == 1 else [None]
        padded = epoch_count is not None and \
            max(r["samples"] for r in counted) - min(r["samples"] for r in counted) <= padding * epoch_count
        counts = ", ".join(f"{r['name']}: {r['samples']} samples" for r in counted)
        if padded:
            notes.append(f"The runs of {label} trained the same epochs but slightly different numbers of samples ({counts}): "
                         "the loader pads every rank's share to the same length, repeating a few samples (DistributedSampler, "
                         "Accelerate's even batches), more of them on more devices; throughput counts them too")
        else:
            notes.append(f"The runs of {label} trained different amounts of work ({counts}): compare their throughput, not "
                         "their times to result (the script stops after a number of steps, not epochs?)")
    return notes


def missing_baseline_note(key: str, name: str) -> str:
    """The line that says why a scaling shows no speed-up or efficiency."""
    return (f"{key.replace('/', ' ')} scaling has no speed-up or efficiency: its baseline {name} did not finish (why: the "
            f"study's output, or {name}/{LOG_FILE}); its other runs show their own throughput only. Run the same study "
            "again to retry it (finished runs are kept).")

