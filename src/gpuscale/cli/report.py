"""`gpuscale report DIR`: the scaling table, report.md, report.html and plots of a study, from its saved JSON.

The rows are derived again from each run's summary.json (and the prediction from results.json),
so a study copied off a cluster, or one whose runs were added to, reports the same way anywhere.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpuscale.base.files import atomic_write_json
from gpuscale.cli.verbs import verb_parser
from gpuscale.study import analysis
from gpuscale.study.answer import check_target
from gpuscale.study.report import format_table, write_report
from gpuscale.study.runner import read_study

EPILOG = """examples:
  gpuscale report runs/study
  gpuscale report runs/study --no-files     # print the table only
"""


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "report", __doc__, EPILOG)
    parser.add_argument("study_dir", metavar="DIR", help="the --out directory of `gpuscale study`")
    parser.add_argument("--no-files", action="store_true", help="print the table; write nothing")
    parser.add_argument("--target-efficiency", type=float, default=None, metavar="F",
                        help="recommend the largest run whose efficiency stays at or above F, for this report only "
                             "(default: the study's, else 0.75)")
    parser.set_defaults(func=run)


def _prediction_ok(prediction: Any) -> bool:
    """The shape of results.json's prediction that analysis reads: a list of cells with their predicted figures."""
    cells = prediction.get("cells") if isinstance(prediction, dict) else None
    return isinstance(cells, list) and all(
        isinstance(c, dict) and isinstance(c.get("name"), str)
        and all(isinstance(c.get(k), (int, float, type(None))) for k in ("samples_per_s", "efficiency", "step_time_s", "exposed_comm_s"))
        for c in cells)


def _study_target(study_dir: Path) -> float | None:
    """The target the study was run with, from its study.json (None where it has none: an older study)."""
    try:
        value = read_study(study_dir).get("target_efficiency")
    except (ValueError, OSError):
        return None  # no study here: analyse says so in words
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def run(args: argparse.Namespace) -> int:
    study_dir = Path(args.study_dir)
    saved = study_dir / "results.json"
    prediction, target, study_target = None, args.target_efficiency, _study_target(study_dir)
    if saved.is_file():
        try:
            previous = json.loads(saved.read_text())
            prediction = previous.get("prediction")
            for key in ("study_target_efficiency", "target_efficiency"):  # the study's own; an older results.json's last
                if study_target is None and isinstance(previous.get(key), (int, float)) and not isinstance(previous.get(key), bool):
                    study_target = float(previous[key])
            if not (prediction is None or _prediction_ok(prediction)):
                raise ValueError("damaged prediction")
        except (ValueError, AttributeError):  # not JSON, not an object, or a prediction of the wrong shape
            raise ValueError(f"{saved} is damaged; delete it and run `gpuscale report {study_dir}` again") from None
    if target is None:
        target = study_target
    results = analysis.analyse(study_dir, prediction, check_target(0.75 if target is None else target))
    if study_target is not None:
        results["study_target_efficiency"] = study_target  # a what-if target does not become the study's
    if not results["rows"]:
        raise ValueError(f"{study_dir} has no finished runs yet; run `gpuscale study --out {study_dir} -- SCRIPT` first")
    print(format_table(results))
    if not args.no_files:
        atomic_write_json(saved, results)
        paths = write_report(results, study_dir)
        print(f"\nreport: {paths['report.html']}  (and report.md, {study_dir / 'plots'})")
    return 0
