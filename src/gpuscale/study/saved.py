"""What a study saved, read back: its results.json, and the prediction and target a report takes from it.

`analysis.analyse` derives the table again from the runs' summaries, but the prediction was made when the study
ran (its link measured, its overlap calibrated then) and the target is the one it was asked for: both come from
what the study saved, so that the library's `write_report(analyse(d), d)` and `gpuscale report d` write one report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

__all__ = ["SAVED", "RESULTS_FILE", "saved_results", "study_target"]

SAVED: Literal["saved"] = "saved"
"""`analyse`'s default prediction: the one the study saved in its results.json (what `gpuscale report` shows)."""
RESULTS_FILE = "results.json"


def _prediction_ok(prediction: Any) -> bool:
    """The shape of results.json's prediction that analysis reads: a list of cells with their predicted figures."""
    cells = prediction.get("cells") if isinstance(prediction, dict) else None
    return isinstance(cells, list) and all(
        isinstance(c, dict) and isinstance(c.get("name"), str)
        and all(isinstance(c.get(k), (int, float, type(None))) for k in ("samples_per_s", "efficiency", "step_time_s", "exposed_comm_s"))
        for c in cells)


def saved_results(study_dir: Path) -> dict[str, Any] | None:
    """results.json as the study (or its last report) saved it; None where there is none. ValueError naming the fix
    where it is damaged: not JSON, not an object, or a prediction of a shape the report cannot read."""
    path = Path(study_dir) / RESULTS_FILE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except ValueError:  # not JSON, or not text (UnicodeDecodeError is a ValueError)
        saved = None
    if not isinstance(saved, dict) or not (saved.get("prediction") is None or _prediction_ok(saved["prediction"])):
        raise ValueError(f"{path} is damaged; delete it and run `gpuscale report {study_dir}` again")
    return saved


def _fraction(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def study_target(study: dict[str, Any], saved: dict[str, Any] | None) -> float | None:
    """The target the study was run with: study.json's; for a study.json from before it kept one, results.json's
    (its study_target_efficiency, else an older one's target_efficiency); None where neither says."""
    said = [study.get("target_efficiency"), *((saved or {}).get(key) for key in ("study_target_efficiency", "target_efficiency"))]
    return next((value for value in map(_fraction, said) if value is not None), None)
