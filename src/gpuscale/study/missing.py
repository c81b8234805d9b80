"""Why a study cell's run left no summary that stands for the cell, in words that name the fix.

A script that measures itself (gpuscale.Meter) owes each cell its summary in the cell's folder, of the cell's scaling
and ranks (`self_measured_problem`: every cell would fail the same way, so the study stops, as it does for a script
that refuses the study's command line: `usage_problem`); any other script is
measured by the probe, whose records may be missing (`missing_summary`); a summary may be left unusable
(`summary_problem`, `unusable_summary`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscale.measure.probe import RECORDS as PROBE_RECORDS
from gpuscale.measure.probe import SUMMARY as SUMMARY_FILE
from gpuscale.measure.probe import probe_enabled, read_records
from gpuscale.study.matrix import Cell

__all__ = ["SELF_MEASURED", "ScriptProblem", "missing_summary", "self_measured_problem", "summary_problem", "unusable_summary",
           "usage_problem"]


@dataclass(frozen=True)
class ScriptProblem:
    """What a script that measures itself does wrong in every cell it runs, not in one run."""

    message: str
    spares: str | None = None
    """The scaling its summaries do have (it plans that one whatever it is told): its cells may still run well."""
    variant_args: tuple[str, ...] | None = None
    """Where only the command of one variant is at fault (its arguments): the cells of the others may run well."""

    def stops(self, cell: Cell) -> bool:
        """Whether `cell` would fail the same way."""
        if self.variant_args is not None and cell.variant_args != self.variant_args:
            return False
        return self.spares is None or cell.scaling != self.spares


SELF_MEASURED = ("a script that measures itself must accept --scaling and --out and write the cell's summary with "
                 "gpuscale.Meter.write_summary(args.out)")


USAGE_ERRORS = ("unrecognized arguments:", "the following arguments are required:", "ambiguous option:", "expected one argument")
"""argparse's words for a command line of the wrong shape: every cell's command has the same shape."""


def usage_problem(error: str | None, cell: Cell | None = None) -> ScriptProblem | None:
    """The script's argparse refused the cell's command line (exit code 2, its "PROG: error: ..." line) in a way that
    every cell of its variant shares (an option it does not know, one it requires): those cells would fail the same."""
    if not error or not re.search(r"\bexit code 2\b", error):
        return None
    said = next((line.strip() for line in error.splitlines()
                 if re.match(r"\s*\S+: error: ", line) and any(words in line for words in USAGE_ERRORS)), None)
    if said is None:
        return None
    variant = cell.variant_args if cell is not None and cell.variant else None
    return ScriptProblem(f"the script refused the study's command line ({said}); every cell"
                         + (f" of variant {cell.variant}" if variant is not None and cell is not None else "")
                         + " passes it the same options: fix the command after --"
                         + (" (or the variant's arguments)" if variant is not None else ""), variant_args=variant)


def self_measured_problem(cell_dir: Path, cell: Cell) -> ScriptProblem | None:
    """Why the summary of a script that measures itself (its ranks' probe records say gpuscale.Meter ran) does not
    stand for `cell`: written elsewhere than the cell's folder, or of another scaling or number of ranks. None where
    the script does not measure itself, or its summary is the cell's. Such a script fails every cell the same way."""
    if not any(r.get("meter") for r in read_records(cell_dir / PROBE_RECORDS)):
        return None
    try:
        summary = json.loads((cell_dir / SUMMARY_FILE).read_text())
    except OSError:
        return ScriptProblem(f"the script measures itself with gpuscale.Meter but wrote no {cell_dir / SUMMARY_FILE}: its "
                             "write_summary must take the cell's folder from --out (the study passes --scaling and --out "
                             "when the arguments hold no template; else write --out {out} --scaling {scaling})")
    except ValueError:
        return None  # damaged: the run's own problem, not the script's
    if summary.get("scaling") != cell.scaling:
        return ScriptProblem(f"the script's summary says {summary.get('scaling')} scaling, and this cell is {cell.scaling}: the "
                             "script must plan its batch from the --scaling the study passes "
                             "(gpuscale.plan_batch(..., scaling=args.scaling))", spares=summary.get("scaling"))
    if summary.get("world_size") != cell.world_size:
        return ScriptProblem(f"the script's summary counts {summary.get('world_size')} rank(s), and this cell has "
                             f"{cell.world_size}: the script must run on the ranks it is launched with (gpuscale.init()'s "
                             "world size)")
    return None


def missing_summary(cell_dir: Path) -> str:
    """Why a run that ended well left no summary the probe could merge: the probe off, or no records."""
    if not probe_enabled():
        return f"the run wrote no {cell_dir / SUMMARY_FILE}, and the probe that measures scripts without gpuscale.Meter is off (GPUSCALE_PROBE=0)"
    return (f"no rank left a probe record in {cell_dir / PROBE_RECORDS}: the script never imported torch, "
            "or its Python does not load the probe (a PYTHONPATH reset inside the job?); " + SELF_MEASURED)


def _number(value: Any) -> bool:
    """A JSON number (NaN and infinity too: a diverged run's loss or perplexity is still a finished run)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary_problem(summary: Any) -> str | None:
    """What makes `summary` unusable for the table and the report (a damaged or hand-edited file), or None.

    Checks the fields analysis and report compute with: the two rates must be positive numbers,
    the optional figures numbers or null, the time split and the utilisation of the right shape.
    """
    if not isinstance(summary, dict):
        return "not a JSON object"
    for key in ("samples_per_s", "train_time_s"):
        if not _number(summary.get(key)) or not 0 < summary[key] < math.inf:
            return f"{key} is {summary.get(key)!r}, not a positive number"
    for key in ("epochs", "steps", "samples", "step_time_s", "global_batch", "per_device_batch", "grad_accum_steps",
                "gradient_bytes", "accuracy", "perplexity", "final_loss", "time_to_result_s"):
        if summary.get(key) is not None and not _number(summary[key]):
            return f"{key} is {summary[key]!r}, not a number"
    for key in ("time_split_s", "step_breakdown_s"):
        split = summary.get(key)
        if split is not None and not (isinstance(split, dict) and all(v is None or _number(v) for v in split.values())):
            return f"{key} is not an object of seconds"
    per_epoch = summary.get("per_epoch")
    if per_epoch is not None and not (isinstance(per_epoch, list) and all(
            isinstance(e, dict) and all(e.get(k) is None or _number(e[k]) for k in ("val_accuracy", "val_perplexity"))
            for e in per_epoch)):
        return "per_epoch is not a list of objects with numeric val_accuracy/val_perplexity"
    lr = summary.get("lr")
    if lr is not None and not (isinstance(lr, dict) and isinstance(lr.get("rule"), str)
                               and all(lr.get(k) is None or _number(lr[k]) for k in ("factor", "base_lr", "lr"))):
        return "lr is not an object with a rule and numbers"
    utilisation = summary.get("utilisation")
    if utilisation is not None:
        devices = utilisation.get("devices") if isinstance(utilisation, dict) else None
        if not isinstance(utilisation, dict) or not isinstance(devices, (list, type(None))) or not all(
                isinstance(d, dict) and all(d.get(k) is None or _number(d[k]) for k in DEVICE_NUMBERS)
                for d in devices or []):
            return "utilisation is not an object with a list of devices"
    return None


DEVICE_NUMBERS = ("util_mean", "util_max", "mem_peak_bytes", "power_mean_w")


def unusable_summary(cell_dir: Path, cell: Cell) -> str:
    """Why the summary a run left in `cell_dir` does not stand for `cell` (`_summary_of` refused it)."""
    path = cell_dir / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"the run left {path}, which cannot be read ({type(exc).__name__}); run the cell again"
    problem = summary_problem(summary)
    if problem is not None:
        return f"the run left {path}, which is unusable: {problem}"
    if summary.get("complete") is False:
        return f"the run left {path} from a run that did not complete"
    return (f"the run left {path} of {summary.get('world_size')} rank(s) and {summary.get('scaling')} scaling, not this "
            f"cell's {cell.world_size} and {cell.scaling}")
