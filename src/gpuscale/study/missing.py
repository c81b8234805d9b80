"""Why a study cell's run left no summary that stands for the cell, in words that name the fix.

A script that measures itself (gpuscale.Meter) owes each cell its summary in the cell's folder, of the cell's scaling
and ranks (`self_measured_problem`: every cell would fail the same way, so the study stops); any other script is
measured by the probe, whose records may be missing (`missing_summary`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gpuscale.measure.probe import RECORDS as PROBE_RECORDS
from gpuscale.measure.probe import SUMMARY as SUMMARY_FILE
from gpuscale.measure.probe import probe_enabled, read_records
from gpuscale.study.matrix import Cell

__all__ = ["SELF_MEASURED", "ScriptProblem", "missing_summary", "self_measured_problem"]


@dataclass(frozen=True)
class ScriptProblem:
    """What a script that measures itself does wrong in every cell it runs, not in one run."""

    message: str
    spares: str | None = None
    """The scaling its summaries do have (it plans that one whatever it is told): its cells may still run well."""

    def stops(self, cell: Cell) -> bool:
        """Whether `cell` would fail the same way."""
        return self.spares is None or cell.scaling != self.spares


SELF_MEASURED = ("a script that measures itself must accept --scaling and --out and write the cell's summary with "
                 "gpuscale.Meter.write_summary(args.out)")


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
